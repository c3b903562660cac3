"""The restore plan (``_model/restore.py``): from a run's stored log to the team at its head.

Every log here is made by hand from the store's value types (``_model/records.py``), with the step
data the runtime writes: ``{"dispatched": [...], "at": n}`` on a selection, ``{"dispatches": ...}``
on an import, nothing on a reset (whose cursor moves ``origin`` past the run's messages).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from autogen_agentchat.messages import TextMessage

from graphflow_durable._model import records
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.records import RunLog, RunRecord, StepRecord, StoredMessage
from graphflow_durable._model.restore import cursor_from_log, plan
from graphflow_durable.scheduler import GraphSpec, SchedulerState, complete, initial, select

from .graphs import EdgeSpec, build_digraph

# S -> (A, B); A -> C.
SPEC = GraphSpec.from_digraph(
    build_digraph(["S", "A", "B", "C"], [EdgeSpec("S", "A"), EdgeSpec("S", "B"), EdgeSpec("A", "C")])
)
PEOPLE = ("S", "A", "B", "C")


def kind(name: str) -> Any:
    """A step kind as the records module spells it (a ``StepKind`` member once there is one)."""
    step_kind = getattr(records, "StepKind", None)
    return name if step_kind is None else step_kind(name)


def step(seq: int, name: str, node: str | None = None, **data: Any) -> StepRecord:
    return StepRecord(seq=seq, kind=kind(name), node=node, data=data, created_at=0.0)


def body(source: str, text: str | None = None) -> dict[str, Any]:
    return TextMessage(source=source, content=text or f"{source} says hi").dump()


def run_record(message_count: int, head: int) -> RunRecord:
    known: dict[str, Any] = {
        "run_id": "r1",
        "graph_fingerprint": "",
        "graph": {},
        "status": "interrupted",
        "head_seq": head,
        "message_count": message_count,
        "fencing_token": 1,
        "created_at": 0.0,
        "updated_at": 0.0,
    }
    required = [f.name for f in dataclasses.fields(RunRecord) if f.default is dataclasses.MISSING]
    return RunRecord(**{name: known.get(name) for name in required})


def run_log(
    steps: Sequence[StepRecord],
    messages: Sequence[StoredMessage],
    cursor: Cursor | None,
    agent_states: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunLog:
    return RunLog(
        run=run_record(len(messages), steps[-1].seq if steps else 0),
        steps=list(steps),
        messages=list(messages),
        scheduler=None if cursor is None else cursor.to_json(SPEC),
        agent_states=dict(agent_states or {}),
    )


def answer(sched: SchedulerState, node: str) -> SchedulerState:
    return complete(SPEC, sched, node, TextMessage(source=node, content="ok"))


def first_run() -> tuple[list[StepRecord], list[StoredMessage], Cursor]:
    """user -> S answers -> A answers while B still runs (C became ready): the log and head cursor.

    Steps: 1 start (S dispatched at 1), 2 S completes (A, B dispatched at 2), 3 A completes.
    """
    cursor = Cursor.fresh(initial(SPEC)).new_round(0)
    sched, speakers = select(SPEC, cursor.sched)
    cursor = cursor.dispatched(sched, speakers, at=1, step=1)
    sched, speakers = select(SPEC, answer(cursor.sched, "S"))
    cursor = cursor.answered("S", sched).dispatched(sched, speakers, at=2, step=2)
    cursor = cursor.answered("A", answer(cursor.sched, "A"))
    steps = [
        step(1, "start", dispatched=["S"], at=1),
        step(2, "complete", "S", dispatched=["A", "B"], at=2),
        step(3, "complete", "A"),
    ]
    messages = [
        StoredMessage(0, 1, body("user", "go"), True),
        StoredMessage(1, 2, body("S"), True),
        StoredMessage(2, 3, {"type": "ThoughtEvent", "source": "A", "content": "hmm"}, False),
        StoredMessage(3, 3, body("A"), True),
    ]
    return steps, messages, cursor


# -- cursor_from_log ------------------------------------------------------------------------------


def test_a_log_without_a_head_cursor_gives_a_fresh_cursor_at_rest() -> None:
    cursor = cursor_from_log(run_log([], [], None), SPEC)
    assert cursor == Cursor.fresh(initial(SPEC))
    assert cursor.status == "finished"


def test_the_head_cursor_is_read_back_with_dispatch_points_gathered_from_every_step() -> None:
    steps, messages, head = first_run()
    cursor = cursor_from_log(run_log(steps, messages, head), SPEC)
    assert cursor == head
    # S and A are not in flight: the head step does not hold their dispatch points, the log does.
    assert "S" not in head.to_json(SPEC).get("dispatches", {})
    assert cursor.dispatches == {"S": (1,), "A": (2,), "B": (2,)}
    assert cursor.sched.in_flight == ("B",)
    assert cursor.sched.ready == ("C",)


def test_gathered_dispatch_points_keep_each_nodes_last_two() -> None:
    steps = [step(i, "complete", "S", dispatched=["S"], at=at) for i, at in enumerate((1, 3, 5, 9), start=1)]
    cursor = cursor_from_log(run_log(steps, [], Cursor(initial(SPEC))), SPEC)
    assert cursor.dispatches == {"S": (5, 9)}


def test_a_dispatch_step_without_a_position_counts_as_the_start_of_the_thread() -> None:
    cursor = cursor_from_log(run_log([step(1, "start", dispatched=["S"])], [], Cursor(initial(SPEC))), SPEC)
    assert cursor.dispatches == {"S": (0,)}


def test_a_reset_step_forgets_the_dispatch_points_before_it() -> None:
    steps, messages, _ = first_run()
    after = Cursor.fresh(initial(SPEC), origin=4).new_round(0)
    sched, speakers = select(SPEC, after.sched)
    after = after.dispatched(sched, speakers, at=1, step=5)
    steps += [step(4, "reset"), step(5, "start", dispatched=["S"], at=1)]
    messages.append(StoredMessage(4, 5, body("user", "again"), True))
    cursor = cursor_from_log(run_log(steps, messages, after), SPEC)
    assert cursor.dispatches == {"S": (1,)}
    assert cursor.origin == 4


def test_an_import_step_replaces_the_dispatch_points_with_the_imported_ones() -> None:
    steps = [
        step(1, "start", dispatched=["S"], at=1),
        step(2, "import", dispatches={"A": [0, 3], "B": [2]}),
        step(3, "complete", "A", dispatched=["C"], at=4),
    ]
    cursor = cursor_from_log(run_log(steps, [], Cursor(initial(SPEC))), SPEC)
    assert cursor.dispatches == {"A": (0, 3), "B": (2,), "C": (4,)}


# -- plan -----------------------------------------------------------------------------------------


def test_plan_attributes_each_message_to_the_completion_that_added_it() -> None:
    steps, messages, head = first_run()
    at = plan(run_log(steps, messages, head), SPEC, PEOPLE)
    assert [(e.body["source"], e.published, e.completes) for e in at.entries] == [
        ("user", True, None),
        ("S", True, "S"),
        ("A", False, "A"),
        ("A", True, "A"),
    ]


def test_plan_buffers_follow_the_buffer_rule_with_the_in_flight_node_deferred() -> None:
    steps, messages, head = first_run()
    at = plan(run_log(steps, messages, head), SPEC, PEOPLE)
    assert at.cursor == head
    assert at.buffers == {
        "S": ((3,), ()),  # after its dispatch at 1: A's answer (its own answer and A's thought are not)
        "A": ((), ()),
        "B": ((0, 1), (3,)),  # in flight: its input, and A's answer waiting behind its turn
        "C": ((0, 1, 3), ()),
    }


def test_plan_after_a_reset_starts_the_thread_at_the_new_origin() -> None:
    steps, messages, _ = first_run()
    after = Cursor.fresh(initial(SPEC), origin=4).new_round(0)
    sched, speakers = select(SPEC, after.sched)
    after = after.dispatched(sched, speakers, at=1, step=5)
    steps += [step(4, "reset"), step(5, "start", dispatched=["S"], at=1)]
    messages.append(StoredMessage(4, 5, body("user", "again"), True))
    at = plan(run_log(steps, messages, after), SPEC, PEOPLE)
    assert [e.body["content"] for e in at.entries] == ["again"]
    # S is in flight with the new task as its input; the others hear only what came after the reset.
    assert at.buffers == {"S": ((0,), ()), "A": ((0,), ()), "B": ((0,), ()), "C": ((0,), ())}


def test_plan_attributes_an_imported_threads_published_messages_to_their_source() -> None:
    imported = Cursor(initial(SPEC))
    steps = [step(1, "import", dispatches={"S": [1]})]
    messages = [
        StoredMessage(0, 1, body("user", "go"), True),
        StoredMessage(1, 1, body("S"), True),
        StoredMessage(2, 1, {"type": "ThoughtEvent", "source": "A", "content": "hmm"}, False),
    ]
    at = plan(run_log(steps, messages, imported), SPEC, PEOPLE)
    assert [e.completes for e in at.entries][1:] == ["S", None]
    assert at.buffers["S"] == ((), ())  # its own imported answer is not in its buffer
    assert at.buffers["A"] == ((0, 1), ())


# -- team_state ------------------------------------------------------------------------------------


def test_team_state_writes_plain_graphflow_keys_with_in_flight_nodes_first_in_ready() -> None:
    steps, messages, head = first_run()
    agent_states = {p: {"turn": i} for i, p in enumerate(PEOPLE)}
    at = plan(run_log(steps, messages, head), SPEC, PEOPLE)
    state = at.team_state("r1", "GraphManager", agent_states, graph_fingerprint="fp")
    manager = state["agent_states"]["GraphManager"]
    full = head.sched.to_json()
    assert state["type"] == "TeamState"
    assert manager["ready"] == ["B", "C"]  # B in flight, then the ready queue
    assert manager["remaining"] == full["remaining"]
    assert manager["enqueued_any"] == full["enqueued_any"]
    assert manager["current_turn"] == head.sched.turn
    assert manager["message_thread"] == [m.body for m in messages]
    assert manager["graphflow_durable"] == head.extension("r1", graph_fingerprint="fp")
    assert manager["graphflow_durable"]["status"] == "interrupted"
    assert manager["graphflow_durable"]["keys"] == {"B": "r1/B/2"}


def test_team_state_gives_each_participant_its_agent_state_and_rebuilt_buffers() -> None:
    steps, messages, head = first_run()
    agent_states = {p: {"turn": i} for i, p in enumerate(PEOPLE)}
    state = plan(run_log(steps, messages, head), SPEC, PEOPLE).team_state("r1", "GraphManager", agent_states)
    b = state["agent_states"]["B"]
    assert b["type"] == "ChatAgentContainerState"
    assert b["agent_state"] == {"turn": 2}
    assert b["message_buffer"] == [messages[0].body, messages[1].body]
    assert b["deferred_buffer"] == [messages[3].body]
    assert state["agent_states"]["C"]["message_buffer"] == [messages[i].body for i in (0, 1, 3)]
    assert set(state["agent_states"]) == {*PEOPLE, "GraphManager"}


def test_team_state_of_a_stopped_round_keeps_its_stop_reason() -> None:
    steps, messages, head = first_run()
    stopped = head.answered("B", answer(head.sched, "B")).ended(answer(head.sched, "B"), stopped=True)
    at = plan(run_log(steps, messages, stopped), SPEC, PEOPLE)
    ext = at.team_state("r1", "M", {p: {} for p in PEOPLE}, stop_reason="max turns")["agent_states"]["M"][
        "graphflow_durable"
    ]
    assert ext["status"] == "stopped"
    assert ext["stop_reason"] == "max turns"
