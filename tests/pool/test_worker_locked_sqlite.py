"""A worker process whose claim waits on a locked SQLite file (another connection holds its write
lock; the claim would wait up to the busy timeout) still handles SIGTERM at once: its store calls
are made off its event loop, and a call still waiting does not hold up its exit."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphflow_durable.store import Store

HERE = Path(__file__).parent

pytestmark = [pytest.mark.slow, pytest.mark.crash]

BUSY_TIMEOUT = 30.0


def test_a_worker_waiting_on_a_locked_sqlite_file_exits_promptly_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}?timeout={BUSY_TIMEOUT:g}"
    with Store(url) as store:
        store.queue.submit("r", task="t", team="t")  # something to claim: the claim writes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    args = [
        sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", url,
        "--team", "t=queueteam:team", "--poll-interval", "0.05", "--lease-seconds", "60",
    ]  # fmt: skip
    blocker = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT)
    blocker.execute("BEGIN IMMEDIATE")  # before the worker starts: its first claim waits on it
    err = (tmp_path / "worker.err").open("wb")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline(), "the worker did not start"  # its SIGTERM handler is installed
        time.sleep(1.0)  # its claim waits on the lock now
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=BUSY_TIMEOUT + 30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        blocker.execute("ROLLBACK")
        blocker.close()
        err.close()
        if proc.stdout is not None:
            proc.stdout.close()
    log = (tmp_path / "worker.err").read_text(errors="replace")
    assert code == 0, log
    assert took < BUSY_TIMEOUT / 3, f"{took:.1f} s after SIGTERM\n{log}"
