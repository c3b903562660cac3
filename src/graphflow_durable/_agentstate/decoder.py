"""Agent-state rows read back: each node's current state folded from its latest rows.

The other half of :mod:`graphflow_durable._agentstate.encoder`; the row format is described in
docs/state-format.md ("In the database"). Pure: the store reads the rows and the run's messages
and hands them here; a log that does not fold is reported as :class:`StoreCorruptError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from graphflow_durable._agentstate import jsondelta, textdelta
from graphflow_durable._agentstate.textdelta import Rope
from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.records import StoredMessage
from graphflow_durable.errors import StoreCorruptError

__all__ = ["fold_states", "references"]


def references(thread: Sequence[StoredMessage]) -> Callable[[int], str]:
    """What a splice's reference to message ``seq`` of ``thread`` stands for: its content, encoded.

    A message that is missing or has no text content raises ``KeyError``/``TypeError``, which
    :func:`fold_states` reports as a corrupt log.
    """
    by_seq = {m.seq: m for m in thread}

    def message_text(seq: int) -> str:
        content = by_seq[seq].body["content"]
        if not isinstance(content, str):
            raise TypeError(f"message {seq} referenced by an agent state has no text content")
        return dumps(content)

    return message_text


def fold_states(
    run_id: str, rows: Iterable[Any], message_text: Callable[[int], str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Each node's current state from its latest whole row and the delta rows after it.

    ``rows`` are (node, step_seq, base_step, body) ordered by node and step, ``body`` the stored
    JSON text; ``message_text(seq)`` is the text a message reference of a splice stands for (see
    :func:`references`). Returns the states and the step of each node's latest row. A delta whose
    base is not the row before it or of the other kind, or a splice that does not fit, means the
    log is corrupt: :class:`StoreCorruptError`, naming the run, node and steps.
    """
    current: dict[str, Any | Rope] = {}
    steps: dict[str, int] = {}
    for node, step_seq, base_step, body in rows:
        value = loads(body)
        where = f"run {run_id}: the state of node {node!r} saved at step {step_seq}"
        try:
            if base_step is None:
                current[node] = value
            elif base_step == 0:
                current[node] = Rope.of(value["put"], message_text)
            elif steps.get(node) != base_step:
                raise StoreCorruptError(
                    f"{where} is a delta against step {base_step}, but the row before it is at step "
                    f"{steps.get(node)}; the agent-state log is corrupt (was the database edited by hand?)",
                    run_id=run_id,
                    node=node,
                    step=step_seq,
                )
            elif textdelta.is_splice(value) != isinstance(current[node], Rope):
                # Splices (schema 4) follow a splice of the empty text; structural deltas (before
                # schema 4) follow a whole value. A writer never mixes the two in one chain.
                raise StoreCorruptError(
                    f"{where} is a {'splice' if textdelta.is_splice(value) else 'structural delta'} "
                    f"against a row of the other kind; the agent-state log is corrupt "
                    "(was the database edited by hand?)",
                    run_id=run_id,
                    node=node,
                    step=step_seq,
                )
            elif isinstance(rope := current[node], Rope):
                rope.splice(value["at"], value["cut"], value["put"], message_text)
            else:
                current[node] = jsondelta.apply(current[node], value)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptError(
                f"{where} cannot be applied ({exc!r}); the agent-state log is corrupt "
                "(was the database edited by hand?)",
                run_id=run_id,
                node=node,
                step=step_seq,
            ) from exc
        steps[node] = step_seq
    states = {}
    for node, state in current.items():
        if isinstance(state, Rope):
            try:
                states[node] = loads(state.text())
            except ValueError as exc:
                raise StoreCorruptError(
                    f"run {run_id}: the state of node {node!r} rebuilt from its rows up to step "
                    f"{steps[node]} is not JSON ({exc}); the agent-state log is corrupt",
                    run_id=run_id,
                    node=node,
                    step=steps[node],
                ) from exc
        else:
            states[node] = state
    return states, steps
