"""``graphflow-durable ui`` as a real process: its first line, a page served, SIGTERM and SIGINT
exit 0; a non-loopback host without a token is refused on one line (exit 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from graphflow_durable.store import Store
from integration.test_store_admin import made

COMMAND = [sys.executable, "-m", "graphflow_durable.cli.runs", "ui"]


def start(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, "--store", url, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_console_prints_its_address_first_serves_pages_and_exits_0_on_a_signal(
    tmp_path: Path, signum: int
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with Store(url) as store:
        made(store, "r1", status="finished")
    with start(url) as process:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("graphflow-durable ui: http://127.0.0.1:") and line.endswith("/\n"), line
        address = line.split(": ", 1)[1].strip()
        assert not address.endswith(":0/")  # --port 0: the port picked is printed
        with urllib.request.urlopen(address, timeout=10) as page:
            assert page.status == 200 and b'data-run-id="r1"' in page.read()
        process.send_signal(signum)
        assert process.wait(15) == 0
        assert "Traceback" not in process.stderr.read()  # type: ignore[union-attr]


def test_the_console_asks_its_token_from_the_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Store(url).close()
    with start(url, env={"GRAPHFLOW_DURABLE_UI_TOKEN": "s3cret"}) as process:
        address = process.stdout.readline().split(": ", 1)[1].strip()  # type: ignore[union-attr]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(address + "api/runs", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        asked = urllib.request.Request(address + "api/runs", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(asked, timeout=10) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "example.org"])
def test_a_non_loopback_host_without_a_token_is_refused_on_one_line_with_exit_2(
    tmp_path: Path, host: str
) -> None:
    url = "postgresql://app:hunter2-pw@db.invalid/x"  # never opened: refused before the store
    done = subprocess.run(
        [*COMMAND, "--store", url, "--host", host],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "GRAPHFLOW_DURABLE_UI_TOKEN"},
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--token" in lines[0] and "GRAPHFLOW_DURABLE_UI_TOKEN" in lines[0]
    assert "hunter2" not in done.stderr


def test_a_port_taken_is_one_line_and_the_password_is_never_printed(tmp_path: Path) -> None:
    import socket

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Store(url).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [*COMMAND, "--store", url, "--port", port], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1 and port in done.stderr


def test_without_the_extra_the_package_imports_and_the_command_says_what_to_install(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    Store(url).close()
    script = (
        "import sys\n"
        "sys.modules['starlette'] = None  # the extra is not installed\n"
        "import graphflow_durable, graphflow_durable.ui, graphflow_durable.cli.runs as runs\n"
        f"sys.exit(runs.main(['ui', '--store', {url!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "pip install 'graphflow-durable[ui]'" in lines[0], done.stderr
