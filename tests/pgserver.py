"""A throw-away PostgreSQL cluster that a test may stop and start again (an outage).

Used by the outage tests (tests/integration/test_lease_outage.py, test_worker_outage.py) through
a module-scoped fixture::

    @pytest.fixture(scope="module")
    def server() -> Iterator[Server]:
        yield from Server.serve()
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pgcluster import ClusterUnavailable, PgCluster

__all__ = ["Server"]


class Server:
    """A throw-away PostgreSQL cluster the test may stop and start again."""

    def __init__(self, cluster: PgCluster) -> None:
        self.cluster = cluster

    @classmethod
    def serve(cls) -> Iterator[Server]:
        """Start a cluster (skip the test when PostgreSQL is not available), yield it, delete it."""
        try:
            cluster = PgCluster.start()
        except ClusterUnavailable as exc:
            pytest.skip(f"PostgreSQL not available: {exc}")
        try:
            yield cls(cluster)
        finally:
            cluster.stop()

    @property
    def url(self) -> str:
        return self.cluster.url

    def database(self) -> Iterator[str]:
        """Create a new database in the cluster, yield its URL, drop it (for a function fixture)."""
        name = f"gfd_outage_{time.monotonic_ns()}"
        admin = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            yield sa.make_url(self.url).set(database=name).render_as_string(hide_password=False)
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            admin.dispose()

    def down(self) -> None:
        """Stop the server at once (``-m immediate``: connections are cut, as in a crash)."""
        self.cluster._run("pg_ctl", "-D", str(self.cluster.data_dir), "-m", "immediate", "-w", "stop")

    def up(self) -> None:
        """Start it again on the same port and socket directory."""
        c = self.cluster
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={c.port} -c unix_socket_directories={c.root} "
            "-c fsync=off -c full_page_writes=off"
        )
        c._run("pg_ctl", "-D", str(c.data_dir), "-l", str(c.root / "log"), "-w", "-o", opts, "start")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: each backend is told to terminate (its clients see
        ``AdminShutdown``), then the server starts again with the same options and log file."""
        c = self.cluster
        c._run("pg_ctl", "-D", str(c.data_dir), "-l", str(c.root / "log"), "-m", "fast", "-w", "restart")
