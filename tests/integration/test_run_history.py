"""History, time travel, fork, export/import: the Python API on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import TextMessage

from agents import Gate, close_stores, durable, loop_agents, loop_graph, stored_transcript
from graphflow_durable import DurableGraphFlow, StepInfo
from graphflow_durable.errors import ConflictError, RunLockedError, RunNotFoundError, UsageError
from graphflow_durable.store import Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _loop_team(url: str | Store, run_id: str) -> DurableGraphFlow:
    agents = loop_agents([])
    return durable(agents, loop_graph(agents), url, run_id, MaxMessageTermination(60))


async def _recorded(url: str) -> DurableGraphFlow:
    """A finished run of the fan-out + join + loop graph (S -> P1,P2 -> J -> R -> J ... -> E)."""
    team = _loop_team(url, "source")
    await team.run(task="go")
    return team


def _rows(url: str, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every stored row of a run, every column as stored."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    found = {}
    try:
        with engine.connect() as conn:
            for table, key in (
                ("graphflow_runs", "run_id"),
                ("graphflow_steps", "seq"),
                ("graphflow_messages", "seq"),
                ("graphflow_agent_states", "step_seq, node"),
            ):
                found[table] = [
                    tuple(r)
                    for r in conn.execute(
                        sa.text(f"SELECT * FROM {table} WHERE run_id = :r ORDER BY {key}"), {"r": run_id}
                    )
                ]
    finally:
        engine.dispose()
    return found


async def test_history_lists_every_step_with_round_node_attempt_time_and_messages(store_url: str) -> None:
    team = await _recorded(store_url)
    steps = team.history()
    run = team.run_info()
    assert [s.seq for s in steps] == list(range(1, run.head_seq + 1))
    assert steps[0].kind == "created" and steps[0].round == 0 and steps[0].message_seqs == ()
    assert steps[1].kind == "start" and steps[1].round == 1 and steps[1].dispatched == ("S",)
    completes = [s for s in steps if s.kind == "complete"]
    nodes = [s.node for s in completes]
    assert nodes[0] == "S" and sorted(nodes[1:3]) == ["P1", "P2"]  # the fan-out's siblings, either order
    assert nodes[3:] == ["J", "R", "J", "R", "J", "R", "E"]  # the join, the loop twice, the exit
    assert all(s.attempt == 1 and len(s.message_seqs) == 1 for s in completes)
    # every message of the thread is listed once, by the step that added it, with its AutoGen id
    log = team.store.load("source")
    listed = [seq for s in steps for seq in s.message_seqs]
    assert listed == [m.seq for m in log.messages]
    assert [i for s in steps for i in s.message_ids] == [m.body["id"] for m in log.messages]
    assert all(a.time <= b.time for a, b in itertools.pairwise(steps))
    assert [s.seq for s in team.history(node="R")] == [s.seq for s in completes if s.node == "R"]
    assert team.history(round=2) == []
    assert isinstance(steps[0], StepInfo) and steps[1].as_dict()["dispatched"] == ["S"]


async def test_history_counts_the_attempts_of_a_node_that_ran_again_after_an_interrupt(
    store_url: str,
) -> None:
    gate = Gate()
    agents = loop_agents([], {"J": gate})
    team = durable(
        agents,
        loop_graph(agents),
        store_url,
        "source",
        MaxMessageTermination(60),
        interrupt_grace_seconds=0.1,
    )
    task = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = _loop_team(store_url, "source")
    await again.run()
    j = again.history(node="J")
    assert [s.attempt for s in j] == [2, 1, 1], "J's first turn was dispatched twice"
    resume = [s for s in again.history() if s.kind == "resume"]
    assert len(resume) == 1 and resume[0].dispatched == ("J",)


async def test_transcript_gives_autogen_messages_filtered_by_round_and_node(store_url: str) -> None:
    team = await _recorded(store_url)
    whole = team.transcript()
    assert all(isinstance(m, TextMessage) for m in whole)
    assert [(m.source, m.content) for m in whole] == stored_transcript(team)
    assert [m.source for m in team.transcript(node="R")] == ["R", "R", "R"]
    assert team.transcript(node="nobody") == []
    await team.run(task="second round")
    assert next(m.content for m in team.transcript(round=2)) == "second round"
    assert len(team.transcript(round=1)) == len(whole)
    stored = team.store.transcript("source", round=1, node="E")
    assert [m.body["source"] for m in stored] == ["E"]


async def test_save_state_at_a_past_step_is_the_cut_a_fresh_team_resumes_to_the_same_transcript(
    store_url: str,
) -> None:
    team = await _recorded(store_url)
    reference = stored_transcript(team)
    middle = next(s.seq for s in team.history() if s.kind == "complete" and s.node == "J")
    state = await team.save_state(at=middle)
    manager = next(v for k, v in state["agent_states"].items() if "graphflow_durable" in v)
    assert [m["source"] for m in manager["message_thread"]] == ["user", "S", "P1", "P2", "J"] or [
        m["source"] for m in manager["message_thread"]
    ] == ["user", "S", "P2", "P1", "J"]
    assert manager["graphflow_durable"]["status"] == "interrupted"
    fresh = _loop_team(store_url, "restored")
    await fresh.load_state(state)
    await fresh.run()
    assert stored_transcript(fresh) == reference
    assert await team.save_state(at=team.run_info().head_seq) == await team.save_state()


async def test_fork_at_every_step_resumes_to_the_source_transcript_and_leaves_the_source_unchanged(
    store_url: str,
) -> None:
    source = await _recorded(store_url)
    reference = stored_transcript(source)
    head = source.run_info().head_seq
    before = _rows(store_url, "source")
    store = source.store
    for at in range(1, head + 1):
        forked = store.fork("source", at, new_run_id=f"fork-{at}")
        assert forked.parent_run_id == "source" and forked.head_seq == at and forked.lease_owner is None
        assert [(s.kind, s.node) for s in store.history(f"fork-{at}")] == [
            (s.kind, s.node) for s in store.history("source")[:at]
        ]
        team = _loop_team(store_url, f"fork-{at}")
        await team.run(task="go")  # the same task: resumed (or, before the first round, started)
        assert stored_transcript(team) == reference, f"fork at step {at}"
        assert team.run_info().status == "finished"
    assert _rows(store_url, "source") == before


async def test_fork_status_and_task_follow_the_step(store_url: str) -> None:
    team = await _recorded(store_url)
    store = team.store
    head = team.run_info().head_seq
    assert store.fork("source", 1).status == "finished"  # created: nothing started yet
    mid = store.fork("source", 3, new_run_id="mid")
    assert mid.status == "interrupted" and mid.task == store.get_run("source").task
    assert mid.run_id == "mid" and mid.message_count == len(store.cut("source", 3).messages)
    end = store.fork("source", head)
    assert end.status == "finished" and end.run_id.startswith("source-fork-")
    assert end.result == team.run_info().result
    via_team = team.fork(4, run_id="via-team")
    assert (via_team.run_id, via_team.head_seq, via_team.parent_run_id) == ("via-team", 4, "source")


async def test_fork_and_cut_refuse_unknown_runs_and_steps_out_of_range(store_url: str) -> None:
    team = await _recorded(store_url)
    store = team.store
    head = team.run_info().head_seq
    for call in (store.history, store.transcript, store.export_run):
        with pytest.raises(RunNotFoundError, match="run nope does not exist"):
            call("nope")
    with pytest.raises(RunNotFoundError):
        store.fork("nope", 1)
    with pytest.raises(RunNotFoundError):
        store.cut("nope", 1)
    for bad in (0, head + 1, -1):
        with pytest.raises(
            UsageError, match=rf"run source has steps 1 to {head}; step {bad} is out of range"
        ):
            store.fork("source", bad)
        with pytest.raises(UsageError, match="out of range"):
            await team.save_state(at=bad)
    for bad in ("3", True, 1.5):
        with pytest.raises(UsageError, match="step must be a whole number"):
            store.cut("source", bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="run_id"):
        store.fork("source", 2, new_run_id=" ")
    store.fork("source", 2, new_run_id="taken")
    with pytest.raises(ConflictError, match="run taken already exists"):
        store.fork("source", 3, new_run_id="taken")
    assert store.get_run("taken").head_seq == 2, "the refused fork wrote nothing"
    assert [r.run_id for r in store.list_runs()] == ["source", "taken"]


async def test_fork_of_a_running_run_at_its_head_is_refused_and_earlier_steps_are_allowed(
    store_url: str,
) -> None:
    gate = Gate()
    agents = loop_agents([], {"J": gate})
    team = durable(agents, loop_graph(agents), store_url, "live", MaxMessageTermination(60))
    task = asyncio.ensure_future(team.run(task="go"))
    try:
        await gate.reached(task)
        run = team.run_info()
        assert run.status == "running"
        with pytest.raises(RunLockedError, match=f"step {run.head_seq} is its head"):
            team.store.fork("live", run.head_seq)
        earlier = team.store.fork("live", run.head_seq - 1, new_run_id="earlier")
        assert earlier.status == "interrupted"
    finally:
        gate.open()
        await task
    fork = _loop_team(store_url, "earlier")
    await fork.run()
    assert stored_transcript(fork) == stored_transcript(team)


@pytest.mark.postgres
@pytest.mark.parametrize("source, target", [("sqlite", "postgres"), ("postgres", "sqlite")])
async def test_export_then_import_into_the_other_backend_resumes_and_finishes_there(
    source: str, target: str, request: pytest.FixtureRequest
) -> None:
    urls = {
        "sqlite": request.getfixturevalue("sqlite_url"),
        "postgres": request.getfixturevalue("postgres_database"),
    }
    reference_team = _loop_team(urls[source], "reference")
    await reference_team.run(task="go")
    reference = stored_transcript(reference_team)
    gate = Gate(turn=2)
    agents = loop_agents([], {"R": gate})
    team = durable(
        agents,
        loop_graph(agents),
        urls[source],
        "moving",
        MaxMessageTermination(60),
        interrupt_grace_seconds=0.1,
    )
    task = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert team.run_info().status == "interrupted"
    document = json.loads(json.dumps(team.store.export_run("moving")))  # through a file's text
    with Store(urls[target]) as other:
        imported = other.import_run(document)
        assert imported.status == "interrupted" and imported.head_seq == team.run_info().head_seq
        assert other.export_run("moving") == document, "the import stores exactly what was exported"
        with pytest.raises(ConflictError, match="run moving already exists"):
            other.import_run(document)
        there = _loop_team(other, "moving")
        await there.run()
        assert stored_transcript(there) == reference
        assert there.run_info().status == "finished"
        back = other.export_run("moving")
    # and back, under another id: the finished run, as it ended over there
    returned = team.store.import_run(back, run_id="returned")
    assert returned.status == "finished" and returned.head_seq == there.run_info().head_seq
    assert [m.body for m in team.store.transcript("returned")] == [m["body"] for m in back["messages"]]


async def test_import_refuses_a_document_that_is_not_a_run_export_and_writes_nothing(store_url: str) -> None:
    team = await _recorded(store_url)
    store = team.store
    document = store.export_run("source")
    with pytest.raises(UsageError, match="not a graphflow-durable run export"):
        store.import_run({"run": {}})
    broken = {**document, "steps": document["steps"][1:]}
    with pytest.raises(UsageError, match=r"steps\[0\]\.seq: is 2; the steps must be numbered 1, 2, 3"):
        store.import_run(broken, run_id="broken")
    missing = {**document, "messages": [{"seq": 0}]}
    with pytest.raises(
        UsageError, match=r"the document: messages\[0\]\.step_seq: is missing; nothing was imported"
    ):
        store.import_run(missing, run_id="missing")
    assert [r.run_id for r in team.store.list_runs()] == ["source"]


async def test_fork_inside_a_later_round_keeps_that_rounds_task_so_rerunning_it_resumes(
    store_url: str,
) -> None:
    team = await _recorded(store_url)
    await team.run(task="second")
    reference = stored_transcript(team)
    second = [s for s in team.history(round=2) if s.kind == "complete"]
    at = second[len(second) // 2].seq
    fork = team.store.fork("source", at, new_run_id="round-2")
    assert fork.status == "interrupted" and fork.task == [
        {"content": "second", "metadata": {}, "models_usage": None, "source": "user", "type": "TextMessage"}
    ]
    again = _loop_team(store_url, "round-2")
    await again.run(task="second")  # the round's own task: resumed, not added again
    assert stored_transcript(again) == reference
    assert [s.round for s in again.history()][-1] == 2
