"""Recorded model and tool calls across SIGKILL, a frozen driver and a retry.

The worker (``calls_worker.py``) runs ``clerk`` (three model calls, tools ``lookup_order`` and
``issue_refund`` that append to a ledger) -> ``auditor`` (one model call) under
``DurableGraphFlow(record_calls=True)``. A process is killed inside the clerk's turn; a new process
resumes it. The model is paid, and each tool acts, as often as in an uninterrupted run (a tool
killed after its side effect, the call in flight, at most twice); the transcript, the agents' states
and the streamed chunks equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable import Store
from processes import run_script

WORKER = Path(__file__).with_name("calls_worker.py")
RUN = "calls-run"

#: The clerk's calls in order: (kind, ident), as the records name them.
CLERK_CALLS = [
    ("model", "0"),
    ("tool", "clerk-0-lookup_order"),
    ("model", "1"),
    ("tool", "clerk-1-issue_refund"),
    ("model", "2"),
]

#: Per kill point: how many of the clerk's calls were recorded before the kill, hence replayed.
RECORDED_BEFORE = {"model:2": 2, "model:3": 4, "tool:lookup_order": 1, "tool:issue_refund": 3, "commit": 5}


def run(url: str, log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, RUN, *args, exec_log=log)


def executions(log: Path) -> Counter[str]:
    """Live model calls (``model:<agent>:<position>``) and tool side effects (the tool's name)."""
    counts: Counter[str] = Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        fields = line.split()
        if fields[1] == "model":
            counts[f"model:{fields[2]}:{fields[3]}"] += 1
        elif fields[1] in ("lookup_order", "issue_refund"):
            counts[fields[1]] += 1
    return counts


def output(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[-1]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, dict[str, Any]]:
    """The uninterrupted runs (streamed and not): output and executions."""
    refs: dict[bool, dict[str, Any]] = {}
    for stream in (False, True):
        tmp = tmp_path_factory.mktemp("reference")
        log = tmp / "exec.log"
        out = output(run(f"sqlite:///{tmp / 'ref.db'}", log, *(["--stream"] if stream else [])))
        refs[stream] = {**out, "executions": executions(log)}
    assert refs[False]["executions"] == Counter(
        {"model:clerk:0": 1, "model:clerk:1": 1, "model:clerk:2": 1, "model:auditor:0": 1}
        | {"lookup_order": 1, "issue_refund": 1}
    )
    return refs


def clerk_records(url: str) -> list[Any]:
    with Store(url) as store:
        return [r for r in store.calls.list(RUN) if r.node == "clerk"]


def crash_and_resume(url: str, tmp: Path, kill: str, reference: dict[str, Any], *flags: str) -> None:
    log = tmp / "exec.log"
    killed = run(url, log, "--kill", kill, *flags)
    assert killed.returncode == -signal.SIGKILL, f"{kill}: {killed.returncode}\n{killed.stderr}"
    out = output(run(url, log, *flags))

    assert out["transcript"] == reference["transcript"], f"{kill}: transcript differs"
    assert out["states"] == reference["states"], f"{kill}: agent states differ"
    done = executions(log)
    expected = Counter(reference["executions"])
    if kill.startswith("tool:"):  # the tool in flight acted, died, and runs again on resume
        tool = kill.partition(":")[2]
        assert done[tool] <= 2, f"{kill}: {tool} acted {done[tool]} times"
        expected[tool] = done[tool]
    assert done == expected, f"{kill}: live calls or tool runs differ from an uninterrupted run's"
    if "--stream" in flags:  # the replayed calls re-yielded their chunks, with the same boundaries
        assert out["chunks"] == reference["chunks"], f"{kill}: streamed chunks differ"

    # The calls recorded before the kill were replayed by the second attempt, the rest made live.
    recorded = RECORDED_BEFORE[kill]
    first = [(r.kind, r.ident, r.outcome) for r in clerk_records(url) if r.attempt == 1]
    assert first == [(k, i, "live") for k, i in CLERK_CALLS[:recorded]], f"{kill}: {first}"
    second = [(r.kind, r.ident, r.outcome) for r in clerk_records(url) if r.attempt == 2]
    assert second == [(k, i, "replayed") for k, i in CLERK_CALLS[:recorded]] + [
        (k, i, "live") for k, i in CLERK_CALLS[recorded:]
    ], f"{kill}: {second}"


@pytest.mark.crash
@pytest.mark.parametrize(
    "kill",
    [
        "model:2",  # (a) between two model calls: after the first call and its tool are recorded
        "tool:issue_refund",  # (b) inside a tool, after its side effect
        "commit",  # (c) after the last model call, before the turn's completion is committed
        pytest.param("model:3", marks=pytest.mark.slow),
        pytest.param("tool:lookup_order", marks=pytest.mark.slow),
    ],
)
def test_a_turn_killed_mid_way_pays_each_model_call_and_runs_each_tool_as_an_uninterrupted_run_does(
    store_url: str, tmp_path: Path, reference: dict[bool, dict[str, Any]], kill: str
) -> None:
    crash_and_resume(store_url, tmp_path, kill, reference[False])


@pytest.mark.crash
@pytest.mark.parametrize("kill", ["model:3", "commit"])
def test_a_streamed_turn_resumed_after_sigkill_streams_the_same_chunks_as_an_uninterrupted_run(
    store_url: str, tmp_path: Path, reference: dict[bool, dict[str, Any]], kill: str
) -> None:
    crash_and_resume(store_url, tmp_path, kill, reference[True], "--stream")


@pytest.mark.crash
def test_a_driver_frozen_past_its_lease_writes_no_call_record_when_it_wakes(
    store_url: str, tmp_path: Path, reference: dict[bool, dict[str, Any]]
) -> None:
    """SIGSTOP while ``issue_refund`` runs (lease 1 s); a new process takes the run over and
    finishes it; SIGCONT: the woken driver's tool returns, and its record is refused."""
    log = tmp_path / "exec.log"
    frozen = subprocess.Popen(
        [sys.executable, str(WORKER), store_url, RUN, "--lease", "1", "--hold-tool", "issue_refund:2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GFD_EXEC_LOG": str(log)},
    )
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "start issue_refund" in log.read_text()):
            assert frozen.poll() is None and time.monotonic() < deadline, "issue_refund never started"
            time.sleep(0.02)
        frozen.send_signal(signal.SIGSTOP)
        time.sleep(2.0)  # past its lease (1 s)
        successor = output(run(store_url, log))
        assert successor["transcript"] == reference[False]["transcript"]
        before = clerk_records(store_url)
        frozen.send_signal(signal.SIGCONT)
        _, errors = frozen.communicate(timeout=60)  # it ends (an agent waiting forever would not)
    finally:
        if frozen.poll() is None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
            frozen.communicate()
    assert frozen.returncode != 0 and "LeaseLostError" in errors, errors
    after = clerk_records(store_url)
    assert after == before, "the frozen driver wrote a call record after it lost the run"
    woke = [line for line in log.read_text().splitlines() if line.startswith(f"{frozen.pid} issue_refund")]
    assert woke, "the frozen driver's tool never returned: no record write was attempted"
    assert executions(log)["issue_refund"] == 2  # the call in flight, and the successor's


@pytest.mark.crash
def test_two_calls_sharing_the_empty_id_each_act_once_across_a_sigkill_mid_turn(
    store_url: str, tmp_path: Path
) -> None:
    """The clerk asks for two refunds in one answer, both calls with the id ``""``; the process is
    SIGKILLed before the clerk's next model call (both refunds made and recorded); a new process
    resumes the turn: each refund is replayed from its own record, none acts again."""
    ref_log = tmp_path / "ref.log"
    ref = output(run(f"sqlite:///{tmp_path / 'ref.db'}", ref_log, "--shared-id"))
    refunds = sorted(
        line.split(maxsplit=1)[1] for line in ref_log.read_text().splitlines() if "issue_refund" in line
    )
    assert refunds == ["issue_refund A17 40.0", "issue_refund B42 15.0"]

    log = tmp_path / "exec.log"
    killed = run(store_url, log, "--shared-id", "--kill", "model:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = output(run(store_url, log, "--shared-id"))
    assert out["transcript"] == ref["transcript"], "each call got back its own result"
    assert out["states"] == ref["states"]
    done = sorted(
        line.split(maxsplit=1)[1] for line in log.read_text().splitlines() if "issue_refund" in line
    )
    assert done == refunds, "each distinct refund acted exactly once"
    assert executions(log) == executions(ref_log)
    second = [(r.kind, r.ident, r.outcome) for r in clerk_records(store_url) if r.attempt == 2]
    assert second == [
        ("model", "0", "replayed"),
        ("tool", "", "replayed"),
        ("tool", "", "replayed"),
        ("model", "1", "live"),
    ]


def test_a_retried_attempt_replays_the_calls_before_the_failed_one_and_makes_only_that_one_again(
    store_url: str, tmp_path: Path, reference: dict[bool, dict[str, Any]]
) -> None:
    """The clerk's third model call fails with a retryable ConnectionError; the retry policy runs a
    second attempt of the turn, which replays calls 1-2 (and both tools) and makes call 3."""
    log = tmp_path / "exec.log"
    out = output(run(store_url, log, "--retry", "3", "--fail-model", "3"))
    assert out["transcript"] == reference[False]["transcript"]
    assert out["states"] == reference[False]["states"]
    assert executions(log) == reference[False]["executions"]  # the failed call raised before answering
    records = clerk_records(store_url)
    assert [(r.attempt, r.kind, r.ident, r.outcome) for r in records] == [
        (1, k, i, "live") for k, i in CLERK_CALLS[:4]
    ] + [(2, k, i, "replayed") for k, i in CLERK_CALLS[:4]] + [(2, "model", "2", "live")]
