"""Agent states written as deltas, with whole snapshots often enough to keep reads bounded.

An agent whose saved state grows every turn (a model context) would otherwise cost O(history)
bytes per commit. :class:`StateLog` remembers, per node, the last state this writer committed,
and sends the next one as a delta against it -- until the deltas written since the last whole
snapshot add up to that snapshot's size, when it writes a whole snapshot again. So the bytes
written per turn stay within about twice the size of what changed, and resuming a node reads at
most about two snapshots' worth of rows.

The remembered states are only valid while this process's view equals the store's head: the flow
clears or primes the log whenever it (re)loads a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _jsondelta
from ._codec import dumps, loads
from .store import AgentStateRecord

__all__ = ["StateLog"]


@dataclass(frozen=True)
class _Last:
    step: int
    text: str
    body: Any
    snapshot_size: int
    delta_bytes: int


class StateLog:
    """Per node, the last committed state, to write the next one as a delta."""

    def __init__(self) -> None:
        self._last: dict[str, _Last] = {}

    def clear(self) -> None:
        """Forget everything: the next state of every node is written whole."""
        self._last.clear()

    def prime(self, states: Mapping[str, Mapping[str, Any]], steps: Mapping[str, int]) -> None:
        """Remember the states a run was loaded with (the store's current ones)."""
        self._last = {
            node: _Last(
                steps[node], text := dumps(body, where=f"agent_states/{node}"), loads(text), len(text), 0
            )
            for node, body in states.items()
            if node in steps
        }

    def encode(
        self, records: Sequence[AgentStateRecord], step: int
    ) -> tuple[list[AgentStateRecord], dict[str, _Last]]:
        """The records to store for a commit at ``step``, and what to remember once it succeeded."""
        stored: list[AgentStateRecord] = []
        pending: dict[str, _Last] = {}
        for record in records:
            text = dumps(record.body, where=f"agent_states/{record.node}")
            last = self._last.get(record.node)
            if last is not None and text == last.text:
                continue  # unchanged: the node's latest row still holds it
            body = loads(text)  # a private copy: the agent may mutate what it returned
            if last is not None:
                patch = _jsondelta.diff(last.body, body)
                size = len(dumps(patch))
                if last.delta_bytes + size < last.snapshot_size:
                    stored.append(AgentStateRecord(record.node, patch, base_step=last.step))
                    pending[record.node] = _Last(
                        step, text, body, last.snapshot_size, last.delta_bytes + size
                    )
                    continue
            stored.append(AgentStateRecord(record.node, body))
            pending[record.node] = _Last(step, text, body, len(text), 0)
        return stored, pending

    def accept(self, pending: Mapping[str, _Last]) -> None:
        """The commit holding ``pending``'s states succeeded: remember them."""
        self._last.update(pending)
