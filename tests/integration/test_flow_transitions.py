"""One commit per agent completion; late and duplicate answers are ignored.

Also the run lease: a second team driving the same run while the first is running is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from autogen_agentchat.base import Response
from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams._group_chat._events import GroupChatAgentResponse
from autogen_core import CancellationToken, MessageContext

from agents import (
    CommitSpy,
    Gate,
    Scripted,
    capture_manager,
    chain,
    close_stores,
    durable,
    fan,
    stored_transcript,
)
from graphflow_durable.errors import RunLockedError


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _ctx() -> MessageContext:
    return MessageContext(
        sender=None, topic_id=None, is_rpc=False, cancellation_token=CancellationToken(), message_id="late"
    )


def _answer(name: str) -> GroupChatAgentResponse:
    return GroupChatAgentResponse(
        response=Response(chat_message=TextMessage(content=f"{name} again", source=name)), name=name
    )


async def test_one_commit_per_completion_sequential_graph(store_url: str) -> None:
    agents = [Scripted(n) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "seq")
    spy = CommitSpy(team)
    await team.run(task="go")

    kinds = [(c["kind"], c["node"]) for c in spy.commits]
    # one start (task + first selection), one per completion; the last also ends the run and
    # gives its lease up
    assert kinds == [("start", None), ("complete", "A"), ("complete", "B"), ("complete", "C")]
    steps = team.store.load("seq").steps
    # the snapshot of the starting states was written with the run's row, in its transaction
    assert [(s.kind, s.node) for s in steps] == [("created", None), *kinds]
    for commit in spy.commits[1:]:
        node = commit["node"]
        assert commit["sources"] == [node], "the completion's step holds its messages"
        assert commit["states"] == {node: {"turn": 1}}, "...and the agent's state after its turn"
        assert node not in commit["scheduler"]["s"]["in_flight"], "...and the scheduler state after it"
    # the next selection is committed with the completion that caused it (no extra commit)
    assert spy.commits[1]["scheduler"]["s"]["in_flight"] == ["B"]
    assert spy.commits[1]["data"]["dispatched"] == ["B"]
    run = team.run_info()
    assert run is not None and run.status == "finished" and run.lease_owner is None


async def test_one_commit_per_completion_fan_out_graph(store_url: str) -> None:
    agents = [Scripted(n) for n in "ABCD"]
    team = durable(agents, fan(*agents), store_url, "fan")
    spy = CommitSpy(team)
    result = await team.run(task="go")

    completes = [c for c in spy.commits if c["kind"] == "complete"]
    assert sorted(c["node"] for c in completes) == ["A", "B", "C", "D"]
    assert len(spy.commits) == 1 + 4  # the start and the completions
    first_sibling, second_sibling = completes[1], completes[2]
    # the first sibling's answer is committed on its own, while the other is still in flight
    assert len(first_sibling["scheduler"]["s"]["in_flight"]) == 1
    assert first_sibling["states"] == {first_sibling["node"]: {"turn": 1}}
    # the last sibling's commit also moves D from ready to in flight
    assert second_sibling["scheduler"]["s"]["in_flight"] == ["D"]
    assert second_sibling["data"]["dispatched"] == ["D"]
    assert [(m.source, m.to_text()) for m in result.messages] == stored_transcript(team)


async def test_late_or_duplicate_response_for_a_node_not_in_flight_is_ignored(store_url: str) -> None:
    gate = Gate()
    agents = [Scripted("A"), Scripted("B", before=gate), Scripted("C")]
    team = durable(agents, chain(*agents), store_url, "late")
    managers = capture_manager(team)
    running = asyncio.create_task(team.run(task="go"))
    await gate.reached(running)
    (manager,) = managers

    head = team.store.get_run("late").head_seq
    await manager.handle_agent_response(_answer("A"), _ctx())  # A already completed: late
    await manager.handle_agent_response(_answer("C"), _ctx())  # C never dispatched yet
    assert team.store.get_run("late").head_seq == head
    assert [s for s, _ in stored_transcript(team)] == ["user", "A"]

    gate.open()
    await running
    steps = len(team.store.load("late").steps)
    await manager.handle_agent_response(_answer("B"), _ctx())  # a duplicate after the run ended
    assert len(team.store.load("late").steps) == steps
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B", "C"]


async def test_second_driver_of_a_running_run_gets_run_locked_error_naming_the_owner(store_url: str) -> None:
    gate = Gate()
    agents = [Scripted("A"), Scripted("B", before=gate), Scripted("C")]
    first = durable(agents, chain(*agents), store_url, "locked")
    running = asyncio.create_task(first.run(task="go"))
    await gate.reached(running)

    others = [Scripted(n) for n in "ABC"]
    second = durable(others, chain(*others), store_url, "locked")
    with pytest.raises(RunLockedError) as raised:
        await second.run()
    assert first._session.owner in str(raised.value)
    assert isinstance(raised.value, RuntimeError)

    gate.open()
    result = await running
    assert result.stop_reason == "Digraph execution is complete"
    assert [a.calls for a in others] == [[], [], []]


async def test_the_session_keeps_its_write_path_for_its_run_and_makes_a_new_one_for_another(
    store_url: str,
) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), store_url, "bound")
    session = team._session
    commits, lease = session.commits, session.lease
    assert session.commits is commits and session.lease is lease, "the same run: the same objects"
    assert commits is session._bound()[1] and lease.seconds == session.lease_seconds
    for field, value in (("run_id", "bound-2"), ("owner", "someone-else"), ("lease_seconds", 99.0)):
        setattr(session, field, value)
        assert session.commits is not commits, f"a new {field}: a new write path"
        assert session.lease is not lease and session.lease is session._bound()[0]
        commits, lease = session.commits, session.lease
    assert commits._key.run_id == "bound-2" and session.control.run_id == "bound-2"
    assert (commits._key.owner, commits._key.lease_seconds) == ("someone-else", 99.0)
    await team.run(task="go")  # the run it drives is the one it was bound to last
    assert team.store.load("bound-2").steps[-1].kind == "complete"
