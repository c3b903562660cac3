"""The run position (``_model/cursor.py``): transitions, status, idempotency keys, and both JSON forms.

The cursor is the value every commit stores (its compact form) and ``save_state()`` writes (its
full form, docs/state-format.md): a field lost in either round trip is a resume that goes wrong.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graphflow_durable._model.cursor import Cursor
from graphflow_durable.errors import StateFormatError
from graphflow_durable.scheduler import GraphSpec, SchedulerState, initial, select

from .graphs import EdgeSpec, build_digraph

# A -> (B, C) -> D (join), D -> A if "again" (A activates on "any"): every kind of bookkeeping.
SPEC = GraphSpec.from_digraph(
    build_digraph(
        ["S", "A", "B", "C", "D", "E"],
        [
            EdgeSpec("S", "A", group="loop", activation="any"),
            EdgeSpec("A", "B"),
            EdgeSpec("A", "C"),
            EdgeSpec("B", "D", group="join"),
            EdgeSpec("C", "D", group="join"),
            EdgeSpec("D", "A", condition="again", group="loop", activation="any"),
            EdgeSpec("D", "E", condition="done"),
        ],
    )
)
NODES = SPEC.nodes


def flying(*nodes: str, ready: tuple[str, ...] = ()) -> SchedulerState:
    """The armed scheduler with ``nodes`` in flight and ``ready`` queued."""
    return replace(initial(SPEC), ready=ready, in_flight=nodes)


# -- transitions --------------------------------------------------------------------------------


def test_a_fresh_cursor_is_at_rest_so_the_next_start_begins_a_round() -> None:
    cursor = Cursor.fresh(initial(SPEC), origin=7)
    assert cursor.finished and not cursor.stopped
    assert cursor.origin == 7
    assert cursor.status == "finished"


def test_new_round_starts_round_and_batch_at_the_given_index_and_clears_an_earlier_stop() -> None:
    stopped = Cursor(initial(SPEC), round_start=1, batch_start=4, finished=True, stopped=True)
    cursor = stopped.new_round(9)
    assert (cursor.round_start, cursor.batch_start) == (9, 9)
    assert not cursor.finished and not cursor.stopped
    assert cursor.status == "running"


def test_dispatched_records_the_batch_and_every_in_flight_turn_as_first_attempt_at_its_step() -> None:
    sched, speakers = select(SPEC, initial(SPEC))
    cursor = Cursor.fresh(initial(SPEC)).new_round(0).dispatched(sched, speakers, at=1, step=3)
    assert speakers == ("S",)
    assert cursor.sched == sched
    assert cursor.batch_start == 1
    assert cursor.dispatches == {"S": (1,)}
    assert cursor.attempts == {"S": 1}
    assert cursor.dispatch_step == {"S": 3}
    assert cursor.status == "interrupted"


def test_dispatched_keeps_only_each_nodes_last_two_dispatch_points() -> None:
    cursor = Cursor(initial(SPEC))
    for at, step in ((1, 1), (4, 2), (6, 3)):
        cursor = cursor.dispatched(flying("A"), ["A"], at=at, step=step)
    cursor = cursor.dispatched(flying("B"), ["B"], at=8, step=4)
    assert cursor.dispatches == {"A": (4, 6), "B": (8,)}


def test_a_turn_whose_every_crash_another_run_shared_is_unclear_and_one_crash_alone_makes_it_its_own() -> (
    None
):
    cursor = Cursor.fresh(flying()).dispatched(flying("B", "C"), ["B", "C"], 3, 7)
    shared = cursor.crashed(["B", "C"], frozenset({"p", "q"})).crashed(["B", "C"], frozenset({"p"}))
    shared = shared.crashed(["B"], frozenset({"p", "r"})).crashed(["C"], frozenset({"q"}))
    assert dict(shared.crash_with) == {"B": ("p",)}  # p was in all of B's crashes; none was in all of C's
    assert shared.spent(["B", "C"], 3) == (["C"], ["B"])  # C's crashes are its own; B may be p's bystander
    back = Cursor.from_json(shared.to_json(SPEC), SPEC, {})
    assert back.crash_with == shared.crash_with and Cursor.from_extension(
        shared.extension("r")
    ).crash_with == {"B": ("p",)}
    alone = shared.crashed(["B"])  # driven alone, it died again: no company, its own
    assert alone.crash_with == {} and alone.spent(["B"], 3) == (["B"], [])
    assert shared.answered("B", flying("C")).crash_with == {} and shared.fresh_budget().crash_with == {}


def test_redispatched_counts_another_attempt_but_keeps_the_turns_dispatch_step_and_key() -> None:
    # On resume the runtime re-dispatches every in-flight node of the interrupted batch.
    cursor = Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5)
    once = cursor.redispatched(["B", "C"])
    twice = once.redispatched(["B", "C"])
    assert once.attempts == {"B": 2, "C": 2}
    assert twice.attempts == {"B": 3, "C": 3}
    assert twice.dispatch_step == {"B": 5, "C": 5}
    assert twice.dispatches == cursor.dispatches  # the input of the turn stays the same
    assert twice.key("run", "B") == cursor.key("run", "B") == "run/B/5"


def test_failures_and_crashes_count_per_turn_until_it_answers_or_a_fresh_budget() -> None:
    cursor = Cursor.fresh(flying()).dispatched(flying("B", "C"), ["B", "C"], 3, 7)
    cursor = cursor.failed("B").failed("B").crashed(["B", "C"]).crashed(["C"])
    assert (dict(cursor.failures), dict(cursor.crashes)) == ({"B": 2}, {"B": 1, "C": 2})
    back = Cursor.from_json(cursor.to_json(SPEC), SPEC, {})
    assert (back.failures, back.crashes) == (cursor.failures, cursor.crashes)  # committed with each step
    answered = cursor.answered("B", flying("C"))
    assert (dict(answered.failures), dict(answered.crashes)) == ({}, {"C": 2})
    assert (cursor.fresh_budget().failures, cursor.fresh_budget().crashes) == ({}, {})
    again = answered.dispatched(flying("C", "D"), ["D"], 5, 9)  # a new turn starts at zero
    assert (again.failures, again.crashes) == ({}, {})


def test_a_back_off_is_committed_with_the_cursor_until_the_node_is_dispatched_again() -> None:
    cursor = Cursor.fresh(flying()).dispatched(flying("B", "C"), ["B", "C"], 3, 7)
    assert cursor.next_attempt_at(["B", "C"]) is None and "retry_at" not in cursor.to_json(SPEC)
    backing = cursor.failed("B").backing_off("B", 1000.5).failed("C").backing_off("C", 1002.0)
    back = Cursor.from_json(backing.to_json(SPEC), SPEC, {})
    assert back.retry_at == {"B": 1000.5, "C": 1002.0}  # a resuming driver reads it from the head
    assert Cursor.from_extension(backing.extension("r1")).retry_at == back.retry_at  # save_state too
    assert backing.next_attempt_at(["B"]) == 1000.5 and backing.next_attempt_at(["B", "C"]) == 1002.0
    again = backing.redispatched(["B"])
    assert again.retry_at == {"C": 1002.0} and again.attempts["B"] == 2
    assert backing.answered("C", flying("B")).retry_at == {"B": 1000.5}
    assert backing.fresh_budget().retry_at == {}


def test_a_cursor_with_no_failure_nor_crash_stores_what_it_stored_before_they_were_counted() -> None:
    cursor = Cursor.fresh(flying()).dispatched(flying("B"), ["B"], 3, 7)
    assert "failures" not in cursor.to_json(SPEC) and "crashes" not in cursor.to_json(SPEC)
    assert "failures" not in cursor.extension("r1") and "crashes" not in cursor.extension("r1")


def test_a_supplied_answer_makes_the_batchs_end_due_only_when_it_was_the_batchs_last() -> None:
    cursor = Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5).failed("B")
    first = cursor.supplied("B", flying("C"))
    assert not first.end_due and first.failures == {} and first.attempts == {"C": 1}
    last = first.supplied("C", flying(ready=("D",)))
    assert last.end_due and last.to_json(SPEC)["end_due"] is True and last.extension("r1")["end_due"] is True
    assert "end_due" not in cursor.to_json(SPEC) and "end_due" not in cursor.extension("r1")
    assert not last.dispatched(flying("D"), ["D"], 4, 9).end_due  # the resume decided the end
    assert not last.ended(flying(ready=("D",)), stopped=True).end_due


def test_answered_forgets_the_bookkeeping_of_the_node_that_answered_only() -> None:
    cursor = replace(
        Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5),
        keys={"B": "other/B/1", "C": "other/C/1"},
    )
    after = cursor.answered("B", flying("C", ready=()))
    assert after.attempts == {"C": 1}
    assert after.dispatch_step == {"C": 5}
    assert after.keys == {"C": "other/C/1"}
    assert after.dispatches == cursor.dispatches  # dispatch points outlive the turn (buffer rule)
    assert after.status == "interrupted"
    assert cursor.answered("C", flying()).answered("B", flying()).status == "running"


def test_cursors_the_transitions_make_are_the_values_the_constructor_makes_with_every_field_set() -> None:
    # dispatched() and answered() make their cursors without the dataclass's __init__ (it is
    # slower): every field must be there, and the value be the one the constructor makes.
    cursor = Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5)
    names = {f.name for f in fields(Cursor)}
    for value in (cursor, cursor.answered("B", flying("C")), cursor.failed("C").answered("B", flying("C"))):
        assert set(vars(value)) == names
        rebuilt = Cursor(**vars(value))
        assert rebuilt == value and repr(rebuilt) == repr(value)


@pytest.mark.parametrize(("stopped", "status"), [(True, "stopped"), (False, "finished")])
def test_ended_is_stopped_by_a_stop_and_finished_at_the_graphs_natural_end(
    stopped: bool, status: str
) -> None:
    sched = flying(ready=("A",))
    cursor = Cursor(initial(SPEC)).new_round(0).ended(sched, stopped=stopped)
    assert cursor.finished
    assert cursor.stopped is stopped
    assert cursor.sched == sched
    assert cursor.status == status


def test_a_stopped_round_stays_stopped_through_later_dispatches_until_a_new_round() -> None:
    ended = Cursor(initial(SPEC)).ended(flying(ready=("A",)), stopped=True)
    assert ended.dispatched(flying("A"), ["A"], at=3, step=9).stopped
    assert not ended.new_round(3).stopped


def test_the_key_is_run_node_and_dispatch_step_unless_the_turn_brought_its_own() -> None:
    cursor = Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5)
    assert cursor.key("r1", "B") == "r1/B/5"
    assert cursor.key("r1", "E") == "r1/E/0"  # not dispatched: step 0
    moved = replace(cursor, keys={"C": "r0/C/2"})
    assert moved.key("r1", "C") == "r0/C/2"
    assert moved.key("r1", "B") == "r1/B/5"


# -- JSON: hypothesis over cursors a run can reach -------------------------------------------------


@st.composite
def schedulers(draw: st.DrawFn) -> SchedulerState:
    base = initial(SPEC)
    remaining = {
        t: {g: draw(st.integers(-1, count)) for g, count in groups.items()}
        for t, groups in base.remaining.items()
    }
    enqueued = {t: {g: draw(st.booleans()) for g in groups} for t, groups in base.enqueued_any.items()}
    triggered = draw(
        st.dictionaries(
            st.sampled_from(NODES),
            st.lists(st.sampled_from(["loop", "join", "B"]), min_size=1, max_size=2, unique=True).map(tuple),
            max_size=3,
        )
    )
    in_flight = tuple(draw(st.lists(st.sampled_from(NODES), unique=True, max_size=3)))
    ready = tuple(draw(st.lists(st.sampled_from(NODES), max_size=3)))
    return SchedulerState(remaining, enqueued, triggered, ready, in_flight, draw(st.integers(0, 50)))


@st.composite
def cursors(draw: st.DrawFn) -> Cursor:
    sched = draw(schedulers())
    points = st.lists(st.integers(0, 100), min_size=1, max_size=2).map(lambda p: tuple(sorted(p)))
    dispatches = draw(st.dictionaries(st.sampled_from(NODES), points))
    flying_nodes = st.sampled_from(sched.in_flight) if sched.in_flight else st.nothing()
    finished = draw(st.booleans())
    return Cursor(
        sched=sched,
        origin=draw(st.integers(0, 1000)),
        round_start=draw(st.integers(0, 100)),
        batch_start=draw(st.integers(0, 100)),
        finished=finished,
        dispatches=dispatches,
        attempts=draw(st.dictionaries(flying_nodes, st.integers(1, 5))),
        dispatch_step=draw(st.dictionaries(flying_nodes, st.integers(1, 500))),
        stopped=finished and draw(st.booleans()),  # only an ended round is stopped
        keys=draw(
            st.dictionaries(flying_nodes, st.from_regex(r"[a-z0-9]{1,6}/[A-Z]/[0-9]{1,3}", fullmatch=True))
        ),
        failures=draw(st.dictionaries(flying_nodes, st.integers(1, 5))),
        crashes=draw(st.dictionaries(flying_nodes, st.integers(1, 5))),
        end_due=not finished and draw(st.booleans()),  # only a batch of an unended round is due
        retry_at=draw(st.dictionaries(flying_nodes, st.floats(1.0, 4e9, allow_nan=False))),
    )


def idle_dispatches(cursor: Cursor) -> dict[str, tuple[int, ...]]:
    """What the step log gives back for the nodes not in flight (the compact form omits them)."""
    return {n: v for n, v in cursor.dispatches.items() if n not in cursor.sched.in_flight}


@given(cursors())
def test_the_compact_json_round_trips_with_the_idle_dispatches_from_the_step_log(cursor: Cursor) -> None:
    data = cursor.to_json(SPEC)
    assert Cursor.from_json(data, SPEC, idle_dispatches(cursor)) == cursor


@given(cursors())
def test_the_compact_json_holds_dispatch_bookkeeping_of_in_flight_nodes_only(cursor: Cursor) -> None:
    data = cursor.to_json(SPEC)
    flying_nodes = set(cursor.sched.in_flight)
    for name in ("dispatches", "attempts", "dispatch_step", "keys", "failures", "crashes", "retry_at"):
        assert set(data.get(name, {})) <= flying_nodes
    assert ("stopped" in data) is cursor.stopped


@given(cursors(), st.sampled_from(["r1", None]))
def test_the_saved_state_extension_round_trips_every_field(cursor: Cursor, run_id: str | None) -> None:
    back = Cursor.from_extension(cursor.extension(run_id))
    assert replace(back, keys={}) == replace(cursor, keys={})
    assert back.status == cursor.status
    assert back.stopped is cursor.stopped
    for node in cursor.sched.in_flight:  # every in-flight turn keeps its idempotency key
        if run_id is not None or node in cursor.keys:
            assert back.key(run_id or "", node) == cursor.key(run_id or "", node)


def test_the_extension_writes_the_in_flight_keys_status_and_fingerprint() -> None:
    cursor = replace(
        Cursor(initial(SPEC)).dispatched(flying("B", "C"), ["B", "C"], at=2, step=5), keys={"C": "r0/C/1"}
    )
    ext = cursor.extension("r1", graph_fingerprint="abc")
    assert ext["keys"] == {"B": "r1/B/5", "C": "r0/C/1"}
    assert ext["status"] == "interrupted"
    assert ext["graph_fingerprint"] == "abc"
    assert ext["format"] == 1
    assert ext["run_id"] == "r1"
    assert "stop_reason" not in cursor.extension("r1", stop_reason="STOP")
    assert cursor.extension(None)["keys"] == {"C": "r0/C/1"}  # no run: only keys the turns brought


def test_the_stop_reason_of_an_ended_round_survives_the_extension() -> None:
    ended = Cursor(initial(SPEC)).ended(flying(ready=("A",)), stopped=True)
    ext = ended.extension("r1", stop_reason="max turns reached")
    assert ext["stop_reason"] == "max turns reached"
    assert ext["status"] == "stopped"
    back = Cursor.from_extension(ext)
    assert back.stopped and back.finished
    assert back.sched.ready == ("A",)


def test_an_explicit_status_overrides_the_cursors_own() -> None:
    cursor = Cursor(initial(SPEC)).dispatched(flying("A"), ["A"], at=1, step=1)
    assert cursor.extension("r", status="failed")["status"] == "failed"


# -- malformed input ----------------------------------------------------------------------------

GOOD = Cursor(initial(SPEC)).dispatched(flying("A"), ["A"], at=1, step=1)


@pytest.mark.parametrize(
    "change",
    [
        {"s": None},
        {"origin": "first"},
        {"round_start": None},
        {"dispatches": {"A": 3}},
        {"attempts": {"A": "twice"}},
        {"dispatch_step": {"A": [1]}},
    ],
    ids=repr,
)
def test_a_malformed_compact_cursor_raises_state_format_error(change: dict[str, Any]) -> None:
    data = {**GOOD.to_json(SPEC), **change}
    with pytest.raises(StateFormatError):
        Cursor.from_json(data, SPEC, {})


@pytest.mark.parametrize("missing", ["s", "origin", "round_start", "batch_start", "finished"])
def test_a_compact_cursor_missing_a_required_field_raises_state_format_error(missing: str) -> None:
    data = GOOD.to_json(SPEC)
    del data[missing]
    with pytest.raises(StateFormatError):
        Cursor.from_json(data, SPEC, {})


@pytest.mark.parametrize(
    "change",
    [
        {"format": 2},
        {"format": None},
        {"scheduler": {"ready": []}},
        {"scheduler": "A"},
        {"origin": "x"},
        {"dispatches": {"A": ["x"]}},
        {"attempts": {"A": None}},
    ],
    ids=repr,
)
def test_a_malformed_extension_raises_state_format_error(change: dict[str, Any]) -> None:
    ext = {**GOOD.extension("r1"), **change}
    with pytest.raises(StateFormatError):
        Cursor.from_extension(ext)


def test_an_extension_without_its_scheduler_raises_state_format_error() -> None:
    ext = GOOD.extension("r1")
    del ext["scheduler"]
    with pytest.raises(StateFormatError):
        Cursor.from_extension(ext)


@pytest.mark.parametrize("name", ["dispatches", "attempts", "dispatch_step", "keys"])
def test_a_list_in_place_of_a_map_in_the_extension_raises_state_format_error(name: str) -> None:
    with pytest.raises(StateFormatError):
        Cursor.from_extension({**GOOD.extension("r1"), name: []})


@pytest.mark.parametrize("name", ["dispatches", "attempts", "dispatch_step"])
def test_a_list_in_place_of_a_map_in_the_compact_cursor_raises_state_format_error(name: str) -> None:
    with pytest.raises(StateFormatError):
        Cursor.from_json({**GOOD.to_json(SPEC), name: []}, SPEC, {})
