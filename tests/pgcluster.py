"""Start and stop a throw-away PostgreSQL cluster for the tests.

The cluster lives in a temporary directory, listens only on 127.0.0.1 on a free port (and on a
unix socket inside that directory), trusts every local connection, and runs with ``fsync=off``
(it is deleted afterwards anyway). When the tests run as root, ``initdb``/``pg_ctl``/``postgres``
run as the ``postgres`` system user through ``runuser``, since PostgreSQL refuses to run as root.

Binaries are looked up on ``PATH``, then in ``/usr/lib/postgresql/*/bin`` (newest first).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClusterUnavailable", "PgCluster", "find_bin_dir"]


class ClusterUnavailable(RuntimeError):
    """PostgreSQL cannot be started here; the message says why."""


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None``."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgCluster:
    """A running throw-away cluster; :meth:`stop` kills it and deletes its files."""

    bin_dir: Path
    root: Path
    port: int
    run_as: str | None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database, as superuser ``postgres``."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls, *, settings: dict[str, str] | None = None) -> PgCluster:
        """initdb + pg_ctl start; raise :class:`ClusterUnavailable` with the reason on failure."""
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise ClusterUnavailable(
                "PostgreSQL binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin; "
                "install postgresql or set GRAPHFLOW_TEST_POSTGRES_URL"
            )
        run_as: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ClusterUnavailable(
                    "running as root and there is no 'postgres' system user to run PostgreSQL as"
                ) from exc
            run_as = "postgres"
        root = Path(tempfile.mkdtemp(prefix="graphflow-pg-"))
        cluster = cls(bin_dir=bin_dir, root=root, port=_free_port(), run_as=run_as)
        try:
            if run_as is not None:
                entry = pwd.getpwnam(run_as)
                os.chown(root, entry.pw_uid, entry.pw_gid)
            cluster._run(
                "initdb",
                "-D",
                str(cluster.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
            options = {
                "listen_addresses": "127.0.0.1",
                "port": str(cluster.port),
                "unix_socket_directories": str(root),
                "fsync": "off",
                "full_page_writes": "off",
                "max_connections": "100",
                **(settings or {}),
            }
            opts = " ".join(f"-c {key}={value}" for key, value in options.items())
            cluster._run(
                "pg_ctl", "-D", str(cluster.data_dir), "-l", str(root / "log"), "-w", "-o", opts, "start"
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            log = root / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            cluster.stop()
            detail = getattr(exc, "stderr", "") or ""
            raise ClusterUnavailable(f"could not start PostgreSQL: {exc}\n{detail}\n{tail}") from exc
        return cluster

    def stop(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``) and delete its directory."""
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        except (OSError, subprocess.CalledProcessError):
            pass
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120, cwd=self.root)
