"""Property tests: the pure scheduler agrees with AutoGen's own ``GraphFlowManager``.

Each example draws a random valid graph (``tests.unit.graphs``) and a random run of it: which
in-flight node answers next (a random permutation of every batch, checked mid-batch too), what
each answer says (so string and callable conditions go either way), whether an answer carries an
inner event before its chat message, and whether another round follows the natural end, with or
without a task message.

The run drives two implementations in lock step and compares them after every operation:

* AutoGen's real ``GraphFlowManager``, constructed outside a runtime and called the way
  ``BaseGroupChatManager`` calls it: ``select_speaker`` to start a batch, ``update_message_thread``
  for every answer, the ``_active_speakers`` bookkeeping of ``handle_agent_response``, and
  ``_apply_termination_condition(delta, increment_turn_count=True)`` when the batch's last answer
  arrives (that is where GraphFlow detects its natural end and resets);
* ``graphflow_durable.scheduler``: ``select``, ``complete``, ``is_done`` / ``finish``.

The recorded run then feeds the replay, ``ReplayError`` and JSON properties.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pytest
from autogen_agentchat.messages import (
    BaseAgentEvent,
    BaseChatMessage,
    MessageFactory,
    TextMessage,
    ThoughtEvent,
)
from autogen_agentchat.teams import DiGraph, DiGraphEdge, DiGraphNode
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import GraphFlowManager
from autogen_core import AgentId, AgentInstantiationContext, SingleThreadedAgentRuntime
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from graphflow_durable.errors import ReplayError
from graphflow_durable.scheduler import (
    GraphSpec,
    SchedulerState,
    complete,
    finish,
    initial,
    is_done,
    replay,
    select,
)

from . import graphs

T = TypeVar("T")

MAX_ANSWERS = 25
"""Answers per run at most (loops may go on for ever)."""

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

_RUNTIME = SingleThreadedAgentRuntime()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (GraphFlowManager's scheduling methods do not)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("the coroutine suspended; it needs an event loop")


async def _no_termination_signal(*_: object) -> None:
    """Stands in for ``_signal_termination``: there is no runtime to publish the stop message to."""


class AutoGenManager:
    """AutoGen's real ``GraphFlowManager``, driven by direct calls, with the base class's
    ``_active_speakers`` bookkeeping done here.

    GraphFlow fills ``_ready`` from ``graph.get_start_nodes()``, a set, at construction and at every
    reset; the scheduler queues the start nodes sorted, so that every process agrees. While the
    ready queue (or the batch drawn from it) comes from that set, only its contents can be compared,
    not its order; ``ready_from_set`` / ``batch_from_set`` say when.
    """

    def __init__(self, graph: DiGraph) -> None:
        names = list(graph.nodes)
        with AgentInstantiationContext.populate_context((_RUNTIME, AgentId("GraphManager", "test"))):
            self.manager = GraphFlowManager(
                name="GraphManager",
                group_topic_type="group",
                output_topic_type="output",
                participant_topic_types=names,
                participant_names=names,
                participant_descriptions=names,
                output_message_queue=asyncio.Queue(),
                termination_condition=None,
                max_turns=10**9,  # cyclic graphs need a limit; this one is never reached
                message_factory=MessageFactory(),
                graph=graph,
            )
        self.manager._signal_termination = _no_termination_signal  # type: ignore[method-assign, assignment]
        self.active: list[str] = []
        self.ready_from_set = True
        self.batch_from_set = False

    def start(self, task: list[BaseChatMessage]) -> bool:
        """What ``handle_start`` does with task messages; True if that stopped the run."""
        _run(self.manager.update_message_thread(task))
        return _run(self.manager._apply_termination_condition(task))

    def select(self) -> list[str]:
        """What ``_transition_to_next_speakers`` does: select, then mark the speakers active."""
        speakers = _run(self.manager.select_speaker(self.manager._message_thread))
        self.active.extend(speakers)
        self.batch_from_set, self.ready_from_set = self.ready_from_set, False
        return speakers

    def answer(self, node: str, delta: list[BaseAgentEvent | BaseChatMessage]) -> None:
        """The first half of ``handle_agent_response``: record the delta, mark the node inactive."""
        _run(self.manager.update_message_thread(delta))
        self.active.remove(node)

    def end_batch(self, delta: list[BaseAgentEvent | BaseChatMessage]) -> bool:
        """The second half, once nobody is active: True at the natural end (GraphFlow reset itself)."""
        assert not self.active
        natural_end = _run(self.manager._apply_termination_condition(delta, increment_turn_count=True))
        if natural_end:
            self.ready_from_set = True
        return natural_end


def _sorted_if(flag: bool, items: list[str] | tuple[str, ...]) -> list[str]:
    return sorted(items) if flag else list(items)


def assert_agrees(autogen: AutoGenManager, state: SchedulerState, *, turn: int | None = None) -> None:
    """The scheduler state says what GraphFlowManager's bookkeeping says."""
    manager = autogen.manager
    assert {t: dict(c) for t, c in manager._remaining.items()} == {
        t: dict(g) for t, g in state.remaining.items()
    }
    assert manager._enqueued_any == {t: dict(g) for t, g in state.enqueued_any.items()}
    # Initial / after-reset ready comes from a set in GraphFlow and is sorted here: compare contents.
    assert _sorted_if(autogen.ready_from_set, list(manager._ready)) == _sorted_if(
        autogen.ready_from_set, state.ready
    )
    # GraphFlow clears a speaker's set of triggered groups but keeps the empty set.
    assert {n: set(g) for n, g in manager._triggered_activation_groups.items() if g} == {
        n: set(g) for n, g in state.triggered.items() if g
    }
    assert all(len(set(g)) == len(g) for g in state.triggered.values())
    # in_flight is GraphFlow's _active_speakers: selected minus answered (one occurrence each).
    assert _sorted_if(autogen.batch_from_set, autogen.active) == _sorted_if(
        autogen.batch_from_set, state.in_flight
    )
    if turn is not None:
        assert manager._current_turn == turn


@dataclass(frozen=True)
class Point:
    """The live state after one operation of a run, and what replay should say about it."""

    thread_len: int
    state: SchedulerState
    dispatched_at: dict[str, int]  # for each in-flight node, the thread length at its batch's selection


@dataclass
class Run:
    """A recorded random run: its graph, thread, live states and scheduler operations."""

    spec: GraphSpec
    thread: list[BaseAgentEvent | BaseChatMessage] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    operations: list[tuple[str, str | None, BaseChatMessage | None]] = field(default_factory=list)
    completions: list[int] = field(default_factory=list)
    finished_at: list[int] = field(default_factory=list)


def random_run(graph: DiGraph, data: st.DataObject) -> Run:
    """Draw a run of ``graph``, comparing the scheduler with GraphFlowManager after every operation."""
    spec = GraphSpec.from_digraph(graph)
    autogen = AutoGenManager(graph)
    run = Run(spec)
    state = initial(spec)
    turns = 0  # GraphFlow's _current_turn, counted the way the durable manager counts it
    dispatch_len = 0

    def record() -> None:
        run.points.append(Point(len(run.thread), state, {n: dispatch_len for n in state.in_flight}))

    def start_round() -> None:
        if data.draw(st.booleans(), label="task message"):
            task: list[BaseChatMessage] = [
                TextMessage(source="user", content=data.draw(graphs.message_texts()))
            ]
            assert not autogen.start(task)
            run.thread.extend(task)
            assert_agrees(autogen, state, turn=turns)

    assert_agrees(autogen, state, turn=turns)
    record()
    start_round()
    for _ in range(MAX_ANSWERS):
        if not state.in_flight:
            theirs = autogen.select()
            state, ours = select(spec, state)
            assert _sorted_if(autogen.batch_from_set, theirs) == _sorted_if(autogen.batch_from_set, ours)
            assert ours, "a batch is selected only when something is ready"
            run.operations.append(("select", None, None))
            dispatch_len = len(run.thread)
            assert_agrees(autogen, state, turn=turns)
            record()

        if len(set(state.in_flight)) < len(state.in_flight):
            event("a node is in flight twice")
        if len(state.in_flight) > 1:
            event("a batch answered in a drawn order")
        node = data.draw(st.sampled_from(state.in_flight), label="answering node")
        message = TextMessage(source=node, content=data.draw(graphs.message_texts(), label="text"))
        delta: list[BaseAgentEvent | BaseChatMessage] = [message]
        if data.draw(st.booleans(), label="inner event"):
            delta.insert(0, ThoughtEvent(source=node, content="thinking"))

        autogen.answer(node, delta)
        state = complete(spec, state, node, message)
        run.operations.append(("complete", node, message))
        run.thread.extend(delta)
        run.completions.append(len(run.thread) - 1)
        assert_agrees(autogen, state, turn=turns)
        _note_features(state)
        if state.in_flight:
            record()
            continue

        natural_end = autogen.end_batch(delta)
        assert natural_end == is_done(state)
        if natural_end:
            event(f"natural end of round {len(run.finished_at) + 1}")
            # Every node enqueued was selected since, so no triggered group is left for finish to
            # keep (GraphFlow's reset keeps _triggered_activation_groups; it holds only empty sets).
            assert not any(state.triggered.values())
            state = finish(spec, state)
            run.operations.append(("finish", None, None))
            run.finished_at.append(len(run.thread) - 1)
            turns = 0
        else:
            turns += 1
        assert_agrees(autogen, state, turn=turns)
        state = replace_turn(state, turns)
        record()
        if natural_end:
            if not data.draw(st.booleans(), label="another round"):
                break
            start_round()
    return run


def _note_features(state: SchedulerState) -> None:
    """Hypothesis events, to see (``--hypothesis-show-statistics``) that the rare cases occur."""
    if any(c < 0 for groups in state.remaining.values() for c in groups.values()):
        event("an 'all' count went below zero")
    if len(set(state.ready)) < len(state.ready):
        event("a node is twice in ready")
    if any(len(g) > 1 for g in state.triggered.values()):
        event("a node was triggered by two groups")


def replace_turn(state: SchedulerState, turn: int) -> SchedulerState:
    """The scheduler leaves ``turn`` to its caller; keep it as GraphFlow's ``_current_turn``."""
    return replace(state, turn=turn)


@PROPERTY_SETTINGS
@given(graph=graphs.digraphs(), data=st.data())
def test_scheduler_agrees_with_graphflow_manager_after_every_operation(
    graph: DiGraph, data: st.DataObject
) -> None:
    run = random_run(graph, data)
    assert run.points


@PROPERTY_SETTINGS
@given(graph=graphs.digraphs(), data=st.data())
def test_replay_of_a_thread_cut_anywhere_rebuilds_the_live_state(graph: DiGraph, data: st.DataObject) -> None:
    run = random_run(graph, data)
    spec = run.spec
    for point in run.points:
        result = replay(spec, run.thread[: point.thread_len])
        rebuilt = replace_turn(result.state, point.state.turn)  # replay does not count turns
        if point.state.in_flight and not rebuilt.in_flight:
            # Cut just after a selection: replay selects lazily, at the batch's first answer.
            rebuilt, _ = select(spec, rebuilt)
        else:
            assert result.dispatched_at == point.dispatched_at
        assert rebuilt == point.state
        assert result.state.turn == 0
        assert list(result.completions) == [i for i in run.completions if i < point.thread_len]
        assert list(result.finished_at) == [i for i in run.finished_at if i < point.thread_len]


@PROPERTY_SETTINGS
@given(graph=graphs.digraphs(), data=st.data())
def test_replay_raises_naming_the_index_of_a_node_speaking_out_of_turn(
    graph: DiGraph, data: st.DataObject
) -> None:
    run = random_run(graph, data)
    cut = data.draw(st.integers(0, len(run.thread)), label="cut")
    speaker = data.draw(st.sampled_from(sorted(graph.nodes)), label="speaker")
    live = [p for p in run.points if p.thread_len <= cut][-1].state
    allowed = set(live.in_flight) if live.in_flight else set(live.ready)
    thread = [*run.thread[:cut], TextMessage(source=speaker, content="out of turn?")]
    if speaker in allowed:
        event("the extra message fits")
        replay(run.spec, thread)
    else:
        with pytest.raises(ReplayError, match=rf"^message {cut} from '{speaker}' does not fit the graph"):
            replay(run.spec, thread)


def _through_json(value: dict[str, Any]) -> Any:
    return json.loads(json.dumps(value))


@PROPERTY_SETTINGS
@given(graph=graphs.digraphs(), data=st.data())
def test_json_and_sparse_json_round_trip_every_reachable_state(graph: DiGraph, data: st.DataObject) -> None:
    run = random_run(graph, data)
    spec = run.spec
    armed = initial(spec)
    for point in run.points:
        state = point.state
        assert SchedulerState.from_json(_through_json(state.to_json())) == state
        sparse = _through_json(state.to_sparse_json(spec))
        assert SchedulerState.from_sparse_json(sparse, spec) == state
        # The tracked frontier gives the same sparse form as scanning every target.
        assert sparse == _through_json(replace(state, touched=None).to_sparse_json(spec))
        for target, groups in sparse.get("remaining", {}).items():
            assert all(armed.remaining[target][g] != c for g, c in groups.items())
        assert all(sparse.get("enqueued_any", {}).values())
        assert all(sparse.get("triggered", {}).values())


def _with_untouched_nodes(graph: DiGraph, count: int) -> DiGraph:
    """``graph`` plus a cycle of ``count`` nodes that no run of ``graph`` can reach."""
    extra = [f"zz{i}" for i in range(count)]
    nodes = dict(graph.nodes)
    for i, name in enumerate(extra):
        target = extra[(i + 1) % count]
        edge = DiGraphEdge(target=target, condition=graphs.Contains("never said"))
        nodes[name] = DiGraphNode(name=name, edges=[edge])
    bigger = DiGraph(nodes=nodes, default_start_node=graph.default_start_node)
    bigger.graph_validate()
    return bigger


@settings(PROPERTY_SETTINGS, max_examples=150)
@given(graph=graphs.digraphs(), data=st.data(), untouched=st.integers(1, 30))
def test_sparse_json_does_not_grow_with_untouched_nodes(
    graph: DiGraph, data: st.DataObject, untouched: int
) -> None:
    run = random_run(graph, data)
    spec = run.spec
    bigger = GraphSpec.from_digraph(_with_untouched_nodes(graph, untouched))
    assert bigger.start_nodes == spec.start_nodes
    state = initial(bigger)
    states = [state]
    for operation, node, message in run.operations:
        if operation == "select":
            state, _ = select(bigger, state)
        elif operation == "complete":
            assert node is not None and message is not None
            state = complete(bigger, state, node, message)
        else:
            state = finish(bigger, state)
        states.append(state)
    small_states = [initial(spec)]
    small = small_states[0]
    for operation, node, message in run.operations:
        if operation == "select":
            small, _ = select(spec, small)
        elif operation == "complete":
            assert node is not None and message is not None
            small = complete(spec, small, node, message)
        else:
            small = finish(spec, small)
        small_states.append(small)
    for big_state, small_state in zip(states, small_states, strict=True):
        assert big_state.to_sparse_json(bigger) == small_state.to_sparse_json(spec)
        assert SchedulerState.from_sparse_json(big_state.to_sparse_json(bigger), bigger) == big_state


def test_the_tracked_frontier_follows_the_active_nodes_not_the_history() -> None:
    """In a 200-node chain, and a loop run for 200 turns, the frontier stays a node or two wide."""
    chain = [f"a{i}" for i in range(200)]
    nodes = {
        name: DiGraphNode(name=name, edges=[DiGraphEdge(target=chain[i + 1])] if i + 1 < len(chain) else [])
        for i, name in enumerate(chain)
    }
    loop = {
        "A": DiGraphNode(name="A", edges=[DiGraphEdge(target="B")]),
        "B": DiGraphNode(name="B", edges=[DiGraphEdge(target="A", condition="again")]),
    }
    for graph, script in (
        (DiGraph(nodes=nodes), chain),
        (DiGraph(nodes=loop, default_start_node="A"), ["A", "B"] * 100),
    ):
        spec = GraphSpec.from_digraph(graph)
        state = initial(spec)
        widths = []
        for node in script:
            state, speakers = select(spec, state)
            assert speakers == (node,)
            state = complete(spec, state, node, TextMessage(source=node, content="again"))
            assert state.touched is not None
            widths.append(len(state.touched))
        assert max(widths) <= 2, widths
        assert state.to_sparse_json(spec) == replace(state, touched=None).to_sparse_json(spec)


def test_the_strategies_cover_every_shape_and_feature() -> None:
    """A guard on the generator itself: the features the properties rely on do occur."""
    seen: Counter[str] = Counter()

    @settings(max_examples=300, deadline=None, database=None)
    @given(graph=graphs.digraphs())
    def look(graph: DiGraph) -> None:
        graph.graph_validate()
        edges = [e for n in graph.nodes.values() for e in n.edges]
        seen["cycle"] += graph.get_has_cycles()
        seen["default start"] += graph.default_start_node is not None
        seen["string condition"] += any(isinstance(e.condition, str) for e in edges)
        seen["callable condition"] += any(e.condition_function is not None for e in edges)
        seen["any"] += any(e.activation_condition == "any" for e in edges)
        seen["all join"] += any(
            e.activation_condition == "all"
            and sum(f.target == e.target and f.activation_group == e.activation_group for f in edges) > 1
            for e in edges
        )
        seen["two groups"] += any(
            len({f.activation_group for f in edges if f.target == e.target}) > 1 for e in edges
        )

    look()
    assert set(seen) == {
        "cycle",
        "default start",
        "string condition",
        "callable condition",
        "any",
        "all join",
        "two groups",
    }
    assert all(count > 0 for count in seen.values()), seen
