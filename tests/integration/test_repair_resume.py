"""A repaired legacy state resumes in a fresh DurableGraphFlow and runs exactly what was left.

For every fixture of tests/fixtures/legacy (written by the real plain GraphFlow), a fresh
``DurableGraphFlow`` with the same agents loads the legacy state -- ``load_state()`` repairs it --
and ``run()`` with no task continues it. The speakers it runs must be exactly the ones an
uninterrupted plain run speaks after the saved thread; a finished run runs nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.integrity import repair_state, validate_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_legacy as ml

OPEN: list[DurableGraphFlow] = []


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().store.close()


def durable_team(name: str, url: str, run_id: str) -> tuple[DurableGraphFlow, list[ml.Scripted]]:
    scenario = ml.SCENARIOS[name]
    agents = scenario.agents()
    kwargs: dict[str, Any] = {}
    if scenario.graph(agents).get_has_cycles():
        kwargs["termination_condition"] = MaxMessageTermination(30)
    team = DurableGraphFlow(list(agents), scenario.graph(agents), store=url, run_id=run_id, **kwargs)
    OPEN.append(team)
    return team, agents


async def uninterrupted_sources(name: str) -> list[str]:
    """The chat-message sources of a full plain run of the scenario's graph (no stop, no block)."""
    scenario = ml.SCENARIOS[name]
    agents = scenario.agents()
    kwargs: dict[str, Any] = {}
    if scenario.graph(agents).get_has_cycles():
        kwargs["termination_condition"] = MaxMessageTermination(30)
    from autogen_agentchat.teams import GraphFlow

    result = await GraphFlow(list(agents), graph=scenario.graph(agents), **kwargs).run(task=ml.TASK)
    return [m.source for m in result.messages if isinstance(m, BaseChatMessage)]


RESUMABLE = sorted(n for n in ml.SCENARIOS if n != "finished")


@pytest.mark.parametrize("name", RESUMABLE)
async def test_a_repaired_legacy_state_runs_exactly_the_remaining_nodes(name: str, sqlite_url: str) -> None:
    state = ml.load(name)
    saved = [m["source"] for m in state["agent_states"]["GraphManager"]["message_thread"]]
    full = await uninterrupted_sources(name)
    assert full[: len(saved)] == saved
    team, _ = durable_team(name, sqlite_url, f"legacy-{name}")
    await team.load_state(state)
    result = await team.run()
    ran = [m.source for m in result.messages if isinstance(m, BaseChatMessage) and m.source != "user"]
    assert ran[-len(full[len(saved) :]) :] == full[len(saved) :]
    assert [m for m in ran if m not in full[len(saved) :]] == []


async def test_a_repaired_finished_state_runs_nothing(sqlite_url: str) -> None:
    team, agents = durable_team("finished", sqlite_url, "legacy-finished")
    await team.load_state(ml.load("finished"))
    await team.run()
    assert [a.turn for a in agents] == [1, 1, 1]  # restored turn counters; nobody spoke again


async def live_mid_run_state(url: str) -> dict[str, Any]:
    """A DurableGraphFlow's save_state() while C runs in A -> (B, C) -> D, after B answered."""
    import asyncio

    team, agents = durable_team("fanout_join", url, "live")
    gate = ml.Gate(1)
    next(a for a in agents if a.name == "C").before = gate
    running = asyncio.create_task(team.run(task=ml.TASK))
    await gate.reached(running)
    previous: Any = None
    state: dict[str, Any] = {}
    for _ in range(300):  # until B's answer is in and two saves in a row agree
        state = dict(await team.save_state())
        thread = state["agent_states"]["GraphManager"]["message_thread"]
        if [m["source"] for m in thread] == ["user", "A", "B"] and ml.normalise(state) == previous:
            break
        previous = ml.normalise(state)
        await asyncio.sleep(0.01)
    gate.open()
    await asyncio.wait_for(running, 10)
    return state


async def test_a_live_durable_state_agrees_with_repair_on_the_scheduler_and_bookkeeping(
    sqlite_url: str,
) -> None:
    state = await live_mid_run_state(sqlite_url)
    graph = ml.SCENARIOS["fanout_join"].graph()
    assert state["agent_states"]["GraphManager"]["graphflow_durable"]["scheduler"]["in_flight"] == ["C"]
    others = [f for f in validate_state(state, graph).findings if not f.pointer.endswith("/deferred_buffer")]
    assert others == []
    changes = repair_state(state, graph).changes
    assert [c.pointer for c in changes if not c.pointer.endswith("/deferred_buffer")] == []


async def test_a_live_durable_state_validates_clean_and_repair_changes_nothing(sqlite_url: str) -> None:
    state = await live_mid_run_state(sqlite_url)
    graph = ml.SCENARIOS["fanout_join"].graph()
    assert validate_state(state, graph).findings == ()
    assert repair_state(state, graph).changes == ()
