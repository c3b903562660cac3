"""The run page's pictures from real runs on both backends: each node's state, the graph drawn with
those states and the edges' conditions, the timeline's bars per attempt; every text escaped."""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence

import pytest
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import DiGraphBuilder

from agents import Gate, Scripted, chain, close_stores, durable, failing, loop_agents, loop_graph
from graphflow_durable import DurableGraphFlow, RetryPolicy
from graphflow_durable.errors import RunNotFoundError
from graphflow_durable.store import Store
from graphflow_durable.ui._layout import graph_svg, layout
from graphflow_durable.ui.pictures import OUTCOMES, STATES, run_pictures

SVG = "{http://www.w3.org/2000/svg}"
FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
PAYLOADS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "javascript:alert(1)")


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg" and root.get("viewBox")
    return root


def drawn_states(svg: str) -> dict[str, str]:
    return {
        g.get("data-node", ""): g.get("data-state", "")
        for g in parse(svg).iter(f"{SVG}g")
        if g.get("data-node")
    }


def bars(svg: str) -> list[tuple[str, int, str]]:
    """The timeline's attempt bars: (node, attempt, outcome), by node then attempt."""
    found = [
        (r.get("data-node", ""), int(r.get("data-attempt", "0")), r.get("data-outcome", ""))
        for r in parse(svg).iter(f"{SVG}rect")
        if r.get("data-outcome")
    ]
    return sorted(found)


def marks(svg: str, kind: str) -> list[str]:
    return sorted(r.get("data-node", "") for r in parse(svg).iter(f"{SVG}rect") if r.get("data-kind") == kind)


def assert_safe(svg: str) -> None:
    """No script, no event attribute, no external reference anywhere in the markup."""
    root = parse(svg)
    for element in root.iter():
        assert element.tag.split("}")[-1] not in ("script", "image", "foreignObject", "a", "use")
        for name, value in element.attrib.items():
            assert not name.lower().startswith("on"), (element.tag, name)
            assert "href" not in name.lower()
            assert "javascript:" not in value.lower() or name.startswith("data-")  # inert data only


async def test_a_finished_loop_run_draws_every_node_done_its_edges_conditions_and_one_bar_per_turn(
    store_url: str,
) -> None:
    agents = loop_agents([])
    await durable(agents, loop_graph(agents), store_url, "loop", MaxMessageTermination(60)).run(task="go")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "loop", now=time.time())
        again = run_pictures(store, "loop", now=time.time() + 50)
    finally:
        store.close()
    assert pictures.states == dict.fromkeys(["E", "J", "P1", "P2", "R", "S"], "done")
    assert drawn_states(pictures.graph_svg) == pictures.states
    root = parse(pictures.graph_svg)
    edges = [g for g in root.iter(f"{SVG}g") if g.get("data-source")]
    assert len(edges) == 7 and all(g.find(f"{SVG}path") is not None for g in edges)
    back = [(g.get("data-source"), g.get("data-target")) for g in edges if "back" in (g.get("class") or "")]
    assert back == [("R", "J")]  # the loop is drawn curved, outside the layering
    labels = sorted("".join(t.itertext()) for t in root.iter(f"{SVG}text") if t.get("class") == "edge-label")
    assert labels == ["[join: all]", "[join: all]", "again [loop: any]", "done"]
    assert [layer for layer in layout(store_graph(store_url, "loop")).layers] == [
        ("S",),
        ("P1", "P2"),
        ("J",),
        ("R",),
        ("E",),
    ]
    assert bars(pictures.timeline_svg) == [
        ("E", 1, "done"),
        ("J", 1, "done"),
        ("J", 1, "done"),
        ("J", 1, "done"),
        ("P1", 1, "done"),
        ("P2", 1, "done"),
        ("R", 1, "done"),
        ("R", 1, "done"),
        ("R", 1, "done"),
        ("S", 1, "done"),
    ]
    # an ended run's pictures do not depend on the clock
    assert again == pictures
    assert_safe(pictures.graph_svg)
    assert_safe(pictures.timeline_svg)


def store_graph(url: str, run_id: str) -> dict[str, object]:
    store = Store(url)
    try:
        run = store.get_run(run_id)
        assert run is not None
        return dict(run.graph)
    finally:
        store.close()


async def test_retried_attempts_are_bars_of_their_own_with_the_back_off_between_them(store_url: str) -> None:
    agents = [Scripted(n, before=failing(2) if n == "B" else None) for n in "ABC"]
    await durable(agents, chain(*agents), store_url, "retried", retry=FAST).run(task="go")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "retried")
    finally:
        store.close()
    assert pictures.states == {"A": "done", "B": "done", "C": "done"}
    assert bars(pictures.timeline_svg) == [
        ("A", 1, "done"),
        ("B", 1, "retried"),
        ("B", 2, "retried"),
        ("B", 3, "done"),
        ("C", 1, "done"),
    ]
    assert marks(pictures.timeline_svg, "backoff") == ["B", "B"]
    titles = [
        "".join(r.itertext())
        for r in parse(pictures.timeline_svg).iter(f"{SVG}rect")
        if r.get("data-outcome") == "retried"
    ]
    assert all("ConnectionError: B: connection reset by peer" in t for t in titles)


async def test_a_node_whose_budget_ran_out_is_failed_and_the_nodes_after_it_pending(store_url: str) -> None:
    agents = [Scripted(n, before=failing(5) if n == "B" else None) for n in "ABC"]
    policy = RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False)
    with pytest.raises(Exception, match="B"):
        await durable(agents, chain(*agents), store_url, "spent", retry=policy).run(task="go")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "spent")
    finally:
        store.close()
    assert pictures.states == {"A": "done", "B": "failed", "C": "pending"}
    assert drawn_states(pictures.graph_svg) == pictures.states
    assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("B", 1, "retried"), ("B", 2, "failed")]


async def test_a_node_backing_off_is_backoff_while_its_run_waits_for_the_next_attempt(store_url: str) -> None:
    agents = [Scripted(n, before=failing(1) if n == "B" else None) for n in "ABC"]
    slow = RetryPolicy(max_attempts=3, initial_interval=60.0, jitter=False)
    team = durable(agents, chain(*agents), store_url, "backing", retry=slow)
    task = asyncio.ensure_future(team.run(task="go"))
    store = Store(store_url)
    try:
        for _ in range(500):
            if store.get_run("backing") and any(s.kind == "attempt_failed" for s in store.history("backing")):
                break
            await asyncio.sleep(0.02)
        pictures = run_pictures(store, "backing")
        assert pictures.states == {"A": "done", "B": "backoff", "C": "pending"}
        assert drawn_states(pictures.graph_svg)["B"] == "backoff"
        assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("B", 1, "retried")]
        assert marks(pictures.timeline_svg, "backoff") == ["B"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store.close()


async def test_a_node_in_flight_is_running_with_a_bar_to_now(store_url: str) -> None:
    gate = Gate()
    agents = [Scripted(n, before=gate if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "running")
    task = asyncio.ensure_future(team.run(task="go"))
    store = Store(store_url)
    try:
        await gate.reached(task)
        now = time.time() + 5
        pictures = run_pictures(store, "running", now=now)
        assert pictures.states == {"A": "done", "B": "running", "C": "pending"}
        assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("B", 1, "running")]
        (bar,) = [
            r for r in parse(pictures.timeline_svg).iter(f"{SVG}rect") if r.get("data-outcome") == "running"
        ]
        right = float(bar.get("x", "0")) + float(bar.get("width", "0"))
        assert right == pytest.approx(150 + 760, abs=1)  # reaches the axis's end: now
        assert [
            r.get("data-driver")
            for r in parse(pictures.timeline_svg).iter(f"{SVG}rect")
            if r.get("data-kind") == "driver"
        ]
        gate.open()
        await task
    finally:
        if not task.done():
            task.cancel()
        store.close()


def person(prompt: str) -> str:
    return "typed"


def asking(url: str, run_id: str) -> DurableGraphFlow:
    """A -> H -> C, H a person answered through the store."""
    a, c, h = Scripted("A"), Scripted("C"), UserProxyAgent("H", input_func=person)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    return durable([a, h, c], graph, url, run_id, human_input="wait")  # type: ignore[list-item]


async def test_a_node_asking_a_person_is_waiting_and_a_cancelled_run_cancels_what_is_not_done(
    store_url: str,
) -> None:
    await asking(store_url, "asks").run(task="go")
    store = Store(store_url)
    try:
        waiting = run_pictures(store, "asks")
        assert waiting.states == {"A": "done", "C": "pending", "H": "waiting"}
        assert marks(waiting.timeline_svg, "wait") == ["H"]
        assert ("H", 1, "waiting") in bars(waiting.timeline_svg)
        store.cancel_run("asks")
        cancelled = run_pictures(store, "asks")
        assert cancelled.states == {"A": "done", "C": "cancelled", "H": "cancelled"}
        assert drawn_states(cancelled.graph_svg) == cancelled.states
    finally:
        store.close()


async def test_an_answered_wait_is_drawn_from_the_question_to_the_answer(store_url: str) -> None:
    await asking(store_url, "answered").run(task="go")
    store = Store(store_url)
    try:
        store.respond("answered", "yes")
        await asking(store_url, "answered").run()
        pictures = run_pictures(store, "answered")
    finally:
        store.close()
    assert pictures.states == {"A": "done", "C": "done", "H": "done"}
    assert marks(pictures.timeline_svg, "wait") == ["H"]
    assert bars(pictures.timeline_svg) == [
        ("A", 1, "done"),
        ("C", 1, "done"),
        ("H", 1, "waiting"),
        ("H", 2, "done"),
    ]


def test_an_unknown_run_raises_the_stores_unknown_run_error(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        with pytest.raises(RunNotFoundError):
            run_pictures(store, "nobody")
    finally:
        store.close()


async def test_user_texts_in_conditions_are_escaped_and_break_no_attribute(store_url: str) -> None:
    a, b, c = Scripted("A", ["x"]), Scripted("B"), Scripted("C")
    builder = DiGraphBuilder().add_node(a).add_node(b).add_node(c)
    builder.add_edge(a, b, condition=PAYLOADS[0]).add_edge(a, c, condition=PAYLOADS[1])
    builder.add_edge(b, c, condition=PAYLOADS[2], activation_group=PAYLOADS[1], activation_condition="any")
    await durable([a, b, c], builder.build(), store_url, "payloads").run(task="go")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "payloads")
    finally:
        store.close()
    for svg in (pictures.graph_svg, pictures.timeline_svg):
        assert (
            "<script" not in svg and "<img" not in svg and "onerror=" not in svg.replace("onerror=alert", "")
        )
        assert_safe(svg)
    root = parse(pictures.graph_svg)
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")] + [
        "".join(t.itertext()) for t in root.iter(f"{SVG}title")
    ]
    assert any(PAYLOADS[0] in t for t in texts)  # shown literally, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pictures.graph_svg


def payload_graph(names: Sequence[str]) -> dict[str, object]:
    """A stored graph description whose node names are hostile texts (a -> b -> c -> a)."""
    a, b, c = names
    return {
        "nodes": {
            a: {
                "activation": "all",
                "edges": [{"target": b, "condition": f"text:{c}", "group": b, "activation": "all"}],
            },
            b: {
                "activation": "any",
                "edges": [{"target": c, "condition": None, "group": c, "activation": "all"}],
            },
            c: {
                "activation": "all",
                "edges": [{"target": a, "condition": "<callable m.<f>>", "group": a, "activation": "all"}],
            },
        },
        "default_start_node": a,
        "participants": list(names),
    }


def test_hostile_node_names_appear_only_escaped_in_a_deterministic_graph() -> None:
    graph = payload_graph(PAYLOADS)
    states = dict(zip(PAYLOADS, ("done", "running", "failed"), strict=True))
    svg = graph_svg(graph, states)
    assert svg == graph_svg(graph, dict(reversed(list(states.items()))))
    assert_safe(svg)
    assert drawn_states(svg) == states  # each name back intact from its escaped attribute
    assert "<script" not in svg and "<img" not in svg
    root = parse(svg)
    assert len([g for g in root.iter(f"{SVG}g") if g.get("data-source")]) == 3  # the cycle's back edge too
    titles = ["".join(t.itertext()) for t in root.iter(f"{SVG}title")]
    assert f"{PAYLOADS[0]}: done (start)" in titles


def test_every_state_and_outcome_has_its_colour() -> None:
    from graphflow_durable.ui._layout import STATE_COLOURS
    from graphflow_durable.ui.pictures import _OUTCOME_COLOURS

    assert set(STATE_COLOURS) == set(STATES) and set(_OUTCOME_COLOURS) == set(OUTCOMES)
