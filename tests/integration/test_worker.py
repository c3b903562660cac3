"""The Worker in-process and the graphflow-durable CLI: submissions run, interrupted runs resume,
failures back off, a stop drains or halts, the CLI lists/submits with documented exit codes."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.cli.runs import EXIT_CONFLICT, EXIT_OK, EXIT_USAGE, main
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))

from poolteam import EXPECTED_COMPLETIONS, team


def completions(store: Store, run_id: str) -> Counter[str]:
    return Counter(s.node for s in store.load(run_id).steps if s.kind == "complete" and s.node)


async def test_a_worker_runs_every_submission_of_its_teams_to_the_end(store: Store) -> None:
    for i in range(3):
        store.submit(f"r{i}", task=f"task {i}", team="t")
    store.submit("other", task="x", team="not-mine")
    worker = Worker(store, {"t": team}, concurrency=2, poll_interval=0.01)
    await worker.run_until_idle()
    assert sorted((o.run_id, o.outcome) for o in worker.outcomes) == [(f"r{i}", "finished") for i in range(3)]
    for i in range(3):
        assert completions(store, f"r{i}") == EXPECTED_COMPLETIONS
    assert store.get_run("other") is None


async def test_a_worker_resumes_an_interrupted_run_on_start_up(store: Store) -> None:
    store.submit("r", task="resume me", team="t")
    first = team("r", store=store)
    gate = asyncio.Event()
    stream = first.run_stream(task="resume me")
    async for item in stream:  # stop after the first agent answered
        if getattr(item, "source", None) == "S":
            gate.set()
            break
    await stream.aclose()
    run = store.get_run("r")
    assert run is not None and run.status == "interrupted"
    worker = Worker(store, team=team, poll_interval=0.01)
    await worker.run_until_idle()
    assert [(o.run_id, o.outcome, o.claim.kind) for o in worker.outcomes] == [("r", "finished", "run")]
    assert completions(store, "r") == EXPECTED_COMPLETIONS


async def test_a_failing_team_is_marked_failed_and_retried_only_after_a_back_off(store: Store) -> None:
    calls: list[float] = []

    def broken(run_id: str, **durable: Any) -> DurableGraphFlow:
        calls.append(time.monotonic())
        raise RuntimeError("no model configured")

    store.submit("r", task="t", team="t")
    worker = Worker(store, {"t": broken}, poll_interval=0.01, backoff_seconds=0.3)
    runner = asyncio.ensure_future(worker.run_forever())
    await asyncio.sleep(0.5)
    worker.request_stop()
    await runner
    assert 1 <= len(calls) <= 2  # not a hot loop: the second attempt waits 0.3 s
    sub = store.get_submission("r")
    assert sub is not None and sub.attempts == len(calls) and "no model configured" in (sub.last_error or "")
    assert worker.outcomes[0].outcome == "failed"


async def test_a_stopped_worker_halts_in_flight_runs_after_the_grace_period_and_another_finishes_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFD_AGENT_DELAY", "0.2")
    store.submit("r", task="slow", team="t")
    worker = Worker(store, {"t": team}, poll_interval=0.01, grace_seconds=0.1)
    runner = asyncio.ensure_future(worker.run_forever())
    await asyncio.sleep(0.5)
    worker.request_stop()
    await runner
    assert [o.outcome for o in worker.outcomes] == ["halted"]
    run = store.get_run("r")
    assert run is not None and run.status == "interrupted" and run.lease_owner is None
    monkeypatch.setenv("GFD_AGENT_DELAY", "0")
    other = Worker(store, {"t": team}, poll_interval=0.01)
    await other.run_until_idle()
    assert [o.outcome for o in other.outcomes] == ["finished"]
    assert completions(store, "r") == EXPECTED_COMPLETIONS


async def test_a_factory_that_ignores_run_id_fails_with_a_message_that_says_what_to_do(store: Store) -> None:
    store.submit("r", task="t", team="t")
    worker = Worker(store, {"t": lambda run_id, **kw: team("other", **kw)}, poll_interval=0.01)
    await worker.run_until_idle()
    assert worker.outcomes[0].outcome == "failed"
    assert "pass run_id=run_id" in (worker.outcomes[0].error or "")


def test_worker_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="either factories"):
        Worker("sqlite://")
    with pytest.raises(ValueError, match="concurrency"):
        Worker("sqlite://", team=team, concurrency=0)


def test_the_cli_submits_lists_and_refuses_a_conflicting_submission(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", "--store", store_url, "r1", "hello", "--team", "t"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"run_id": "r1", "team": "t", "status": "pending"}
    assert main(["submit", "--store", store_url, "r1", "hello", "--team", "t"]) == EXIT_OK
    capsys.readouterr()
    assert main(["submit", "--store", store_url, "r1", "other", "--team", "t"]) == EXIT_CONFLICT
    assert "already submitted" in capsys.readouterr().err
    assert main(["runs", "list", "--store", store_url, "--json"]) == EXIT_OK
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["run_id"], r["status"], r["team"]) for r in rows] == [("r1", "submitted", "t")]
    assert main(["runs", "list", "--store", store_url, "--status", "finished"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[1:] == []
    assert main(["runs", "list", "--status", "nonsense"]) == EXIT_USAGE


def test_the_cli_worker_drives_submissions_until_idle(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFD_AGENT_DELAY", "0")
    with Store(sqlite_url) as store:
        store.submit("r1", task="hello", team="t")
    assert main(["worker", "--store", sqlite_url, "--team", "t=poolteam:team", "--until-idle"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out.splitlines()[0])["teams"] == ["t"]
    with Store(sqlite_url) as store:
        run = store.get_run("r1")
        assert run is not None and run.status == "finished"
    assert main(["worker", "--store", sqlite_url, "--team", "nomodule:x"]) == 1
    assert "cannot import 'nomodule'" in capsys.readouterr().err
