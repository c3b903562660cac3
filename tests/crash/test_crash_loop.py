"""Crash loops: a node whose turn kills its process (SIGKILL, as the kernel's OOM killer does) is
dispatched at most ``max_crash_attempts`` times by re-running the script; the run then ends
``failed`` and stays so until ``runs retry`` gives the node a fresh budget. An orderly interrupt
(Ctrl+C, a cancel) is not a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import crash_loop_worker
import pytest

from graphflow_durable.cli.runs import main
from graphflow_durable.store import Store
from processes import run_script

WORKER = Path(__file__).with_name("crash_loop_worker.py")
RUN = "poison-run"

pytestmark = [pytest.mark.crash]


def drive(url: str, exec_log: Path, mode: str, most: int = 3) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, RUN, str(most), mode, exec_log=exec_log)


def k_turns(exec_log: Path) -> int:
    return len(exec_log.read_text().splitlines()) if exec_log.exists() else 0


def last_line(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def test_a_node_that_kills_its_process_runs_max_crash_attempts_times_then_the_run_fails(
    store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "exec.log"
    for n in range(1, 4):
        proc = drive(store_url, log, "kill")
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert k_turns(log) == n
    for _ in range(2):  # the 4th run and any after it: refused at once, K never dispatched again
        proc = drive(store_url, log, "kill")
        assert proc.returncode == 3, proc.stderr
        out = last_line(proc)
        assert out["error"] == "NodeFailedError" and out["node"] == "K" and out["attempts"] == 3
        assert "the process died 3 times during node K's turn" in str(out["message"])
        assert f"graphflow-durable runs retry {RUN}" in str(out["message"])
        assert k_turns(log) == 3
    with Store(store_url) as store:
        run = store.get_run(RUN)
        assert run is not None and run.status == "failed"
        assert run.result["node_failed"] == {
            "node": "K",
            "attempts": 3,
            "error_type": "ProcessDied",
            "error": "the process died 3 times during node K's turn",
            "cause": "crash",
        }
        assert "the process died 3 times" in run.result["stop_reason"]


def show(url: str, capsys: pytest.CaptureFixture[str], *json_flag: str) -> str:
    capsys.readouterr()
    assert main(["runs", "show", RUN, *json_flag, "--store", url]) == 0
    return capsys.readouterr().out


def test_runs_show_counts_the_in_flight_turns_crashes_and_names_the_failed_node(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "exec.log"
    for _ in range(2):
        drive(store_url, log, "kill")
    shown = json.loads(show(store_url, capsys, "--json"))
    assert shown["in_flight"] == {"K": {"attempts": 2, "failures": 0, "crashes": 1}}
    assert shown["node_failed"] is None
    assert "K: attempt 2, 0 failed, 1 died with the process" in show(store_url, capsys)
    drive(store_url, log, "kill")
    drive(store_url, log, "kill")
    shown = json.loads(show(store_url, capsys, "--json"))
    assert shown["status"] == "failed"
    assert shown["in_flight"] == {"K": {"attempts": 3, "failures": 0, "crashes": 3}}
    assert shown["node_failed"]["node"] == "K" and shown["node_failed"]["cause"] == "crash"
    text = show(store_url, capsys)
    assert "node K after 3 attempts (crash): ProcessDied: the process died 3 times" in text
    assert "last error  ProcessDied: the process died 3 times" in text
    capsys.readouterr()
    assert main(["runs", "list", "--status", "failed", "--store", store_url]) == 0
    assert RUN in capsys.readouterr().out
    flow = crash_loop_worker.team(store_url, RUN, 3, "kill")
    try:
        info = flow.run_info()
        assert info is not None and info.turns == {"K": {"attempts": 3, "failures": 0, "crashes": 3}}
        assert info.result["node_failed"]["attempts"] == 3
    finally:
        flow.store.close()


def test_runs_retry_after_a_crash_loop_gives_the_node_a_fresh_budget(store_url: str, tmp_path: Path) -> None:
    log = tmp_path / "exec.log"
    for _ in range(2):
        drive(store_url, log, "kill", most=2)
    assert drive(store_url, log, "kill", most=2).returncode == 3
    with Store(store_url) as store:
        store.retry_run(RUN)
        assert store.get_run(RUN).status == "interrupted"  # type: ignore[union-attr]
    # A fresh budget: K runs twice more before the run fails again.
    for n in (3, 4):
        assert drive(store_url, log, "kill", most=2).returncode == -signal.SIGKILL
        assert k_turns(log) == n
    assert drive(store_url, log, "kill", most=2).returncode == 3
    with Store(store_url) as store:
        store.retry_run(RUN)
    proc = drive(store_url, log, "ok", most=2)
    assert proc.returncode == 0, proc.stderr
    assert last_line(proc) == {"status": "finished"}
    assert k_turns(log) == 5


def interrupted(url: str, exec_log: Path, how: str) -> None:
    """Start the slow script, wait for K's turn, and interrupt it: Ctrl+C, or SIGKILL followed by a
    cancel (recorded before the next driver resumes the run: an orderly end, as Ctrl+C is)."""
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), url, RUN, "1", "slow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GFD_EXEC_LOG": str(exec_log)},
    )
    turns = k_turns(exec_log)
    deadline = time.monotonic() + 60
    while k_turns(exec_log) == turns and time.monotonic() < deadline:
        time.sleep(0.05)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        with Store(url) as store:
            assert store.cancel_run(RUN).outcome == "cancelled"
    proc.communicate(timeout=60)


@pytest.mark.parametrize("how", ["ctrl-c", "cancel"])
def test_an_interrupted_or_cancelled_turn_is_not_counted_as_a_crash(
    store_url: str, tmp_path: Path, how: str
) -> None:
    log = tmp_path / "exec.log"
    for _ in range(2):  # max_crash_attempts=1: one counted crash would fail the run at once
        interrupted(store_url, log, how)
        with Store(store_url) as store:
            run = store.get_run(RUN)
            assert run is not None and run.status in ("interrupted", "cancelled")
            assert "crashes" not in store.load(RUN).scheduler  # type: ignore[operator]
    assert k_turns(log) == 2
    proc = drive(store_url, log, "ok", most=1)
    assert proc.returncode == 0, proc.stderr
    assert last_line(proc) == {"status": "finished"}
    assert k_turns(log) == 3
