"""Durable human-in-the-loop across real processes: a run parks waiting for a person, its process
exits, a second process answers (the command line), a third finishes the run; a SIGKILL between
the recorded answer and the turn's commit asks nobody again and re-runs only the waiting turn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable import Store
from processes import last_json as result
from processes import run_script

WORKER = Path(__file__).with_name("human_worker.py")

pytestmark = [pytest.mark.crash]


def run(
    url: str, log: Path, mode: str, kill: str | None = None, run_id: str = "run"
) -> subprocess.CompletedProcess[str]:
    return run_script(
        WORKER, url, run_id, mode, *([kill] if kill else []), exec_log=log, GFD_ANSWER="ship it"
    )


def turns(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


def status(url: str) -> str:
    with Store(url) as store:
        run = store.get_run("run")
        assert run is not None
        return run.status


def respond_cli(url: str, answer: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "graphflow_durable.cli.runs", "--store", url, "runs", "respond"]
    return subprocess.run(
        [*command, "run", answer, *extra], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def reference(tmp_path: Path) -> dict[str, Any]:
    """The uninterrupted run on plain GraphFlow, the person typing the answer at once."""
    return result(run("unused", tmp_path / "ref.log", "plain"))


def test_a_parked_run_is_answered_from_the_command_line_and_finished_by_a_third_process(
    store_url: str, tmp_path: Path, reference: dict[str, Any]
) -> None:
    url, log = store_url, tmp_path / "run.log"
    parked = result(run(url, log, "start"))
    assert parked["stop_reason"] == "waiting for input: H asks 'Enter your response: ' (request H/3)"
    assert status(url) == "waiting"
    assert turns(log) == ["A", "B"]  # the other branch ran while H waited; C (the join) did not

    listed = subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "--store", url, "runs", "list", "--status", "waiting"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "waits for H/3: H asks 'Enter your response: '" in listed.stdout

    answered = respond_cli(url, "ship it", "--json")
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["run_status"] == "interrupted"
    again = respond_cli(url, "no, wait")  # answered already: a clear error, nothing changed
    assert again.returncode == 3 and "not waiting" in again.stderr and "Traceback" not in again.stderr

    finished = result(run(url, log, "resume"))
    assert finished == reference  # the whole transcript, as if the person had typed at once
    assert turns(log) == ["A", "B", "C"]  # nothing completed ran again; the input function never asked
    assert status(url) == "finished"


def test_a_crash_between_the_recorded_answer_and_the_turns_commit_asks_nobody_again(
    store_url: str, tmp_path: Path, reference: dict[str, Any]
) -> None:
    url, log = store_url, tmp_path / "run.log"
    result(run(url, log, "start"))
    with Store(url) as store:
        store.respond("run", "ship it")
    killed = run(url, log, "resume", kill="H")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert status(url) == "running"  # a dead driver's lease: the next run takes it over

    finished = result(run(url, log, "resume"))
    assert finished == reference
    assert turns(log) == ["A", "B", "C"]
    with Store(url) as store:
        request = store.requests.get("run", "H/3")
    assert request is not None and (request.status, request.answer, request.answered_by) == (
        "answered",
        "ship it",
        "respond",
    )


def test_inline_input_answered_before_a_crash_is_not_asked_again_on_resume(
    store_url: str, tmp_path: Path, reference: dict[str, Any]
) -> None:
    url, log = store_url, tmp_path / "run.log"
    killed = run(url, log, "inline", kill="H")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert turns(log).count("ASK") == 1

    finished = result(run(url, log, "inline"))  # the same script again: resumes
    assert finished == reference
    assert turns(log).count("ASK") == 1  # the person answered once, before the crash
    assert [t for t in turns(log) if t != "ASK"] == ["A", "B", "C"]


def test_a_worker_pool_finishes_a_run_answered_from_the_command_line_with_no_one_calling_run(
    store_url: str, tmp_path: Path, reference: dict[str, Any]
) -> None:
    url, log = store_url, tmp_path / "pool.log"
    with Store(url) as store:
        store.queue.submit("run", task="go", team="human")
    env = {**os.environ, "GFD_EXEC_LOG": str(log), "GFD_ANSWER": "ship it", "PYTHONPATH": str(WORKER.parent)}
    command = [sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", url]
    worker = subprocess.Popen(
        [*command, "--team", "human=human_worker:pool", "--poll-interval", "0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(url, "waiting")
        assert turns(log) == ["A", "B"]
        time.sleep(0.5)  # a waiting run is not claimed again: nothing re-runs while it waits
        assert turns(log) == ["A", "B"] and status(url) == "waiting"
        answered = respond_cli(url, "ship it")
        assert answered.returncode == 0, answered.stderr
        wait_for(url, "finished")
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    assert turns(log) == ["A", "B", "C"]
    with Store(url) as store:
        thread = [[m.body["source"], m.body["content"]] for m in store.load("run").messages]
    assert thread == reference["messages"]


def wait_for(url: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with Store(url) as store:
            run = store.get_run("run")
        if run is not None and run.status == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"the run did not become {wanted} within {timeout} s")
