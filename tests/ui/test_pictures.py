"""The run page's pictures from real runs on both backends: each node's state, the graph drawn with
those states and the edges' conditions, the timeline's bars per attempt; every text escaped."""

from __future__ import annotations

import asyncio
import signal
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import DiGraphBuilder

from agents import Gate, Scripted, chain, close_stores, durable, failing, loop_agents, loop_graph
from graphflow_durable import DurableGraphFlow, RetryPolicy
from graphflow_durable.errors import RunNotFoundError
from graphflow_durable.store import Store
from graphflow_durable.ui._layout import graph_svg, layout
from graphflow_durable.ui.pictures import OUTCOMES, STATES, run_pictures, run_states
from processes import last_json, run_script

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
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        parked = run_pictures(store, "backing")  # interrupted in its back-off: the next run() waits it out
        assert store.get_run("backing").status == "interrupted"  # type: ignore[union-attr]
        assert parked.states == {"A": "done", "B": "backoff", "C": "pending"}
    finally:
        if not task.done():
            task.cancel()
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
        assert run_pictures(store, "running", now=now) == pictures  # the same store and clock: the same
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


CRASH_WORKER = Path(__file__).resolve().parents[1] / "crash" / "worker.py"


def test_a_driver_killed_mid_turn_shows_its_takeover_the_turns_it_cut_short_and_who_drove_each_stretch(
    store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "turns.log"
    killed = run_script(CRASH_WORKER, store_url, "crashed", "agent:3", exec_log=log)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    store = Store(store_url)
    try:
        dead = store.get_run("crashed")
        assert dead is not None and dead.status == "running" and dead.lease_pid is not None
        orphaned = run_pictures(store, "crashed")  # its driver is gone: nobody runs its turns
        assert "running" not in orphaned.states.values() and "pending" in orphaned.states.values()
        assert {b[2] for b in bars(orphaned.timeline_svg)} == {"done", "interrupted"}
        (holder,) = [
            r for r in parse(orphaned.timeline_svg).iter(f"{SVG}rect") if r.get("data-kind") == "driver"
        ]
        assert "owner gone: nobody drives the run" in "".join(holder.itertext())
        last_json(run_script(CRASH_WORKER, store_url, "crashed", exec_log=log))  # another process takes over
        pictures = run_pictures(store, "crashed")
    finally:
        store.close()
    assert set(pictures.states.values()) == {"done"}
    root = parse(pictures.timeline_svg)
    (takeover,) = [e for e in root.iter(f"{SVG}line") if e.get("data-kind") == "takeover"]
    assert f"pid {dead.lease_pid} on {dead.lease_host} died" in "".join(takeover.itertext())
    drivers = [r.get("data-driver") for r in root.iter(f"{SVG}rect") if r.get("data-kind") == "driver"]
    assert drivers[0] == f"pid {dead.lease_pid} on {dead.lease_host}" and len(drivers) == 2
    # between its last commit and the takeover nobody drove the run
    assert [
        r.get("data-kind") for r in root.iter(f"{SVG}rect") if r.get("data-kind") in ("driver", "no-driver")
    ] == [
        "driver",
        "no-driver",
        "driver",
    ]
    cut = [b for b in bars(pictures.timeline_svg) if b[2] == "interrupted"]
    assert cut and all(attempt == 1 for _, attempt, _ in cut)  # the turns in flight when it died...
    for node, _, _ in cut:  # ...ran again, as attempt 2, in the process that took over
        assert (node, 2, "done") in bars(pictures.timeline_svg)


async def test_a_run_failed_on_a_persons_deadline_shows_the_asking_node_failed(store_url: str) -> None:
    from graphflow_durable import HumanInput

    a, c, h = Scripted("A"), Scripted("C"), UserProxyAgent("H", input_func=person)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    team = durable([a, h, c], graph, store_url, "late", human_input=HumanInput("wait", timeout=0.2))  # type: ignore[list-item]
    await team.run(task="go")
    await asyncio.sleep(0.3)
    with pytest.raises(RuntimeError, match="passed its deadline"):
        await team.run()
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "late", now=time.time() + 3600)
    finally:
        store.close()
    assert pictures.states == {"A": "done", "C": "pending", "H": "failed"}
    assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("H", 1, "waiting"), ("H", 2, "failed")]
    (wait,) = [r for r in parse(pictures.timeline_svg).iter(f"{SVG}rect") if r.get("data-kind") == "wait"]
    assert float(wait.get("x", "0")) + float(wait.get("width", "0")) <= 150 + 760 + 1  # not to the hour ahead


async def test_a_failed_attempts_error_text_is_escaped_in_the_timeline(store_url: str) -> None:
    async def hostile(agent: Scripted, messages: Sequence[object]) -> None:
        if agent.turn == 1 and not raised:
            raised.append(True)
            raise ConnectionError(PAYLOADS[0] + PAYLOADS[1])

    raised: list[bool] = []
    agents = [Scripted(n, before=hostile if n == "B" else None) for n in "AB"]
    await durable(agents, chain(*agents), store_url, "hostile", retry=FAST).run(task="go")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "hostile")
    finally:
        store.close()
    assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("B", 1, "retried"), ("B", 2, "done")]
    assert_safe(pictures.timeline_svg)
    assert "<script" not in pictures.timeline_svg and "<img" not in pictures.timeline_svg
    (retried,) = [
        r for r in parse(pictures.timeline_svg).iter(f"{SVG}rect") if r.get("data-outcome") == "retried"
    ]
    assert PAYLOADS[0] + PAYLOADS[1] in "".join(retried.itertext())  # the text itself, shown literally


async def test_each_round_is_marked_where_it_began(store_url: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    await durable(agents, chain(*agents), store_url, "rounds").run(task="first")
    await durable(agents, chain(*agents), store_url, "rounds").run(task="second")
    store = Store(store_url)
    try:
        pictures = run_pictures(store, "rounds")
    finally:
        store.close()
    root = parse(pictures.timeline_svg)
    titles = ["".join(e.itertext()) for e in root.iter(f"{SVG}line") if e.get("data-kind") == "start"]
    assert [t.split(" began")[0] for t in titles] == ["round 1", "round 2"]
    assert pictures.states == {"A": "done", "B": "done"}
    assert bars(pictures.timeline_svg) == [
        ("A", 1, "done"),
        ("A", 1, "done"),
        ("B", 1, "done"),
        ("B", 1, "done"),
    ]


async def test_a_cancelled_run_draws_the_nodes_it_did_not_reach_cancelled(store_url: str) -> None:
    gate = Gate()
    agents = [Scripted(n, before=gate if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "stopped", lease_seconds=0.6)
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    with Store(store_url) as other:  # as another process would
        assert other.cancel_run("stopped").outcome == "requested"
        await asyncio.sleep(0.5)  # the driver renews its 0.6 s lease every 0.2 s: it has seen it
        asked = run_pictures(other, "stopped", now=time.time())
        gate.open()  # B answers and is recorded; C is not dispatched
        await asyncio.wait_for(running, 10)
        assert other.get_run("stopped").status == "cancelled"  # type: ignore[union-attr]
        pictures = run_pictures(other, "stopped")
    assert asked.states == {"A": "done", "B": "running", "C": "pending"}  # asked, not yet honoured
    assert pictures.states == {"A": "done", "B": "done", "C": "cancelled"}
    assert drawn_states(pictures.graph_svg) == pictures.states
    # C was dispatched by B's step as the cancel stopped the run: its turn is drawn cut
    assert bars(pictures.timeline_svg) == [("A", 1, "done"), ("B", 1, "done"), ("C", 1, "cancelled")]
    (cut,) = [
        r for r in parse(pictures.timeline_svg).iter(f"{SVG}rect") if r.get("data-outcome") == "cancelled"
    ]
    assert "dispatched, then the run was cancelled" in "".join(cut.itertext())


async def test_drawing_a_run_changes_nothing_in_the_store_and_takes_no_lease(store_url: str) -> None:
    await asking(store_url, "still").run(task="go")
    store = Store(store_url)
    try:
        before = (store.get_run("still"), store.export_run("still"), store.stats().rows)
        run_pictures(store, "still")
        assert (store.get_run("still"), store.export_run("still"), store.stats().rows) == before
        assert before[0] is not None and before[0].lease_owner is None
    finally:
        store.close()


def test_two_edges_between_the_same_nodes_are_drawn_apart_with_both_conditions() -> None:
    edge = {"target": "B", "group": "B", "activation": "all"}
    graph = {
        "nodes": {
            "A": {
                "activation": "all",
                "edges": [{**edge, "condition": "text:yes"}, {**edge, "condition": "text:maybe"}],
            },
            "B": {"activation": "all", "edges": []},
        },
        "default_start_node": "A",
        "participants": ["A", "B"],
    }
    root = parse(graph_svg(graph, {}))
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "edge-label"]
    assert sorted(t.text or "" for t in labels) == ["maybe", "yes"]
    assert len({t.get("y") for t in labels}) == 2
    assert len({p.get("d") for p in root.iter(f"{SVG}path") if p.get("marker-end")}) == 2
    assert drawn_states(graph_svg(graph, {})) == {"A": "pending", "B": "pending"}  # not drawn yet: pending


def test_an_edge_that_skips_a_layer_passes_over_the_nodes_in_its_way() -> None:
    def edge(target: str, condition: str | None = None) -> dict[str, object]:
        return {"target": target, "condition": condition, "group": target, "activation": "all"}

    graph = {
        "nodes": {
            "A": {"activation": "all", "edges": [edge("B"), edge("C", "text:skip")]},
            "B": {"activation": "all", "edges": [edge("C")]},
            "C": {"activation": "all", "edges": []},
        },
        "default_start_node": "A",
        "participants": ["A", "B", "C"],
    }
    root = parse(graph_svg(graph, {}))
    (skip,) = [g for g in root.iter(f"{SVG}g") if "skip" in (g.get("class") or "")]
    assert (skip.get("data-source"), skip.get("data-target")) == ("A", "C")
    (b,) = [g.find(f"{SVG}rect") for g in root.iter(f"{SVG}g") if g.get("data-node") == "B"]
    assert b is not None
    path = skip.find(f"{SVG}path")
    assert path is not None
    heights = [
        float(p.split(",")[1])
        for p in path.get("d", "").replace("M", " ").replace("C", " ").replace("L", " ").split()
    ]
    assert min(heights) < float(b.get("y", "0"))  # it runs above B, not through it


async def test_the_live_pages_node_states_read_from_the_steps_alone_are_those_the_pictures_draw(
    store_url: str,
) -> None:
    from helpers import failed_run, finished_run, waiting_run

    await finished_run(store_url, "done")
    await waiting_run(store_url, "asks")
    await failed_run(store_url, "broke")
    with Store(store_url) as store:
        for run_id in ("done", "asks", "broke"):
            full, steps = store.load(run_id), store.load_steps(run_id)
            assert (steps.run, steps.steps, steps.scheduler) == (full.run, full.steps, full.scheduler)
            assert full.messages and not steps.messages and not steps.agent_states  # never read
            assert run_states(store, run_id) == run_pictures(store, run_id).states
        assert set(run_states(store, "broke").values()) >= {"done", "failed"}
        with pytest.raises(RunNotFoundError):
            store.load_steps("nope")
