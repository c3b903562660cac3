"""One trace per run across processes: a run SIGKILLed during an agent turn and resumed in a new
process is one trace, the resume's workflow span linked to the killed process's."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from processes import run_script

WORKER = Path(__file__).with_name("traced_worker.py")
RUN = "traced-run"

pytestmark = [pytest.mark.crash]


def _spans(log: Path, phase: str = "start") -> list[dict[str, Any]]:
    """The spans logged as they started (their attributes then), or as they ended (all of them)."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in rows if r["phase"] == phase]


@pytest.mark.parametrize("kill", ["agent:3", "create:after"])
def test_a_run_killed_and_resumed_in_another_process_is_one_trace_with_a_link(
    tmp_path: Path, kill: str
) -> None:
    """Killed during its third agent turn, or right after the commit that created the run (its
    trace context is written in that transaction)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    log = tmp_path / "spans.jsonl"
    env = {"GFD_SPAN_LOG": str(log)}
    killed = run_script(WORKER, url, RUN, kill, exec_log=tmp_path / "exec.log", **env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    first = [s for s in _spans(log) if s["name"].startswith("invoke_workflow ")]
    assert len(first) == 1
    resumed = run_script(WORKER, url, RUN, exec_log=tmp_path / "exec.log", **env)
    assert resumed.returncode == 0, resumed.stderr

    workflow = [s for s in _spans(log) if s["name"].startswith("invoke_workflow ")]
    assert len(workflow) == 2
    one, two = workflow
    assert two["pid"] != one["pid"]
    assert two["trace_id"] == one["trace_id"]
    assert two["parent"] == one["span_id"]  # the first attach had no caller span: its own is the run's
    assert two["links"] == [one["span_id"]]
    assert one["attributes"]["graphflow_durable.resumed"] is False
    assert two["attributes"]["graphflow_durable.resumed"] is True
    assert isinstance(two["attributes"]["graphflow_durable.resumed_from_step"], int)
    # AutoGen's invoke_agent spans of both processes are in the run's trace, tagged with the turn
    # (the one the kill interrupted never ended).
    agents = [s for s in _spans(log, "end") if s["name"].startswith("invoke_agent ")]
    assert {s["pid"] for s in agents} == ({one["pid"], two["pid"]} if kill == "agent:3" else {two["pid"]})
    assert {s["trace_id"] for s in agents} == {one["trace_id"]}
    assert all(s["attributes"]["gen_ai.conversation.id"] == RUN for s in agents)
    retried = [s["attributes"] for s in agents if s["attributes"]["graphflow_durable.attempt"] == 2]
    assert retried or kill != "agent:3", "the turn the kill interrupted runs again as attempt 2"
    (totals,) = [r["totals"] for r in _spans(log, "metrics")]  # the resumed process's
    assert totals["graphflow_durable.lease.takeovers"] == 1
    assert totals["graphflow_durable.runs"] == 1
    assert totals["graphflow_durable.transitions"] >= 1
