"""Row checksums (schema version 6): what a commit stores beside each step, message and agent-state
row, and what a read recomputes, so that a row changed outside the package (a flipped byte on disk,
a hand edit, a row moved to another position) is refused instead of fed to an agent.

Pure: no database access. A checksum is CRC-32 (``zlib.crc32``) over the row's identifying keys
(run, step, message seq or node) and its content columns, so a body copied or moved to another
row fails as surely as a changed one. CRC-32 detects every change of up to 32 consecutive bits and
misses a random change with probability 2**-32; it guards against accidents, not against someone
who can write the database (they could rewrite the checksum too).

A step's checksum is 64 bits: the high half is the CRC of its ``scheduler`` text alone, the low half
the CRC of everything else *and* that high half. A resume reads the scheduler of the head step only,
so it can still check every step row it reads (the low half) without reading every scheduler.

Rows written before version 6 have a NULL checksum: they are not checked (see docs/state-format.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphflow_durable._model.codec import dumps
from graphflow_durable.errors import StoreCorruptError

__all__ = [
    "CALLS",
    "CALL_SUMMED",
    "MESSAGES",
    "STATES",
    "STEPS",
    "Damage",
    "call_sum",
    "message_sum",
    "run_sum",
    "state_sum",
    "step_sum",
    "step_matches",
    "scheduler_matches",
    "corrupt",
]

CALLS = "graphflow_call_records"
MESSAGES = "graphflow_messages"
STATES = "graphflow_agent_states"
STEPS = "graphflow_steps"

_LOW = 0xFFFF_FFFF


def _b(text: str) -> bytes:
    # surrogatepass: never fails, whatever the text holds (the encoder refuses lone surrogates
    # before a commit, but a checksum must not be the place that raises on them)
    return text.encode("utf-8", "surrogatepass")


def _s(text: str | None) -> str:
    """A text key, length-prefixed so that no two rows' keys run together alike."""
    return "-" if text is None else f"{len(text)}:{text}"


def _signed(value: int) -> int:
    """A 64-bit unsigned value as the signed BIGINT both backends store."""
    return value - (1 << 64) if value >= (1 << 63) else value


def message_sum(run_id: str, seq: int, step_seq: int, published: bool, body: str) -> int:
    """The checksum of a message row."""
    key = f"{_s(run_id)}|{seq}|{step_seq}|{1 if published else 0}|"
    return zlib.crc32(_b(body), zlib.crc32(_b(key)))


def state_sum(run_id: str, node: str, step_seq: int, base_step: int | None, body: str) -> int:
    """The checksum of an agent-state row."""
    key = f"{_s(run_id)}|{_s(node)}|{step_seq}|{base_step}|"
    return zlib.crc32(_b(body), zlib.crc32(_b(key)))


#: The columns of a call record its checksum covers after the run id, in order (version 12): every
#: column but ``created_at``, the ``discarded`` flag included (a record flipped back to live by damage
#: would be replayed).
CALL_SUMMED = (
    "seq",
    "turn_key",
    "node",
    "step",
    "attempt",
    "kind",
    "name",
    "ident",
    "fingerprint",
    "outcome",
    "prompt_tokens",
    "completion_tokens",
    "discarded",
)


def _field(value: Any) -> str:
    """A call record's key or number as checksummed: ``-`` for ``None``, a flag as 0/1."""
    if value is None or isinstance(value, str):
        return _s(value)
    return str(int(value))


def call_sum(run_id: str, row: Mapping[Any, Any]) -> int:
    """The checksum of a call record (a row or a mapping with its columns): the columns
    :data:`CALL_SUMMED` as its keys, then its ``result`` text."""
    key = "|".join(_field(row[column]) for column in CALL_SUMMED)
    return zlib.crc32(_b(_s(row["result"])), zlib.crc32(_b(f"{_s(run_id)}|{key}|")))


def _step_low(run_id: str, seq: int, kind: str, node: str | None, data: str, high: int) -> int:
    key = f"{_s(run_id)}|{seq}|{_s(kind)}|{_s(node)}|{high}|"
    return zlib.crc32(_b(data), zlib.crc32(_b(key)))


def step_sum(run_id: str, seq: int, kind: str, node: str | None, data: str, scheduler: str) -> int:
    """The checksum of a step row (high half: the scheduler's CRC; low half: the rest and the high half)."""
    high = zlib.crc32(_b(scheduler))
    return _signed((high << 32) | _step_low(run_id, seq, kind, node, data, high))


def step_matches(stored: int, run_id: str, seq: int, kind: str, node: str | None, data: str) -> bool:
    """Whether a step row without its scheduler text matches its stored checksum (the low half)."""
    unsigned = stored & ((1 << 64) - 1)
    return _step_low(run_id, seq, kind, node, data, unsigned >> 32) == unsigned & _LOW


def scheduler_matches(stored: int, scheduler: str) -> bool:
    """Whether a step's scheduler text matches the high half of its stored checksum."""
    return zlib.crc32(_b(scheduler)) == (stored & ((1 << 64) - 1)) >> 32


def run_sum(fields: Mapping[str, Any]) -> int:
    """The checksum of a run object in an export document (its fields as JSON values).

    The run row has no stored checksum (a commit changes it every time); an export carries this one
    so that an edited run object (its status, task, graph...) is found when the document is imported.
    """
    return zlib.crc32(_b(dumps(fields, where="run")))


def add_sums(
    run_id: str, step: dict[str, Any], messages: list[dict[str, Any]], states: list[dict[str, Any]]
) -> None:
    """Set ``checksum`` in the encoded rows of one commit (as ``commit.encode_commit`` builds them)."""
    step["checksum"] = step_sum(
        run_id, step["seq"], step["kind"], step["node"], step["data"], step["scheduler"]
    )
    for row in messages:
        row["checksum"] = message_sum(run_id, row["seq"], row["step_seq"], row["published"], row["body"])
    for row in states:
        row["checksum"] = state_sum(run_id, row["node"], row["step_seq"], row["base_step"], row["body"])


@dataclass(frozen=True)
class Damage:
    """A stored row whose content no longer matches its checksum, or (``problem``) a gap in a run's
    log: a step or message row missing, or rows beyond the head or message count of the run's row.

    Attributes:
        run_id: the run.
        table: ``"graphflow_steps"``, ``"graphflow_messages"``, ``"graphflow_agent_states"`` or
            ``"graphflow_call_records"``.
        step: the step the row belongs to (a step row: its own seq; a missing message: the step of
            the message after the gap, else of the one before it, else 0; a call record: the step
            that dispatched its turn).
        seq: a message row's seq in the thread, or a call record's seq (``None`` for other rows).
        node: an agent-state row's node, or a step row's or call record's node (``None`` if it has none).
        column: what does not match, when known: ``"scheduler"`` for a step whose scheduler text
            changed, else ``None`` (the row's keys or content).
        problem: for a gap, what is wrong in words (``"step 4 is missing (steps 1..6 expected)"``);
            ``None`` for a row that does not match its checksum.
    """

    run_id: str
    table: str
    step: int
    seq: int | None = None
    node: str | None = None
    column: str | None = None
    problem: str | None = None

    @property
    def row(self) -> str:
        """The row in words: ``"message 3 (step 2)"``, ``"the state of node 'A' at step 4"``, ``"step 5"``."""
        if self.table == MESSAGES:
            return f"message {self.seq} (step {self.step})"
        if self.table == STATES:
            return f"the state of node {self.node!r} saved at step {self.step}"
        if self.table == CALLS:
            return f"call record {self.seq} (node {self.node!r}, step {self.step})"
        what = f"step {self.step}"
        return f"{what} (its scheduler state)" if self.column == "scheduler" else what

    def describe(self) -> str:
        """One line: the run, the row and its table (or the gap)."""
        if self.problem is not None:
            return f"run {self.run_id}: {self.problem}"
        return f"run {self.run_id}: {self.row} in {self.table} does not match its checksum"

    def as_dict(self) -> Mapping[str, Any]:
        """The damage as JSON-ready values (the CLI's ``--json`` line)."""
        return {
            "run_id": self.run_id,
            "table": self.table,
            "step": self.step,
            "seq": self.seq,
            "node": self.node,
            "column": self.column,
            "problem": self.problem,
        }


def corrupt(damage: Damage, url: str | None = None) -> StoreCorruptError:
    """The error a read raises for ``damage``: one line, what happened and what to do."""
    cause = (
        "the row was changed outside graphflow-durable (disk damage or a hand edit) and is corrupt"
        if damage.problem is None
        else "rows of the run's log were deleted, or its run row changed, outside graphflow-durable "
        "(a hand edit, or a partial restore)"
    )
    return StoreCorruptError(
        f"{damage.describe()}: {cause}; nothing was run from it; restore the database from a backup, "
        f"and run 'graphflow-durable runs verify {damage.run_id}' to list every damaged row",
        url=url,
        run_id=damage.run_id,
        node=damage.node,
        step=damage.step,
        table=damage.table,
        seq=damage.seq,
    )
