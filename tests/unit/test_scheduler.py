"""Example tests of the pure scheduler on the named GraphFlow shapes.

The expected values are GraphFlowManager's bookkeeping for the same steps (the property tests in
``test_scheduler_properties.py`` compare the two on random graphs); here each behaviour is spelt
out on a graph small enough to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace

import pytest
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, TextMessage, ThoughtEvent

from graphflow_durable.errors import ReplayError, StateFormatError
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

from .graphs import Contains, EdgeSpec, build_digraph


def spec_of(nodes: str | Sequence[str], *edges: EdgeSpec, default_start_node: str | None = None) -> GraphSpec:
    """A spec for single-letter nodes, e.g. ``spec_of("ABC", EdgeSpec("A", "B"), ...)``."""
    return GraphSpec.from_digraph(build_digraph(list(nodes), list(edges), default_start_node))


def msg(source: str, text: str = "done") -> TextMessage:
    return TextMessage(source=source, content=text)


def answer(spec: GraphSpec, state: SchedulerState, *answers: tuple[str, str]) -> SchedulerState:
    """Each ``(node, text)`` answers in turn (the node must be in flight)."""
    for node, text in answers:
        state = complete(spec, state, node, msg(node, text))
    return state


def sequential() -> GraphSpec:
    return spec_of("ABC", EdgeSpec("A", "B"), EdgeSpec("B", "C"))


def fan_out(join: str) -> GraphSpec:
    return spec_of(
        "ABCD",
        EdgeSpec("A", "B"),
        EdgeSpec("A", "C"),
        EdgeSpec("B", "D", activation=join),
        EdgeSpec("C", "D", activation=join),
    )


def review_loop() -> GraphSpec:
    """``E -> A -> B``, ``B -> A`` unless APPROVE, ``B -> C`` if APPROVE; A's parents in two groups."""
    return spec_of(
        "EABC",
        EdgeSpec("E", "A", group="start"),
        EdgeSpec("A", "B"),
        EdgeSpec("B", "A", Contains("APPROVE", negate=True), group="loop"),
        EdgeSpec("B", "C", "APPROVE"),
    )


# -- sequential ---------------------------------------------------------------------------------


def test_sequential_chain_runs_one_node_per_batch_in_order_then_reaches_its_natural_end() -> None:
    spec = sequential()
    state = initial(spec)
    spoken: list[tuple[str, ...]] = []
    while not is_done(state):
        state, speakers = select(spec, state)
        spoken.append(speakers)
        assert state.in_flight == speakers and state.ready == ()
        state = answer(spec, state, *((s, "ok") for s in speakers))
    assert spoken == [("A",), ("B",), ("C",)]


def test_completion_decrements_the_child_enqueues_it_at_zero_and_records_the_triggering_group() -> None:
    spec = sequential()
    state, _ = select(spec, initial(spec))
    state = answer(spec, state, ("A", "ok"))
    assert state.remaining["B"] == {"B": 0}
    assert state.ready == ("B",)
    assert state.triggered == {"B": ("B",)}
    assert state.in_flight == ()


def test_select_rearms_the_groups_that_triggered_each_speaker() -> None:
    spec = sequential()
    state, _ = select(spec, initial(spec))
    state, speakers = select(spec, answer(spec, state, ("A", "ok")))
    assert speakers == ("B",)
    assert state.remaining["B"] == {"B": 1}
    assert state.triggered == {}


def test_finish_rearms_every_counter_and_queues_the_start_nodes_again() -> None:
    # A -> B if "yes", A -> C if "no", B and C -> D ("all"): after "yes", D waits for ever.
    spec = spec_of(
        "ABCD",
        EdgeSpec("A", "B", "yes"),
        EdgeSpec("A", "C", "no"),
        EdgeSpec("B", "D"),
        EdgeSpec("C", "D"),
    )
    state = initial(spec)
    for node, text in (("A", "yes"), ("B", "ok")):
        state, _ = select(spec, state)
        state = answer(spec, state, (node, text))
    assert is_done(state)
    assert state.remaining["D"] == {"D": 1}
    assert finish(spec, replace(state, turn=2)) == initial(spec)


def test_start_nodes_are_queued_sorted_so_every_process_agrees() -> None:
    spec = spec_of("ZMA", EdgeSpec("Z", "A"), EdgeSpec("M", "A"))
    assert initial(spec).ready == ("M", "Z")


def test_default_start_node_is_the_only_start_node() -> None:
    spec = spec_of("ZMA", EdgeSpec("Z", "A"), EdgeSpec("M", "A"), default_start_node="Z")
    assert initial(spec).ready == ("Z",)


# -- fan-out and joins --------------------------------------------------------------------------


def test_fan_out_runs_the_branches_in_one_batch() -> None:
    spec = fan_out("all")
    state, _ = select(spec, initial(spec))
    state, speakers = select(spec, answer(spec, state, ("A", "ok")))
    assert speakers == ("B", "C")
    assert state.in_flight == ("B", "C")


def test_all_join_waits_for_every_branch() -> None:
    spec = fan_out("all")
    state, _ = select(spec, initial(spec))
    state, _ = select(spec, answer(spec, state, ("A", "ok")))
    state = answer(spec, state, ("C", "ok"))
    assert state.remaining["D"] == {"D": 1}
    assert state.ready == ()
    assert state.in_flight == ("B",)
    state = answer(spec, state, ("B", "ok"))
    assert state.remaining["D"] == {"D": 0}
    assert state.ready == ("D",)


def test_any_join_is_enqueued_once_when_both_branches_answer_in_the_same_batch() -> None:
    spec = fan_out("any")
    state, _ = select(spec, initial(spec))
    state, _ = select(spec, answer(spec, state, ("A", "ok")))
    state = answer(spec, state, ("B", "ok"))
    assert state.ready == ("D",)
    assert state.enqueued_any["D"] == {"D": True}
    state = answer(spec, state, ("C", "ok"))
    assert state.ready == ("D",)
    state, speakers = select(spec, state)
    assert speakers == ("D",)
    assert state.enqueued_any["D"] == {"D": False}


def test_any_join_runs_again_for_a_branch_that_answers_after_the_join_was_selected() -> None:
    # A -> B -> D and A -> C1 -> C2 -> D: D runs after B, and again after C2.
    spec = spec_of(
        ["A", "B", "C1", "C2", "D"],
        EdgeSpec("A", "B"),
        EdgeSpec("A", "C1"),
        EdgeSpec("C1", "C2"),
        EdgeSpec("B", "D", activation="any"),
        EdgeSpec("C2", "D", activation="any"),
    )
    state = initial(spec)
    batches: list[tuple[str, ...]] = []
    while not is_done(state):
        state, speakers = select(spec, state)
        batches.append(speakers)
        state = answer(spec, state, *((s, "ok") for s in speakers))
    assert batches == [("A",), ("B", "C1"), ("D", "C2"), ("D",)]


def test_all_join_counts_edge_firings_not_distinct_parents() -> None:
    # B loops on itself while it says "no"; D waits for its two edges (B's and C's). C stays
    # silent (its edge needs "yes"), yet two firings of B's edge are enough: GraphFlow counts.
    spec = spec_of(
        "ABCD",
        EdgeSpec("A", "B"),
        EdgeSpec("A", "C"),
        EdgeSpec("B", "B", "no", group="self"),
        EdgeSpec("B", "D", "yes"),
        EdgeSpec("C", "D", "yes"),
    )
    state, _ = select(spec, initial(spec))
    state, _ = select(spec, answer(spec, state, ("A", "ok")))
    state = answer(spec, state, ("B", "yes no"), ("C", "silence"))
    assert state.remaining["D"] == {"D": 1}
    state, speakers = select(spec, state)
    assert speakers == ("B",)
    state = answer(spec, state, ("B", "yes"))
    assert state.remaining["D"] == {"D": 0}
    assert state.ready == ("D",)


def test_node_enqueued_by_two_groups_is_twice_in_ready_and_speaks_twice() -> None:
    spec = spec_of(
        "ABCD",
        EdgeSpec("A", "B"),
        EdgeSpec("A", "C"),
        EdgeSpec("B", "D", group="b"),
        EdgeSpec("C", "D", group="c"),
    )
    state, _ = select(spec, initial(spec))
    state, _ = select(spec, answer(spec, state, ("A", "ok")))
    state = answer(spec, state, ("B", "ok"), ("C", "ok"))
    assert state.ready == ("D", "D")
    assert set(state.triggered["D"]) == {"b", "c"}
    state, speakers = select(spec, state)
    assert speakers == ("D", "D")
    assert state.remaining["D"] == {"b": 1, "c": 1}  # both groups re-armed when the first D is taken
    state = answer(spec, state, ("D", "first"))
    assert state.in_flight == ("D",)
    assert not is_done(state)
    state = answer(spec, state, ("D", "second"))
    assert is_done(state)


# -- conditional loop ---------------------------------------------------------------------------


def test_conditional_loop_repeats_until_approve_rearming_only_the_loop_group() -> None:
    spec = review_loop()
    state = initial(spec)
    assert state.ready == ("E",)
    state, _ = select(spec, state)
    state = answer(spec, state, ("E", "task"))
    assert state.ready == ("A",) and state.triggered == {"A": ("start",)}
    state, _ = select(spec, state)
    assert state.remaining["A"] == {"start": 1, "loop": 1}

    spoken = ["E", "A"]
    texts = iter(["needs work", "still not right", "APPROVE"])
    state = answer(spec, state, ("A", "draft"))
    while not is_done(state):
        state, speakers = select(spec, state)
        (node,) = speakers
        spoken.append(node)
        text = next(texts) if node == "B" else "draft"
        state = answer(spec, state, (node, text))
        if node == "B" and text != "APPROVE":
            assert state.ready == ("A",)
            assert state.triggered == {"A": ("loop",)}
            assert state.remaining["A"] == {"start": 1, "loop": 0}
    assert spoken == ["E", "A", "B", "A", "B", "A", "B", "C"]


def test_loop_reentry_sharing_an_all_group_with_the_entry_edge_never_runs_as_in_graphflow() -> None:
    # Without separate groups, A waits for both E and B, and B waits for A: nothing runs after E.
    spec = spec_of(
        "EABC",
        EdgeSpec("E", "A"),
        EdgeSpec("A", "B"),
        EdgeSpec("B", "A", Contains("APPROVE", negate=True)),
        EdgeSpec("B", "C", "APPROVE"),
    )
    state = initial(spec)
    state, _ = select(spec, state)
    state = answer(spec, state, ("E", "task"))
    assert state.ready == ()
    assert state.remaining["A"] == {"A": 1}
    assert is_done(state)


# -- complete's contract ------------------------------------------------------------------------


def test_complete_rejects_a_node_that_is_not_in_flight() -> None:
    spec = sequential()
    with pytest.raises(ValueError, match="'B' answered but is not in flight"):
        complete(spec, initial(spec), "B", msg("B"))


def test_a_message_from_outside_the_graph_only_ends_the_nodes_turn() -> None:
    spec = sequential()
    state, _ = select(spec, initial(spec))
    after = complete(spec, state, "A", msg("someone-else"))
    assert after.in_flight == ()
    assert after.remaining == state.remaining and after.ready == ()


def test_select_with_nothing_ready_selects_nobody_and_changes_nothing() -> None:
    spec = sequential()
    state, _ = select(spec, initial(spec))
    assert select(spec, state) == (state, ())


# -- replay -------------------------------------------------------------------------------------


def test_replay_raises_replay_error_naming_the_index_of_a_node_speaking_out_of_turn() -> None:
    thread = [msg("user", "task"), msg("A"), msg("C")]
    with pytest.raises(ReplayError, match=r"^message 2 from 'C' does not fit the graph"):
        replay(sequential(), thread)


def test_replay_raises_for_a_node_that_speaks_before_the_rest_of_its_parents_batch() -> None:
    # B and C run together; D (joined on both) cannot speak while C is still in flight.
    spec = fan_out("any")
    thread = [msg("A"), msg("B"), msg("D")]
    with pytest.raises(ReplayError, match=r"^message 2 from 'D'"):
        replay(spec, thread)


def test_replay_of_a_mid_batch_thread_leaves_the_unanswered_siblings_in_flight() -> None:
    spec = fan_out("all")
    result = replay(spec, [msg("user", "task"), msg("A"), msg("C")])
    assert result.state.in_flight == ("B",)
    assert result.state.ready == ()
    assert result.state.remaining["D"] == {"D": 1}
    assert result.completions == (1, 2)
    assert result.dispatched_at == {"B": 2}


def test_replay_dispatched_at_counts_the_task_but_not_the_first_answers_inner_events() -> None:
    spec = fan_out("all")
    thread: Sequence[BaseAgentEvent | BaseChatMessage] = [
        msg("user", "task"),
        ThoughtEvent(source="A", content="thinking"),
        msg("A"),
        ThoughtEvent(source="C", content="thinking"),
        msg("C"),
    ]
    result = replay(spec, thread)
    assert result.state.in_flight == ("B",)
    assert result.dispatched_at == {"B": 3}  # B and C were dispatched when the thread had 3 messages


def test_replay_leaves_the_next_batch_ready_when_the_thread_ends_between_batches() -> None:
    spec = fan_out("all")
    result = replay(spec, [msg("user", "task"), msg("A")])
    assert result.state.ready == ("B", "C")
    assert result.state.in_flight == ()
    assert result.state.triggered == {"B": ("B",), "C": ("C",)}
    assert result.dispatched_at == {}


def test_replay_across_a_natural_end_starts_the_next_round_from_the_start_nodes() -> None:
    spec = sequential()
    thread = [msg("user", "one"), msg("A"), msg("B"), msg("C"), msg("user", "two"), msg("A")]
    result = replay(spec, thread)
    assert result.finished_at == (3,)
    assert result.completions == (1, 2, 3, 5)
    assert result.state.ready == ("B",)


def test_replay_of_a_loop_keeps_the_triggered_group_of_the_reentry_node() -> None:
    spec = review_loop()
    result = replay(spec, [msg("E", "task"), msg("A"), msg("B", "needs work")])
    assert result.state.ready == ("A",)
    assert result.state.triggered == {"A": ("loop",)}
    assert result.state.remaining["A"] == {"start": 1, "loop": 0}


# -- JSON ---------------------------------------------------------------------------------------


def test_json_round_trip_keeps_the_loop_bookkeeping() -> None:
    spec = review_loop()
    state = replay(spec, [msg("E", "task"), msg("A"), msg("B", "needs work")]).state
    assert SchedulerState.from_json(state.to_json()) == state
    assert SchedulerState.from_sparse_json(state.to_sparse_json(spec), spec) == state


def test_sparse_json_of_the_armed_graph_holds_only_ready_in_flight_and_turn() -> None:
    spec = review_loop()
    assert initial(spec).to_sparse_json(spec) == {"ready": ["E"], "in_flight": [], "turn": 0}


def test_sparse_json_holds_only_the_counters_and_flags_that_moved() -> None:
    spec = fan_out("any")
    state, _ = select(spec, initial(spec))
    state, _ = select(spec, answer(spec, state, ("A", "ok")))
    state = answer(spec, state, ("B", "ok"))
    assert state.to_sparse_json(spec) == {
        "ready": ["D"],
        "in_flight": ["C"],
        "turn": 0,
        "enqueued_any": {"D": ["D"]},
        "triggered": {"D": ["D"]},
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"remaining": [], "enqueued_any": {}, "ready": []},
        {"remaining": {"A": {"A": "x"}}, "enqueued_any": {}},
    ],
)
def test_from_json_rejects_a_state_of_the_wrong_shape(data: dict[str, object]) -> None:
    with pytest.raises(StateFormatError, match="wrong shape"):
        SchedulerState.from_json(data)


def test_from_sparse_json_rejects_a_state_without_ready() -> None:
    with pytest.raises(StateFormatError, match="wrong shape"):
        SchedulerState.from_sparse_json({"in_flight": []}, sequential())


def test_states_the_rules_make_are_the_values_the_constructor_makes_with_every_field_set() -> None:
    # The rules make their states without the dataclass's __init__ (it is slower): a field added to
    # SchedulerState and not set there would be missing here, and the values would differ.
    spec = fan_out("any")
    state, _ = select(spec, initial(spec))
    made = [state, answer(spec, state, ("A", "ok")), state.with_turn(3)]
    names = {f.name for f in fields(SchedulerState)}
    for value in made:
        assert set(vars(value)) == names
        rebuilt = SchedulerState(**vars(value))
        assert rebuilt == value and repr(rebuilt) == repr(value)
        assert rebuilt.touched == value.touched
