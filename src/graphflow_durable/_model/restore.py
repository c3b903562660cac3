"""From a run's stored log to the team's state at the store's head.

Pure: reads a :class:`RunLog`, knows the saved-state format (docs/state-format.md), does no I/O.
The flow uses :func:`plan` both to render ``save_state()`` (JSON) and to load a resumed team
(message objects created once, shared by every participant's buffer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphflow_durable._model.buffers import LogEntry, buffer_indexes
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.records import RunLog, StepKind, StoredMessage
from graphflow_durable.scheduler import GraphSpec, initial

__all__ = ["Plan", "cursor_from_log", "plan"]


def cursor_from_log(log: RunLog, spec: GraphSpec) -> Cursor:
    """The head step's cursor, with every node's last dispatches gathered from the step log."""
    dispatches: dict[str, tuple[int, ...]] = {}
    for step in log.steps:
        if step.kind == StepKind.RESET:
            dispatches = {}
        if step.kind == StepKind.IMPORT:
            dispatches = {n: tuple(v) for n, v in step.data.get("dispatches", {}).items()}
        at = step.data.get("at")
        for name in step.data.get("dispatched", ()):
            dispatches[name] = (*dispatches.get(name, ())[-1:], int(at or 0))
    if log.scheduler is None:
        return Cursor.fresh(initial(spec))
    return Cursor.from_json(log.scheduler, spec, dispatches)


@dataclass(frozen=True)
class Plan:
    """The team at the store's head.

    Attributes:
        cursor: the manager's cursor.
        entries: the current thread (message dumps, published flags, which node added each).
        buffers: per participant, thread indexes of its buffer and of its deferred messages.
    """

    cursor: Cursor
    entries: Sequence[LogEntry]
    buffers: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]

    def team_state(
        self,
        run_id: str,
        manager_name: str,
        agent_states: Mapping[str, Mapping[str, Any]],
        graph_fingerprint: str | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """The state as ``save_state()`` returns it (JSON; see docs/state-format.md)."""
        states: dict[str, Any] = {}
        for name, (buffer, deferred) in self.buffers.items():
            states[name] = {
                "type": "ChatAgentContainerState",
                "version": "1.0.0",
                "agent_state": agent_states[name],
                "message_buffer": [self.entries[i].body for i in buffer],
                "deferred_buffer": [self.entries[i].body for i in deferred],
            }
        states[manager_name] = {
            "message_thread": [e.body for e in self.entries],
            **self.cursor.sched.plain_view(),
            "graphflow_durable": self.cursor.extension(
                run_id, graph_fingerprint=graph_fingerprint, stop_reason=stop_reason
            ),
        }
        return {"type": "TeamState", "version": "1.0.0", "agent_states": states}

    def current_round(self) -> list[tuple[Mapping[str, Any], bool]]:
        """The current round's messages in order: each one's dump and whether it was user input (it
        completes no node)."""
        return [(e.body, e.completes is None) for e in self.entries[self.cursor.round_start :]]


def plan(log: RunLog, spec: GraphSpec, participants: Sequence[str]) -> Plan:
    """Everything needed to put a team at the head of ``log``."""
    cursor = cursor_from_log(log, spec)
    completes = {s.seq: s.node for s in log.steps if s.kind == StepKind.COMPLETE}
    imported = {s.seq for s in log.steps if s.kind == StepKind.IMPORT}
    nodes = set(participants)

    def added_by(m: StoredMessage) -> str | None:
        if m.step_seq not in imported:
            return completes.get(m.step_seq)
        # An imported thread has no completion steps: its published messages from a node are that
        # node's answers; the rest (the task, user input) were added by nobody.
        source = str(m.body.get("source"))
        return source if m.published and source in nodes else None

    entries = [LogEntry(m.body, m.published, added_by(m)) for m in log.messages if m.seq >= cursor.origin]
    buffers = buffer_indexes(entries, participants, cursor.dispatches, cursor.sched.in_flight)
    return Plan(cursor, entries, buffers)
