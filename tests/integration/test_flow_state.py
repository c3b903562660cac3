"""save_state() mid-run is a portable, consistent cut; load_state() copies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agents import Gate, Scripted, chain, close_stores, durable, fan, manager_state, stored_transcript, text


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _state_while_b_runs(url: str, graph_of: Any, names: str) -> dict[str, Any]:
    gate = Gate()
    agents = [Scripted(n, before=gate if n == "B" else None) for n in names]
    team = durable(agents, graph_of(*agents), url, "first")
    running = asyncio.create_task(team.run(task="go"))
    await gate.reached(running)
    state = dict(await team.save_state())
    gate.open()
    await running
    return state


@pytest.mark.parametrize("shape", ["chain", "fan"])
async def test_save_state_mid_run_is_json_format_1_with_in_flight_and_resumes_in_a_new_run(
    store_url: str, shape: str
) -> None:
    graph_of, names = (chain, "ABC") if shape == "chain" else (fan, "ABCD")
    ref_agents = [Scripted(n) for n in names]
    reference = text(
        (await durable(ref_agents, graph_of(*ref_agents), store_url, "ref").run(task="go")).messages
    )

    state = await _state_while_b_runs(store_url, graph_of, names)
    assert json.loads(json.dumps(state)) == state
    ext = manager_state(state)["graphflow_durable"]
    assert ext["format"] == 1
    assert "B" in ext["scheduler"]["in_flight"]
    assert manager_state(state)["ready"][0] in ext["scheduler"]["in_flight"], "in-flight first for GraphFlow"

    calls: list[str] = []
    fresh = [Scripted(n, calls=calls) for n in names]
    team = durable(fresh, graph_of(*fresh), store_url, "second")
    await team.load_state(state)
    await team.run()
    assert "A" not in calls
    assert stored_transcript(team) == reference
    assert team.run_info().status == "finished"


async def test_load_state_deep_copies_its_argument(store_url: str) -> None:
    ref_agents = [Scripted(n) for n in "ABC"]
    reference = text(
        (await durable(ref_agents, chain(*ref_agents), store_url, "ref").run(task="go")).messages
    )
    state = await _state_while_b_runs(store_url, chain, "ABC")

    fresh = [Scripted(n) for n in "ABC"]
    team = durable(fresh, chain(*fresh), store_url, "second")
    await team.load_state(state)
    manager = manager_state(state)
    manager["message_thread"].clear()
    manager["graphflow_durable"]["scheduler"]["in_flight"] = []
    for entry in state["agent_states"].values():
        if "agent_state" in entry:
            entry["agent_state"]["turn"] = 99
    await team.run()
    assert stored_transcript(team) == reference


async def test_a_saved_state_carries_the_graph_fingerprint_and_validates_clean_only_against_it(
    sqlite_url: str,
) -> None:
    from graphflow_durable import validate_state

    agents = [Scripted(n) for n in "ABC"]
    graph = chain(*agents)
    team = durable(agents, graph, sqlite_url, "fp")
    await team.run(task="go")
    state = await team.save_state()
    ext = manager_state(state)["graphflow_durable"]
    assert ext["graph_fingerprint"] == team._session.fingerprint
    assert validate_state(state, graph, graph_fingerprint=team._session.fingerprint).findings == ()
    other = validate_state(state, graph, graph_fingerprint="0" * 64)
    assert "GFD010-different-graph" in other.codes
