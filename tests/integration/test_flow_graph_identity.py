"""Graph identity on resume, and dump_component() refusing callable conditions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from autogen_agentchat.teams import DiGraphBuilder

from agents import Scripted, chain, close_stores, durable, fail_once, stored_transcript
from graphflow_durable.errors import GraphMismatchError, NotSerializableError
from graphflow_durable.flow import DurableGraphFlow


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _failed_run(url: str) -> None:
    agents = [Scripted(n, before=fail_once() if n == "B" else None) for n in "ABC"]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), url, "run").run(task="go")


async def test_resuming_with_a_different_graph_raises_graph_mismatch_error_showing_the_difference(
    store_url: str,
) -> None:
    await _failed_run(store_url)
    a, b, c = (Scripted(n) for n in "ABC")
    other = DiGraphBuilder().add_node(a).add_node(b).add_node(c).add_edge(a, b).add_edge(a, c).build()
    team = durable([a, b, c], other, store_url, "run")
    with pytest.raises(GraphMismatchError) as raised:
        await team.run()
    assert isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert "node 'A': edge added" in message and '"target":"C"' in message.replace(" ", "")
    assert "node 'B': edge removed" in message
    assert "allow_graph_change=True" in message
    assert [a.calls, b.calls, c.calls] == [[], [], []]


async def test_allow_graph_change_resumes_with_a_changed_graph(store_url: str) -> None:
    await _failed_run(store_url)
    a, b, c = (Scripted(n) for n in "ABC")
    # same nodes and edges, one edge now has a (always true for B's answer) string condition
    changed = (
        DiGraphBuilder()
        .add_node(a)
        .add_node(b)
        .add_node(c)
        .add_edge(a, b)
        .add_edge(b, c, condition="B#")
        .build()
    )
    team = durable([a, b, c], changed, store_url, "run", allow_graph_change=True)
    result = await team.run()
    assert result.stop_reason == "Digraph execution is complete"
    assert [a.calls, b.calls, c.calls] == [[], ["B"], ["C"]]
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B", "C"]


def test_dump_component_with_a_callable_condition_raises_not_serializable_error_naming_the_edge(
    sqlite_url: str,
) -> None:
    a, b = Scripted("A"), Scripted("B")
    graph = DiGraphBuilder().add_node(a).add_node(b).add_edge(a, b, condition=lambda m: True).build()
    team = durable([a, b], graph, sqlite_url, "run")
    with pytest.raises(NotSerializableError, match="'A' -> 'B'") as raised:
        team.dump_component()
    assert isinstance(raised.value, ValueError)


async def test_dump_component_load_component_round_trips_store_and_run_id(sqlite_url: str) -> None:
    a, b = Scripted("A"), Scripted("B", ["done"])
    graph = DiGraphBuilder().add_node(a).add_node(b).add_edge(a, b, condition="A#").build()
    team = durable([a, b], graph, sqlite_url, "run-42")
    loaded = DurableGraphFlow.load_component(team.dump_component())
    assert isinstance(loaded, DurableGraphFlow)
    assert loaded.run_id == "run-42"
    assert loaded.store.url == team.store.url
    try:
        result = await loaded.run(task="go")
        assert [m.source for m in result.messages] == ["user", "A", "B"]
        assert team.run_info() is not None and team.run_info().status == "finished"
    finally:
        loaded.store.close()
