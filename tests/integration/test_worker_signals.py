"""SIGTERM/SIGINT stop a real ``graphflow-durable worker`` process gracefully.

A real worker subprocess on a SQLite file drives the pool team with slow agents; a real SIGTERM
arrives while agents are running. The worker stops claiming, lets in-flight turns finish within
``--grace-seconds``, halts the run (status ``interrupted``, lease released) and exits 0; a second
signal halts at once, still exit 0. A new worker then finishes the run with no committed node run
again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from graphflow_durable.store import Store

POOL = Path(__file__).parents[1] / "pool"
sys.path.insert(0, str(POOL))

from poolteam import EXPECTED_COMPLETIONS  # noqa: E402

pytestmark = pytest.mark.slow

GRACE = 1.0


def completions(store: Store, run_id: str) -> Counter[str]:
    return Counter(s.node for s in store.load(run_id).steps if s.kind == "complete" and s.node)


def start_worker(url: str, exec_log: Path, delay: float, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "GFD_AGENT_DELAY": str(delay),
        "GFD_EXEC_LOG": str(exec_log),
        "GFD_INTERRUPT_GRACE": "1",
    }
    env["PYTHONPATH"] = os.pathsep.join([str(POOL), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", url,
         "--team", "poolteam:team", "--poll-interval", "0.05", "--lease-seconds", "60", *extra],
        cwd=POOL, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert '"worker"' in proc.stdout.readline()  # up, signal handlers installed
    return proc


def wait_until(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def executions(exec_log: Path) -> list[tuple[str, str, str]]:
    if not exec_log.exists():
        return []
    return [tuple(line.split()) for line in exec_log.read_text().splitlines()]  # type: ignore[misc]


def stop_and_check(sqlite_url: str, tmp_path: Path, signals: int) -> None:
    exec_log = tmp_path / "exec.log"
    with Store(sqlite_url) as store:
        store.queue.submit("r", task="slow", team=None)
        worker = start_worker(sqlite_url, exec_log, 30.0, "--grace-seconds", str(GRACE))
        try:
            # The entry agent S is running (its turn takes 30 s): the run is running and leased.
            wait_until(lambda: (run := store.get_run("r")) is not None and run.status == "running")
            time.sleep(0.3)
            sent = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            if signals == 2:
                time.sleep(0.1)
                worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=GRACE + 10)
            took = time.monotonic() - sent
        finally:
            if worker.poll() is None:
                worker.kill()
            stderr = worker.communicate()[1]
        assert code == 0, stderr
        assert took < GRACE + 5, (took, stderr)
        run = store.get_run("r")
        assert run is not None and run.status == "interrupted", (run, stderr)
        assert run.lease_owner is None, run
        assert completions(store, "r") == Counter()  # S was cut off: nothing committed, S re-runs
        first = executions(exec_log)
        # A new worker finishes the run; nothing the first one committed runs again.
        second = start_worker(sqlite_url, exec_log, 0.01, "--until-idle")
        _, second_err = second.communicate(timeout=60)
        assert second.returncode == 0, second_err
        assert completions(store, "r") == EXPECTED_COMPLETIONS
        final = store.get_run("r")
        assert final is not None and final.status == "finished"
        runs = Counter((node, turn) for _, node, turn in executions(exec_log))
        assert first == [] and all(n == 1 for n in runs.values()), runs


def test_sigterm_stops_a_worker_within_its_grace_and_leaves_the_run_interrupted_with_its_lease_free(
    sqlite_url: str, tmp_path: Path
) -> None:
    stop_and_check(sqlite_url, tmp_path, signals=1)


def test_a_second_sigterm_halts_the_worker_at_once_and_still_exits_0_with_the_run_interrupted(
    sqlite_url: str, tmp_path: Path
) -> None:
    stop_and_check(sqlite_url, tmp_path, signals=2)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "driving"])
@pytest.mark.parametrize("offset", [0.0, 0.05, 0.2, 0.5])
def test_a_second_sigterm_at_any_moment_of_the_stop_still_exits_0(
    sqlite_url: str, tmp_path: Path, offset: float, busy: bool
) -> None:
    """The second signal may come while the worker drains, while its loop closes, or while the
    interpreter tears down after it: the process is never killed by it (exit 143)."""
    if busy:
        with Store(sqlite_url) as store:
            store.queue.submit("r", task="short turns", team=None)
    worker = start_worker(sqlite_url, tmp_path / "exec.log", 0.3, "--grace-seconds", "10")
    try:
        if busy:
            wait_until(lambda: executions(tmp_path / "exec.log") != [])  # a run is in flight
        time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        time.sleep(offset)
        with contextlib.suppress(ProcessLookupError):  # already gone: it exited on the first one
            worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
        stderr = worker.communicate()[1]
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
