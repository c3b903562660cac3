"""Property tests: repair recovers the true scheduler state of any interrupted run, idempotently.

Each example draws a random valid graph (``tests.unit.graphs``) and a random run of it, driven by
the pure scheduler with random answer orders and texts (so conditions go either way), stopped at a
random point: mid-batch, between batches, or just after the next batch was selected. From that
point it builds the state plain ``GraphFlow`` would have saved -- the ready queue without the
in-flight nodes, no triggered groups, empty buffers -- and checks that repair:

* restores exactly the in-flight nodes, the ready queue, the counters and the triggered groups;
* never mutates its input; is idempotent; and its output validates with no findings.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams import DiGraph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphflow_durable.integrity import repair_state, validate_state
from graphflow_durable.scheduler import GraphSpec, SchedulerState, complete, finish, initial, is_done, select

from . import graphs


def plain_state(graph: DiGraph, thread: list[TextMessage], state: SchedulerState) -> dict[str, Any]:
    """What plain GraphFlow's save_state() holds at this point (in-flight nodes are lost)."""
    containers = {
        name: {"type": "ChatAgentContainerState", "version": "1.0.0", "agent_state": {}, "message_buffer": []}
        for name in graph.nodes
    }
    full = state.to_json()
    manager = {
        "message_thread": [m.dump() for m in thread],
        "current_turn": 0,
        "remaining": full["remaining"],
        "enqueued_any": full["enqueued_any"],
        "ready": list(state.ready),
    }
    return {"type": "TeamState", "version": "1.0.0", "agent_states": {**containers, "GraphManager": manager}}


@st.composite
def interrupted_runs(draw: st.DrawFn) -> tuple[DiGraph, dict[str, Any], SchedulerState]:
    graph = draw(graphs.digraphs())
    spec = GraphSpec.from_digraph(graph)
    state = initial(spec)
    thread = [TextMessage(content="task", source="user")]
    for _ in range(draw(st.integers(0, 12))):
        if not state.in_flight:
            state, _ = select(spec, state)
        node = draw(st.sampled_from(sorted(set(state.in_flight))))
        message = TextMessage(content=f"{node}: {draw(graphs.message_texts())}", source=node)
        thread.append(message)
        state = complete(spec, state, node, message)
        if is_done(state):
            state = finish(spec, state)
    if not state.in_flight and draw(st.booleans()):
        state, _ = select(spec, state)  # saved just after GraphFlow drained ready (#7043)
    return graph, plain_state(graph, thread, state), state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interrupted_runs())
def test_repair_recovers_the_true_scheduler_state_and_is_idempotent(
    run: tuple[DiGraph, dict[str, Any], SchedulerState],
) -> None:
    graph, state, truth = run
    before = copy.deepcopy(state)
    first = repair_state(state, graph)
    assert state == before  # pure
    sched = first.state["agent_states"]["GraphManager"]["graphflow_durable"]["scheduler"]
    assert Counter(sched["in_flight"]) == Counter(truth.in_flight)
    assert Counter(sched["ready"]) == Counter(truth.ready)
    assert sched["remaining"] == truth.to_json()["remaining"]
    assert sched["enqueued_any"] == truth.to_json()["enqueued_any"]
    assert sched["triggered"] == truth.to_json()["triggered"]
    second = repair_state(first.state, graph)
    assert second.state == first.state
    assert second.changes == ()
    assert validate_state(first.state, graph).findings == ()
