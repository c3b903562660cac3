"""Exact resume by a new team object, and the execution context."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage

from agents import (
    Boom,
    CommitSpy,
    Hook,
    Scripted,
    Ticker,
    chain,
    close_stores,
    durable,
    fail_on_turn,
    fail_once,
    fan,
    loop_agents,
    loop_graph,
    stored_transcript,
    text,
    wait_for,
)
from graphflow_durable import DurableGraphFlow
from graphflow_durable.context import ExecutionContext, current_execution


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _reference(names: str, graph_of, url: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    agents = [Scripted(n) for n in names]
    result = await durable(agents, graph_of(*agents), url, "reference").run(task="go")
    return text(result.messages)


async def test_agent_exception_fails_the_run_and_leaves_the_node_in_flight(store_url: str) -> None:
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=fail_once() if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run")
    with pytest.raises(RuntimeError, match="B crashed on purpose"):
        await team.run(task="go")
    assert calls == ["A", "B"]
    assert team.run_info().status == "failed"
    assert team.store.load("run").scheduler["s"]["in_flight"] == ["B"]


async def test_new_team_resumes_completed_nodes_never_run_again_failed_node_gets_same_input(
    store_url: str,
) -> None:
    reference = await _reference("ABC", chain, store_url)
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=fail_once() if n == "B" else None) for n in "ABC"]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), store_url, "run").run(task="go")

    again: list[str] = []
    fresh = [Scripted(n, calls=again) for n in "ABC"]
    team = durable(fresh, chain(*fresh), store_url, "run")
    result = await team.run()
    assert again == ["B", "C"], "A completed before the failure and must not run again"
    # B's content digests its input and carries its restored turn number: same as uninterrupted;
    # the resumed round's result is the whole round, as the uninterrupted run returned it
    assert text(result.messages) == reference
    assert stored_transcript(team) == reference
    assert team.run_info().status == "finished"


async def test_same_team_object_resumes_after_an_agent_exception(store_url: str) -> None:
    reference = await _reference("ABC", chain, store_url)
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=fail_once() if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run")
    with pytest.raises(RuntimeError):
        await team.run(task="go")
    # B's failed turn moved its in-memory turn counter; resuming restores the committed state
    await team.run()
    assert calls == ["A", "B", "B", "C"]
    assert stored_transcript(team) == reference


async def test_parallel_sibling_that_finished_is_kept_only_the_failed_one_reruns(store_url: str) -> None:
    reference = await _reference("ABCD", fan, store_url)
    calls: list[str] = []
    holder: list[CommitSpy] = []

    async def after_b_committed(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        await wait_for(lambda: holder[0].completed("B"))

    agents = [
        Scripted(n, calls=calls, before=fail_once(after_b_committed) if n == "C" else None) for n in "ABCD"
    ]
    first = durable(agents, fan(*agents), store_url, "run")
    holder.append(CommitSpy(first))
    with pytest.raises(RuntimeError, match="C crashed"):
        await first.run(task="go")
    assert sorted(calls) == ["A", "B", "C"]

    again: list[str] = []
    fresh = [Scripted(n, calls=again) for n in "ABCD"]
    team = durable(fresh, fan(*fresh), store_url, "run")
    await team.run()
    assert again == ["C", "D"]
    assert stored_transcript(team) == reference


@pytest.mark.parametrize("fail", [("J", 2), ("R", 2), ("R", 3), ("P2", 1)])
async def test_loop_resume_keeps_activation_bookkeeping(store_url: str, fail: tuple[str, int]) -> None:
    reference_calls: list[str] = []
    ref_agents = loop_agents(reference_calls)
    ref_team = durable(ref_agents, loop_graph(ref_agents), store_url, "reference", MaxMessageTermination(60))
    reference = text((await ref_team.run(task="go")).messages)

    node, turn = fail
    calls: list[str] = []
    agents = loop_agents(calls, {node: fail_on_turn(turn)})
    with pytest.raises(RuntimeError, match="crashed on purpose"):
        await durable(agents, loop_graph(agents), store_url, "run", MaxMessageTermination(60)).run(task="go")
    done_before = len(calls) - 1

    again: list[str] = []
    fresh = loop_agents(again)
    team = durable(fresh, loop_graph(fresh), store_url, "run", MaxMessageTermination(60))
    await team.run()
    assert stored_transcript(team) == reference
    assert calls[:done_before] + again == reference_calls, "each activation ran exactly once"
    assert again[0] == node, "the failed node runs again first"


async def test_execution_context_gives_run_node_step_attempt(store_url: str) -> None:
    seen: dict[str, ExecutionContext | None] = {}

    async def record(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        seen[agent.name] = current_execution()

    agents = [Scripted(n, before=record) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "ctx")
    spy = CommitSpy(team)
    await team.run(task="go")
    assert current_execution() is None
    dispatched_by = {
        c["data"]["dispatched"][0]: c["head"] for c in spy.commits if c["data"].get("dispatched")
    }
    for name in "ABC":
        ctx = seen[name]
        assert ctx is not None
        assert (ctx.run_id, ctx.node, ctx.step, ctx.attempt) == ("ctx", name, dispatched_by[name], 1)
        assert ctx.idempotency_key == f"ctx/{name}/{dispatched_by[name]}"
    assert len({ctx.idempotency_key for ctx in seen.values() if ctx}) == 3


async def test_retried_turn_after_failure_has_attempt_2_and_the_same_idempotency_key(store_url: str) -> None:
    seen: list[ExecutionContext | None] = []

    async def record(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        seen.append(current_execution())

    agents = [Scripted(n, before=fail_once(record) if n == "B" else None) for n in "ABC"]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), store_url, "ctx").run(task="go")

    fresh = [Scripted(n, before=record if n == "B" else None) for n in "ABC"]
    await durable(fresh, chain(*fresh), store_url, "ctx").run()
    first, retry = seen
    assert first is not None and retry is not None
    assert (first.attempt, retry.attempt) == (1, 2)
    assert first.idempotency_key == retry.idempotency_key
    assert (retry.run_id, retry.node, retry.step) == ("ctx", "B", first.step)


def test_boom_is_what_agents_raise() -> None:
    assert issubclass(Boom, RuntimeError)


def _looping_fan(agents: dict[str, Scripted]):  # type: ignore[no-untyped-def]
    """S -> (B, C) -> J; J -> S while J says "again", J -> E when it says "done"."""
    from autogen_agentchat.teams import DiGraphBuilder

    s, b, c, j, e = (agents[n] for n in "SBCJE")
    g = DiGraphBuilder()
    for agent in (s, b, c, j, e):
        g.add_node(agent)
    g.add_edge(s, b).add_edge(s, c).add_edge(b, j).add_edge(c, j)
    g.add_edge(j, s, condition="again").add_edge(j, e, condition="done")
    g.set_entry_point(s)
    return g.build()


async def test_two_interruptions_in_a_row_keep_what_a_sibling_heard_during_a_retried_turn(
    store_url: str,
) -> None:
    """B fails while its sibling C has already answered; the resumed B runs again; the run then
    fails later, after the loop came back round. The second resume rebuilds B's buffer from the
    log: C's first answer (published during B's first turn) must still be in B's next input."""
    says = {"J": ["again", "done"]}
    teams: dict[str, DurableGraphFlow] = {}

    def team(run_id: str, hooks: dict[str, Hook]) -> DurableGraphFlow:
        agents = {n: Scripted(n, says.get(n, ()), before=hooks.get(n)) for n in "SBCJE"}
        teams[run_id] = durable(agents, _looping_fan(agents), store_url, run_id, MaxMessageTermination(50))
        return teams[run_id]

    def after_c(run_id: str) -> Hook:
        """B's first turn ends only once C's first answer is committed (in both runs alike)."""

        async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
            if agent.turn == 1:
                await wait_for(
                    lambda: any(
                        s.node == "C" for s in teams[run_id].store.load(run_id).steps if s.kind == "complete"
                    )
                )

        return hook

    reference = await team("reference", {"B": after_c("reference")}).run(task="go")
    with pytest.raises(RuntimeError, match="B crashed"):
        await team("run", {"B": fail_once(after_c("run"))}).run(task="go")
    with pytest.raises(RuntimeError, match="S crashed"):
        await team("run", {"S": fail_on_turn(2)}).run(task="go")
    third = team("run", {})
    await third.run(task="go")
    assert stored_transcript(third) == text(reference.messages)


async def test_the_event_loop_runs_while_a_new_team_object_reads_the_run_it_resumes(sqlite_url: str) -> None:
    """A new team object resumes by reading the run's log; the read runs in a thread (here the
    database is made slow: the read waits 0.3 s), so the process's other runs go on meanwhile."""
    agents = [Scripted(n) for n in "ABC"]
    first = durable(agents, chain(*agents), sqlite_url, "r", max_turns=1)
    await first.run(task="go")  # stopped after A: the next run() resumes it

    fresh = [Scripted(n) for n in "ABC"]
    team = durable(fresh, chain(*fresh), sqlite_url, "r")
    store = team.store
    load = store.load
    ticker, window = Ticker(), []

    def slow_load(run_id: str) -> Any:
        ticker.ticks = 0
        time.sleep(0.3)  # on the event loop this would freeze it: no tick
        window.append(ticker.ticks)
        return load(run_id)

    store.load = slow_load  # type: ignore[method-assign]
    async with ticker:
        result = await team.run()
    assert [m.source for m in result.messages] == ["B", "C"]
    assert window and all(w >= 5 for w in window)  # every read of the log left the loop free
