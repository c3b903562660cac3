"""Rounds across real process deaths: a round stopped by the termination condition is continued
by ``run()`` with no task in a new process, and a round killed mid-way (SIGKILL) and re-run by
the same script returns the result the uninterrupted round returns."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable import Store
from processes import last_json as result
from processes import run_script

WORKER = Path(__file__).with_name("rounds_worker.py")

pytestmark = [pytest.mark.crash]


def run(
    url: str, log: Path, mode: str, kill: str | None = None, run_id: str = "run"
) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, run_id, mode, *([kill] if kill else []), exec_log=log)


def turns(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines()]


def status(url: str) -> str:
    with Store(url) as store:
        run = store.get_run("run")
        assert run is not None
        return run.status


@pytest.fixture
def reference(store_url: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two rounds uninterrupted (run id ``ref``): started (stopped by the condition), then continued."""
    log = tmp_path / "ref.log"
    first = result(run(store_url, log, "start", run_id="ref"))
    second = result(run(store_url, log, "continue", run_id="ref"))
    assert [s for s, _ in first["messages"]] == ["user", "A", "B"]
    assert [s for s, _ in second["messages"]] == ["C", "D", "E"]
    assert second["stop_reason"] == "Digraph execution is complete"
    return first, second


def test_a_stopped_round_continued_in_a_new_process_and_killed_mid_way_returns_the_whole_round(
    store_url: str, tmp_path: Path, reference: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    url, log = store_url, tmp_path / "run.log"
    assert result(run(url, log, "start")) == reference[0]
    assert status(url) == "stopped"

    killed = run(url, log, "continue", kill="D")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert status(url) == "running"  # the lease of a dead process; the next run takes it over

    resumed = result(run(url, log, "continue"))
    # the continued round's result is the whole round, as the uninterrupted run returned it
    assert resumed == reference[1]
    assert turns(log) == ["A", "B", "C", "D", "D", "E"]  # C committed before the kill: never again
    assert status(url) == "finished"
    # a finished run: run() with no task returns the stored result and runs nothing
    assert result(run(url, log, "continue")) == reference[1]
    assert turns(log) == ["A", "B", "C", "D", "D", "E"]


def test_a_first_round_killed_mid_way_and_rerun_by_the_same_script_returns_the_uninterrupted_result(
    store_url: str, tmp_path: Path, reference: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    url, log = store_url, tmp_path / "run.log"
    killed = run(url, log, "start", kill="B")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    assert result(run(url, log, "start")) == reference[0]  # same task: resumed, not added again
    assert turns(log) == ["A", "B", "B"]
    assert status(url) == "stopped"
    # re-running the finished script once more returns the stored result, running nothing
    assert result(run(url, log, "start")) == reference[0]
    assert turns(log) == ["A", "B", "B"]
