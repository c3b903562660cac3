"""The participant buffer rule: what each participant has heard since it last spoke.

Pure and shared: the durable manager rebuilds buffers from the stored log with it, and the repair
engine rebuilds them from a legacy thread with it. See docs/state-format.md, "Buffer rule".
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Buffers", "LogEntry", "buffer_indexes", "participant_buffers"]


@dataclass(frozen=True)
class LogEntry:
    """One message of a thread.

    Attributes:
        body: the message dump.
        published: whether it was broadcast to the participants.
        completes: the node whose answer added it, or ``None`` for user input.
    """

    body: Mapping[str, Any]
    published: bool
    completes: str | None


@dataclass(frozen=True)
class Buffers:
    """A participant's input buffer, and for an in-flight one what it hears after its turn."""

    buffer: tuple[Mapping[str, Any], ...]
    deferred: tuple[Mapping[str, Any], ...] = ()


def buffer_indexes(
    entries: Sequence[LogEntry],
    participants: Sequence[str],
    dispatches: Mapping[str, Sequence[int]],
    in_flight: Collection[str],
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per participant, the thread indexes of its buffer and of its deferred messages.

    ``dispatches[p]`` lists the thread lengths at which ``p`` was asked to speak, oldest first.
    A participant hears every published message except its own; its buffer empties when its turn
    starts. Messages published while it speaks wait behind its turn, so after a turn dispatched at
    ``d`` the buffer holds the published messages at indexes ``>= d``. For an in-flight
    participant, its input is what was published between its previous dispatch and ``d``, and
    what came at ``>= d`` is deferred until after the turn.
    """
    published = [i for i, entry in enumerate(entries) if entry.published]
    result: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for name in participants:
        points = dispatches.get(name, ())
        if name in in_flight and points:
            cut = points[-1]
            since = points[-2] if len(points) > 1 else 0
        else:
            cut = None
            since = points[-1] if points else 0
        tail = [i for i in published[bisect_left(published, since) :] if entries[i].completes != name]
        if cut is None:
            result[name] = (tuple(tail), ())
        else:
            result[name] = (tuple(i for i in tail if i < cut), tuple(i for i in tail if i >= cut))
    return result


def participant_buffers(
    entries: Sequence[LogEntry],
    participants: Sequence[str],
    dispatches: Mapping[str, Sequence[int]],
    in_flight: Collection[str],
) -> dict[str, Buffers]:
    """Rebuild every participant's buffer from the thread (see :func:`buffer_indexes`)."""
    return {
        name: Buffers(tuple(entries[i].body for i in buffer), tuple(entries[i].body for i in deferred))
        for name, (buffer, deferred) in buffer_indexes(entries, participants, dispatches, in_flight).items()
    }
