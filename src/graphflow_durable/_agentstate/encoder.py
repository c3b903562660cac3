"""Agent states written as splices of their JSON text, with whole snapshots often enough to keep
reads bounded.

An agent whose saved state grows every turn (a model context) would otherwise cost O(history)
bytes per commit. :class:`StateLog` remembers, per node, the JSON text of the last state this
writer committed (``_model.codec.state_text``), and stores the next one as a splice of that text
(``textdelta``): the region that changed, in which every message of the run that the state
repeats (the context keeps what the agent heard and said) is a reference to the message log. Once
the splices written since the last whole snapshot add up to that snapshot's stored size (or number
``MAX_DELTAS``), it writes a whole snapshot again: a splice of the empty text (``base_step`` 0),
its message references kept. So the bytes written per turn stay within about twice what changed,
net of the messages, and resuming a node reads at most about two snapshots' worth of rows. A state
equal to the last one committed writes no row at all: a node's state is its latest row.

The texts are not canonical JSON (``state_text`` keeps the value's key order, and is much faster
than the canonical encoder on large states), so a splice is only ever written against a text this
writer wrote itself: after a (re)load the log forgets every node, and each node's next state is a
whole snapshot. The flow also clears the log after a failed commit.

This module and :mod:`~graphflow_durable._agentstate.decoder` are the one home of the row format
(docs/state-format.md, "In the database"): each row's body is encoded here, once, as the JSON text
the store writes verbatim, and folded back there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphflow_durable._agentstate.textdelta import MIN_REFERENCE, Rope, common_ends, splice, with_references
from graphflow_durable._model.codec import dumps, state_text
from graphflow_durable._model.records import AgentStateRecord, AgentStateRow, MessageRecord

__all__ = ["MAX_DELTAS", "StateLog", "state_row"]

#: Splices after which a whole snapshot is written even if they are small (bounds resume work).
MAX_DELTAS = 256
#: How many of the run's latest long messages a state may reference without a snapshot scan.
_WINDOW = 256
#: How many of them one state write searches for.
_CANDIDATES = 64


@dataclass
class _Node:
    step: int  # the step of the node's latest row
    text: str  # the state's text (``state_text``) in that row
    rope: Rope  # the same text as pieces, message references kept
    seen: int  # the run's message count then: newer messages are the candidates for references
    snapshot_size: int  # stored characters of the last whole snapshot
    delta_size: int = 0  # stored characters of the splices since
    deltas: int = 0


class StateLog:
    """Per node, the last committed state, to write the next one as a splice."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._recent: deque[tuple[int, str, str | None]] = deque(maxlen=_WINDOW)  # (seq, content, source)
        self._encoded: dict[int, str] = {}  # seq -> JSON encoding of the content, made on demand
        self._count = 0

    def clear(self) -> None:
        """Forget everything: the next state of every node is written whole."""
        self._nodes.clear()
        self._recent.clear()
        self._encoded.clear()
        self._count = 0

    def prime(self, message_count: int) -> None:
        """Start over at a run loaded from the store, which holds ``message_count`` messages: the
        next state of every node is written whole."""
        self.clear()
        self._count = message_count

    def encode(
        self, records: Sequence[AgentStateRecord], messages: Sequence[MessageRecord], step: int
    ) -> list[AgentStateRow]:
        """The rows to store for a commit at ``step`` that also appends ``messages``: each one's
        body is its final JSON text, which the store writes as it is.

        It updates what is remembered as if the commit succeeds; call :meth:`clear` if it fails.
        """
        self._note(messages)
        stored: list[AgentStateRow] = []
        for record in records:
            text = state_text(record.body, where=f"agent_states/{record.node}", node=record.node)
            last = self._nodes.get(record.node)
            if last is not None and text == last.text:
                continue  # unchanged: the node's latest row still holds it
            stored.append(self._encode_one(record.node, text, last, step))
        return stored

    def _encode_one(self, node: str, text: str, last: _Node | None, step: int) -> AgentStateRow:
        since = -1 if last is None else last.seen
        newer = [entry for entry in self._recent if entry[0] >= since][-_CANDIDATES:]
        candidates = [(seq, self._encoding(seq, content, source)) for seq, content, source in newer]
        if last is None:
            rope = Rope.of(with_references(text, candidates), self._resolve)
            return self._snapshot(node, text, rope, step)
        at, keep = common_ends(last.text, text)
        cut = len(last.text) - at - keep
        pieces = with_references(text[at : len(text) - keep], candidates)
        last.rope.splice(at, cut, pieces, self._resolve)
        patch = dumps(splice(at, cut, pieces))
        if last.deltas >= MAX_DELTAS or last.delta_size + len(patch) >= last.snapshot_size:
            return self._snapshot(node, text, last.rope, step)
        stored = AgentStateRow(node, patch, base_step=last.step)
        last.step, last.text, last.seen = step, text, self._count
        last.delta_size += len(patch)
        last.deltas += 1
        return stored

    def _snapshot(self, node: str, text: str, rope: Rope, step: int) -> AgentStateRow:
        body = dumps(splice(0, 0, rope.pieces()))
        self._nodes[node] = _Node(step, text, rope, self._count, len(body))
        return AgentStateRow(node, body, base_step=0)

    def _note(self, messages: Sequence[MessageRecord]) -> None:
        for message in messages:
            content = message.body.get("content") if isinstance(message.body, Mapping) else None
            if isinstance(content, str) and len(content) >= MIN_REFERENCE:
                if len(self._recent) == self._recent.maxlen:
                    self._encoded.pop(self._recent[0][0], None)
                source = message.body.get("source")
                self._recent.append((message.seq, content, source if isinstance(source, str) else None))
            self._count = max(self._count, message.seq + 1)

    def _encoding(self, seq: int, content: str, source: str | None) -> str:
        """The JSON encoding of a message's content (what a reference stands for), made once."""
        encoding = self._encoded.get(seq)
        if encoding is None:
            encoding = self._encoded[seq] = dumps(content, where=f"messages/{seq}/body/content", node=source)
        return encoding

    def _resolve(self, seq: int) -> str:
        return self._encoded[seq]


def state_row(record: AgentStateRecord) -> AgentStateRow:
    """A record given as a value (a whole state, or a delta its caller made) as the row to store:
    its body as canonical JSON text.

    Raises:
        NotSerializableError: naming the value in ``record.body`` that JSON cannot hold.
    """
    return AgentStateRow(
        record.node,
        dumps(record.body, where=f"agent_states/{record.node}", node=record.node),
        record.base_step,
    )
