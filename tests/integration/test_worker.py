"""The Worker in-process and the graphflow-durable CLI: submissions run, interrupted runs resume,
failures back off, a stop drains or halts, the CLI lists/submits with documented exit codes."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
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

sys.path.insert(0, str(Path(__file__).parents[1]))
from agents import wait_for
from graphflow_durable._storage.driver import CreateRequest


def completions(store: Store, run_id: str) -> Counter[str]:
    return Counter(s.node for s in store.load(run_id).steps if s.kind == "complete" and s.node)


async def test_a_worker_runs_every_submission_of_its_teams_to_the_end(store: Store) -> None:
    for i in range(3):
        store.queue.submit(f"r{i}", task=f"task {i}", team="t")
    store.queue.submit("other", task="x", team="not-mine")
    worker = Worker(store, {"t": team}, concurrency=2, poll_interval=0.01)
    await worker.run_until_idle()
    assert sorted((o.run_id, o.outcome) for o in worker.outcomes) == [(f"r{i}", "finished") for i in range(3)]
    for i in range(3):
        assert completions(store, f"r{i}") == EXPECTED_COMPLETIONS
    assert store.get_run("other") is None


async def test_a_worker_resumes_an_interrupted_run_on_start_up(store: Store) -> None:
    store.queue.submit("r", task="resume me", team="t")
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

    store.queue.submit("r", task="t", team="t")
    worker = Worker(store, {"t": broken}, poll_interval=0.01, backoff_seconds=0.3)
    runner = asyncio.ensure_future(worker.run_forever())
    await asyncio.sleep(0.5)
    worker.request_stop()
    await runner
    assert 1 <= len(calls) <= 2  # not a hot loop: the second attempt waits 0.3 s
    sub = store.queue.get_submission("r")
    assert sub is not None and sub.attempts == len(calls) and "no model configured" in (sub.last_error or "")
    assert worker.outcomes[0].outcome == "failed"


async def test_a_stopped_worker_halts_in_flight_runs_after_the_grace_period_and_another_finishes_them(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFD_AGENT_DELAY", "0.2")
    store.queue.submit("r", task="slow", team="t")
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
    store.queue.submit("r", task="t", team="t")
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
    assert (
        capsys.readouterr().out
        == "run r1: submitted; a worker started with --team t=module:factory claims it\n"
    )
    assert main(["submit", "--store", store_url, "r1", "hello", "--team", "t", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {
        "run_id": "r1",
        "team": "t",
        "status": "pending",
        "queue": "default",
        "priority": 0,
        "partition": None,
        "not_before": None,
    }
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
        store.queue.submit("r1", task="hello", team="t")
    assert main(["worker", "--store", sqlite_url, "--team", "t=poolteam:team", "--until-idle"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out.splitlines()[0])["teams"] == ["t"]
    with Store(sqlite_url) as store:
        run = store.get_run("r1")
        assert run is not None and run.status == "finished"
    assert main(["worker", "--store", sqlite_url, "--team", "nomodule:x"]) == 1
    assert "cannot import 'nomodule'" in capsys.readouterr().err


# --- each kind of error, treated as it should be -----------------------------------------------------


async def interrupted_run(store: Store, run_id: str) -> None:
    """Start ``run_id`` with the pool team and stop it after the first answer (left interrupted)."""
    stream = team(run_id, store=store).run_stream(task="t")
    async for item in stream:
        if getattr(item, "source", None) == "S":
            break
    await stream.aclose()


async def test_a_run_with_a_changed_graph_fails_once_and_waits_the_longest_back_off(store: Store) -> None:
    """A caller's mistake (GraphMismatchError) fails the same way every time: no hot retry loop."""
    store._driver.create_run(
        CreateRequest(
            "r",
            graph_fingerprint="another graph",
            graph={"nodes": {"X": {}}},
            owner="gone",
            lease_seconds=0.01,
        )
    )
    await asyncio.sleep(0.05)  # the lease of its driver, gone, ran out
    calls: list[str] = []

    def factory(run_id: str, **durable: Any) -> DurableGraphFlow:
        calls.append(run_id)
        return team(run_id, **durable)

    worker = Worker(store, team=factory, poll_interval=0.01, backoff_seconds=0.01, max_backoff_seconds=60)
    runner = asyncio.ensure_future(worker.run_forever())
    await asyncio.sleep(0.5)
    worker.request_stop()
    await runner
    assert calls == ["r"]
    assert [o.outcome for o in worker.outcomes] == ["failed"]
    assert "GraphMismatchError" in (worker.outcomes[0].error or "")
    sub = store.queue.get_submission("r")
    assert sub is not None and sub.attempts == 1 and "different graph" in (sub.last_error or "")
    assert sub.not_before is not None and sub.not_before > time.time() + 50


async def test_a_factory_that_builds_another_run_waits_the_longest_back_off(store: Store) -> None:
    store.queue.submit("r", task="t", team="t")
    worker = Worker(
        store, {"t": lambda run_id, **kw: team("other", **kw)}, poll_interval=0.01, max_backoff_seconds=60
    )
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["failed"]
    assert "UsageError" in (worker.outcomes[0].error or "")
    sub = store.queue.get_submission("r")
    assert sub is not None and sub.attempts == 1 and sub.not_before is not None
    assert sub.not_before > time.time() + 50
    assert store.get_run("other") is None


async def test_a_run_locked_by_another_worker_is_lost_with_nothing_recorded_and_no_attempt_counted(
    store: Store,
) -> None:
    await interrupted_run(store, "r")

    def intruded(run_id: str, **durable: Any) -> DurableGraphFlow:
        built = team(run_id, **durable)
        run = built.run

        async def late(*args: Any, **kwargs: Any) -> Any:
            # After the worker found its claim fresh, before the team takes the lease over: another
            # live worker takes the run.
            time.sleep(0.6)  # the claim's 0.5 s lease expires
            store._driver.acquire_lease(run_id, "intruder", lease_seconds=60)
            return await run(*args, **kwargs)

        built.run = late  # type: ignore[method-assign]
        return built

    before = store.get_run("r")
    worker = Worker(store, team=intruded, poll_interval=0.01, lease_seconds=0.5)
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["lost"]
    assert "being driven by intruder" in (worker.outcomes[0].error or "")
    after = store.get_run("r")
    assert before is not None and after is not None
    assert after.head_seq == before.head_seq and after.lease_owner == "intruder"
    assert store.queue.get_submission("r") is None  # no failure recorded


async def test_an_agent_that_raises_fails_the_run_with_a_counted_attempt_and_is_left_alone(
    store: Store,
) -> None:
    store.queue.submit("r", task="t", team="t")

    def failing(run_id: str, **durable: Any) -> DurableGraphFlow:
        built = team(run_id, **durable)
        agent = next(p for p in built._participants if p.name == "P2")

        async def boom(*args: Any) -> None:
            raise RuntimeError("the model is down")

        agent.before = boom  # type: ignore[attr-defined]
        return built

    worker = Worker(store, {"t": failing}, poll_interval=0.01, backoff_seconds=30)
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["failed"]
    assert "left alone until 'graphflow-durable runs retry r'" in (worker.outcomes[0].error or "")
    sub = store.queue.get_submission("r")
    assert sub is not None and sub.attempts == 1 and "the model is down" in (sub.last_error or "")
    assert store.queue.claim("other", lease_seconds=5) is None  # a failed run: not claimed on its own
    store.retry_run("r")
    assert store.queue.claim("other", lease_seconds=5) is not None


async def test_a_database_outage_defers_the_run_without_counting_an_attempt_and_the_worker_survives_it(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: another connection holds the write lock longer than the store's busy timeout."""
    monkeypatch.setenv("GFD_AGENT_DELAY", "0")
    store = Store(f"{sqlite_url}?timeout=0.1")
    store.queue.submit("r", task="t", team="t")
    blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)

    def factory(run_id: str, **durable: Any) -> DurableGraphFlow:
        if not worker.outcomes:  # the first time only: the database "goes down"
            blocker.execute("BEGIN IMMEDIATE")
        return team(run_id, **durable)

    worker = Worker(
        store,
        {"t": factory},
        poll_interval=0.01,
        lease_seconds=0.5,
        backoff_seconds=0.1,
        max_backoff_seconds=0.2,
    )
    caplog.set_level(logging.ERROR, logger="graphflow_durable.worker")
    runner = asyncio.ensure_future(worker.run_forever())
    try:
        await wait_for(lambda: bool(worker.outcomes))
        assert [o.outcome for o in worker.outcomes] == ["deferred"]
        await asyncio.sleep(0.3)  # claims fail meanwhile: the worker logs them and keeps going
        assert any(
            "database problem while claiming work" in r.getMessage() and r.name == "graphflow_durable.worker"
            for r in caplog.records
        )
        blocker.execute("ROLLBACK")  # the database is back
        await wait_for(lambda: len(worker.outcomes) == 2, timeout=10)
    finally:
        worker.request_stop()
        await runner
        blocker.close()
    assert [o.outcome for o in worker.outcomes] == ["deferred", "finished"]
    assert "database problem" in (worker.outcomes[0].error or "")
    sub = store.queue.get_submission("r")
    assert sub is not None and sub.attempts == 0 and sub.last_error is None
    assert completions(store, "r") == EXPECTED_COMPLETIONS
    store.close()


# --- the CLI's one error path ----------------------------------------------------------------------


def test_the_cli_exits_quietly_when_its_reader_closes_stdout(sqlite_url: str) -> None:
    with Store(f"{sqlite_url}?synchronous=OFF") as store:
        for i in range(2000):  # more than a pipe buffer of output
            store.queue.submit(f"run-{i:05d}", task="t", team="t")
    command = f"{sys.executable} -m graphflow_durable.cli.runs runs list --store {sqlite_url} | head -1"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("RUN") and done.stdout.count("\n") == 1
    assert done.stderr == ""


def test_the_cli_reports_bad_options_and_a_module_that_fails_to_import_in_one_line(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["worker", "--store", sqlite_url, "--team", "poolteam:team", "--concurrency", "0"]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "graphflow-durable: concurrency must be at least 1, not 0\n"
    (tmp_path / "broken_teams.py").write_text("raise RuntimeError('no API key')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["worker", "--store", sqlite_url, "--team", "broken_teams:make"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "importing 'broken_teams' raised RuntimeError: no API key" in err
    assert main(["worker", "--store", sqlite_url, "--team", "poolteam"]) == EXIT_USAGE
    assert "expected MODULE:ATTRIBUTE" in capsys.readouterr().err
    assert main(["worker", "--store", sqlite_url, "--team", "poolteam:EXPECTED_COMPLETIONS"]) == 1
    assert "is not callable" in capsys.readouterr().err
