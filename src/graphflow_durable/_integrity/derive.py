"""What a saved state should hold, derived from its message thread and the graph.

The scheduler state comes from :func:`graphflow_durable.scheduler.replay` -- the same rules the
durable manager runs live -- so repair and live execution cannot disagree. Around it this module
works out what replay alone cannot know: whether the batch after the last answer had already
been dispatched when the state was saved, every node's dispatch points, the round and batch
boundaries, and each participant's buffer (docs/state-format.md, "Buffer rule").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage

from graphflow_durable._integrity.read import Parsed
from graphflow_durable._model.buffers import Buffers, LogEntry, participant_buffers
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.records import ENDED_STATUSES, RUN_STATUSES
from graphflow_durable.scheduler import GraphSpec, SchedulerState, replay, select

__all__ = ["Derived", "derive"]


@dataclass(frozen=True)
class Derived:
    """The state the thread explains.

    Attributes:
        sched: the scheduler state (in-flight nodes restored, ``turn`` from the saved state).
        replayed: the scheduler state replay left, before the saved batch was re-selected.
        dispatches: per node, the thread lengths at which it was dispatched, oldest first.
        finished: the thread ends at the graph's natural end and nothing was dispatched after it.
        round_start: thread index where the current round begins.
        batch_start: thread index where the current (or last) batch begins.
        buffers: per participant, its message buffer and deferred buffer.
    """

    sched: SchedulerState
    replayed: SchedulerState
    dispatches: Mapping[str, tuple[int, ...]]
    finished: bool
    round_start: int
    batch_start: int
    buffers: Mapping[str, Buffers]


def derive(spec: GraphSpec, p: Parsed) -> Derived:
    """Derive the state ``p``'s thread explains. Raises ``ReplayError`` if it explains nothing."""
    thread = p.thread or []
    result = replay(spec, thread)
    points = {name: list(at) for name, at in result.dispatches.items()}
    sched = result.state
    if not sched.in_flight and sched.ready and _saved_while_dispatched(p):
        # GraphFlow drains ready into its (unsaved) active speakers right after the last answer:
        # the saved state had already dispatched the batch replay leaves in ready.
        sched, speakers = select(spec, sched)
        for name in speakers:
            points.setdefault(name, []).append(len(thread))
    turn = p.ext_sched.turn if p.ext_sched is not None else (p.turn or 0)
    sched = replace(sched, turn=max(turn, 0))
    finished = (
        not sched.in_flight
        and bool(result.finished_at)
        and not any(isinstance(m, BaseChatMessage) for m in thread[result.finished_at[-1] + 1 :])
    )
    round_start = _round_start(spec, thread, result.finished_at, finished)
    if sched.in_flight:
        batch_start = points[sched.in_flight[0]][-1]
    else:
        batch_start = max([round_start, *(d for ds in points.values() for d in ds if d >= round_start)])
    dispatches = {n: tuple(v) for n, v in sorted(points.items())}
    entries = [
        LogEntry(dump, isinstance(m, BaseChatMessage), m.source if isinstance(m, BaseChatMessage) else None)
        for dump, m in zip(p.thread_dumps, thread, strict=True)
    ]
    buffers = participant_buffers(
        entries, p.participants, {n: v[-2:] for n, v in dispatches.items()}, sched.in_flight
    )
    return Derived(sched, result.state, dispatches, finished, round_start, batch_start, buffers)


def _saved_while_dispatched(p: Parsed) -> bool:
    """Whether the state says the batch after the last answer was already dispatched."""
    if p.ext_sched is not None:
        return bool(p.ext_sched.in_flight)
    return p.legacy and p.ready == []


def _round_start(
    spec: GraphSpec,
    thread: Sequence[BaseAgentEvent | BaseChatMessage],
    finished_at: Sequence[int],
    finished: bool,
) -> int:
    """Where the current round begins: its task messages after the previous natural end.

    Best effort for plain states: a round stopped by a termination condition leaves no trace in
    the thread, so such a round is counted from its task (or the last natural end).
    """
    ends = list(finished_at[:-1] if finished else finished_at)
    boundary = ends[-1] + 1 if ends else 0
    start = boundary
    previous_was_task = False
    for index in range(boundary, len(thread)):
        message = thread[index]
        is_task = isinstance(message, BaseChatMessage) and message.source not in spec.edges
        if is_task and not previous_was_task:
            start = index
        previous_was_task = is_task
    return start


def extension(p: Parsed, d: Derived, graph_fingerprint: str | None) -> dict[str, Any]:
    """The ``graphflow_durable`` section for the repaired state.

    Values the thread cannot decide (run id, attempts, origin, a consistent status) are kept from a
    durable state; a plain state gets the defaults.
    """
    old: Mapping[str, Any] = p.ext or {}
    flying = d.sched.in_flight
    status = old.get("status")
    if d.finished or (status == "finished" and not flying):
        status = "finished"
    elif not flying and (status == "stopped" or (p.legacy and p.thread_dumps)):
        # At rest with work left: a plain GraphFlow state saved between runs was saved after a stop
        # (termination condition, max turns); GraphFlow reset the condition then, and run() with no
        # task continues the graph. A stopped round does exactly that.
        status = "stopped"
    elif status not in RUN_STATUSES or status in ENDED_STATUSES:
        status = "interrupted"
    attempts = old.get("attempts")
    if not (isinstance(attempts, Mapping) and set(attempts) == set(flying) and _positive(attempts)):
        attempts = dict.fromkeys(flying, 1)
    steps = old.get("dispatch_step")
    steps = {n: s for n, s in steps.items() if n in flying} if isinstance(steps, Mapping) else {}
    keys = old.get("keys")
    keys = (
        {n: k for n, k in keys.items() if n in flying and isinstance(k, str)}
        if isinstance(keys, Mapping)
        else {}
    )
    if graph_fingerprint is None and isinstance(old.get("graph_fingerprint"), str):
        graph_fingerprint = old["graph_fingerprint"]
    elif graph_fingerprint is None and p.legacy:
        graph_fingerprint = ""
    cursor = Cursor(
        sched=d.sched,
        origin=_kept_index(old.get("origin"), 0, None),
        round_start=_kept_index(old.get("round_start"), d.round_start, len(p.thread_dumps)),
        batch_start=d.batch_start,
        finished=status in ("finished", "stopped"),
        stopped=status == "stopped",
        keys=keys,
        dispatches={n: tuple(v[-2:]) for n, v in d.dispatches.items()},
        attempts=dict(attempts),
        dispatch_step=steps,
    )
    run_id = old.get("run_id") if isinstance(old.get("run_id"), str) else None
    return cursor.extension(run_id, status=status, graph_fingerprint=graph_fingerprint)


def _positive(values: Mapping[str, Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values.values())


def _kept_index(value: Any, default: int, size: int | None) -> int:
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 0
        and (size is None or value <= size)
    ):
        return value
    return default
