"""Recorded model and tool calls (schema version 12): :class:`CallRecords`, held by a store as
``store.calls``: record a call, read what a turn may replay, discard after a divergence, list and
sum a run's records.

A wrapper around a model client or a workbench (``graphflow_durable.recorded``) writes a record as
soon as its call returns, before the result reaches the agent, fenced by the driver's lease token:
a driver that lost its lease records nothing. The store never decodes a record's ``result`` (the
wrappers' JSON text) nor its ``fingerprint``; it numbers the run's records (``seq``), checksums each
row and checks the checksum whenever a row is read.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from graphflow_durable._model.codec import surrogate_problem
from graphflow_durable._model.records import CALL_KINDS, CALL_OUTCOMES, CallRecord, CallSummary
from graphflow_durable._storage.checksum import CALLS, Damage, call_sum, corrupt
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.lease import fenced
from graphflow_durable._storage.schema import call_records
from graphflow_durable._storage.sealing import PLAIN, Sealer
from graphflow_durable.errors import UsageError

__all__ = ["CallRecords", "call_row", "checked", "refuse_bad_record", "summarise"]

_C = call_records.c

#: The text fields of a record, in words (for the error that refuses one).
_TEXTS = {
    "run_id": "run id",
    "turn_key": "turn key",
    "node": "node",
    "kind": "kind",
    "name": "name",
    "ident": "call ordinal or id",
    "fingerprint": "fingerprint",
    "outcome": "outcome",
    "result": "result",
}
_NUMBERS = ("step", "attempt", "prompt_tokens", "completion_tokens")
#: The largest value of an INTEGER column on both backends (PostgreSQL's is 32 bits).
_INT_MAX = 2**31 - 1


def refuse_bad_record(record: CallRecord) -> None:
    """A :class:`UsageError` naming the first field of ``record`` the store cannot hold as given: an
    unknown kind or outcome, a text that is not text or holds a NUL or a lone surrogate (neither
    backend stores those alike), a step, attempt or token count that is not an INTEGER >= 0, a time
    that is not one, a live record without a result or a replayed one with one."""
    where = f"call record of run {record.run_id!r}"

    def bad(field: str, problem: str) -> UsageError:
        return UsageError(
            f"{where}: {problem}; nothing was recorded", run_id=str(record.run_id), option=field
        )

    for field, words in _TEXTS.items():
        text = getattr(record, field)
        if text is None and field == "result":
            continue
        if not isinstance(text, str):
            raise bad(field, f"the {words} must be text, not {type(text).__name__}")
        problem = "holds a NUL character" if "\x00" in text else surrogate_problem(text)
        if problem is not None:
            raise bad(field, f"the {words} is refused: {problem}")
    if record.kind not in CALL_KINDS:
        raise bad("kind", f"kind must be one of {', '.join(CALL_KINDS)}, not {record.kind!r}")
    if record.outcome not in CALL_OUTCOMES:
        raise bad("outcome", f"outcome must be one of {', '.join(CALL_OUTCOMES)}, not {record.outcome!r}")
    if (record.result is None) != (record.outcome == "replayed"):
        raise bad(
            "result",
            "a live record holds its result (JSON text), a replayed one none (the live record it "
            "replayed holds it)",
        )
    for field in _NUMBERS:
        value = getattr(record, field)
        if value is None and field.endswith("_tokens"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT_MAX:
            raise bad(
                field, f"{field.replace('_', ' ')} must be an integer from 0 to {_INT_MAX}, not {value!r}"
            )
    when = record.created_at
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not math.isfinite(when) or when < 0:
        raise bad("created_at", f"created_at must be epoch seconds, not {when!r}")


def call_row(
    record: CallRecord, *, run_id: str | None = None, sealer: Sealer | None = None
) -> dict[str, Any]:
    """The row of ``record`` (under ``run_id``, default its own), its result sealed by ``sealer``
    (if given), with its checksum over the stored text."""
    row: dict[str, Any] = {
        "run_id": record.run_id if run_id is None else run_id,
        "seq": record.seq,
        "turn_key": record.turn_key,
        "node": record.node,
        "step": record.step,
        "attempt": record.attempt,
        "kind": record.kind,
        "name": record.name,
        "ident": record.ident,
        "fingerprint": record.fingerprint,
        "outcome": record.outcome,
        "result": record.result,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "discarded": bool(record.discarded),
        "created_at": float(record.created_at),
    }
    if sealer is not None and sealer.on and row["result"] is not None:
        row["result"] = sealer.seal(row["result"], CALLS, row["run_id"], row["seq"], "result")
    row["checksum"] = call_sum(row["run_id"], row)
    return row


def checked(row: Mapping[Any, Any], url: str, sealer: Sealer = PLAIN) -> CallRecord:
    """The record of a stored row, after checking the row against its checksum, its result opened.

    Raises:
        StoreCorruptError: the row does not match its checksum, or its result does not open.
        StoreConfigError: its result is sealed with a key the store was not given.
    """
    if row["checksum"] != call_sum(row["run_id"], row):
        raise corrupt(
            Damage(row["run_id"], CALLS, int(row["step"]), seq=int(row["seq"]), node=row["node"]), url
        )
    return CallRecord(
        run_id=row["run_id"],
        turn_key=row["turn_key"],
        node=row["node"],
        step=int(row["step"]),
        attempt=int(row["attempt"]),
        kind=row["kind"],
        name=row["name"],
        ident=row["ident"],
        fingerprint=row["fingerprint"],
        outcome=row["outcome"],
        result=sealer.open(
            row["result"],
            CALLS,
            row["run_id"],
            int(row["seq"]),
            "result",
            seq=int(row["seq"]),
            node=row["node"],
        ),
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        created_at=float(row["created_at"]),
        seq=int(row["seq"]),
        discarded=bool(row["discarded"]),
    )


def _next_seq(conn: Connection, run_id: str) -> int:
    top = conn.execute(sa.select(sa.func.max(_C.seq)).where(_C.run_id == run_id)).scalar()
    return 1 if top is None else int(top) + 1


def _replayable(record: CallRecord) -> bool:
    """Whether an attempt may replay ``record``: made (``live``) and not discarded."""
    return record.outcome == "live" and not record.discarded


def summarise(conn: Connection, run_ids: builtins.list[str] | None) -> CallSummary:
    """The calls made and replayed, and the tokens replays saved, of ``run_ids`` (``None``: all runs)."""
    replayed = _C.outcome == "replayed"
    tokens = sa.func.coalesce(_C.prompt_tokens, 0) + sa.func.coalesce(_C.completion_tokens, 0)
    query = sa.select(
        sa.func.coalesce(sa.func.sum(sa.case((_C.outcome == "live", 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((replayed, 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((replayed, tokens), else_=0)), 0),
    )
    if run_ids is not None:
        query = query.where(_C.run_id.in_(run_ids))
    live, saved_calls, saved_tokens = conn.execute(query).one()
    return CallSummary(int(live), int(saved_calls), int(saved_tokens))


class CallRecords:
    """The recorded model and tool calls of a store's runs: ``store.calls``.

    Shares the store's engines (its connection pool and lifetime), as ``store.requests`` does; each
    method is one transaction, database errors raised as :class:`StoreError`; every row read is
    checked against its checksum (:class:`StoreCorruptError` when it does not match). The wrappers
    (``graphflow_durable.recorded``) write and read records through it; ``runs history --calls``,
    ``runs show`` and ``runs stats`` read them.
    """

    def __init__(self, engines: Engines) -> None:
        self._e = engines

    def _guard(self, action: str, run_id: str) -> AbstractContextManager[None]:
        return guarded(self._e, f"{action} of run {run_id}", run_id=run_id)

    def record(self, record: CallRecord, *, fencing_token: int | None) -> CallRecord:
        """Write ``record`` as the run's next record; return it with its ``seq`` (1, 2, 3... per run,
        in write order). One transaction: the run's row is locked (which also orders concurrent
        records of one run), the token checked, then the row inserted and committed.

        Args:
            record: the call (its ``seq`` is ignored).
            fencing_token: the driver's token: :class:`LeaseLostError` and nothing written unless it
                is still the run's. ``None``: not a driver's write (no check).

        Raises:
            UsageError: a field the store cannot hold (see :func:`refuse_bad_record`); nothing written.
            RunNotFoundError: the run does not exist.
            LeaseLostError: ``fencing_token`` is not the run's.
        """
        refuse_bad_record(record)
        run_id = record.run_id
        with self._guard("recording a call", run_id), self._e.write.begin() as conn:
            fenced(conn, run_id, fencing_token, lock=True)
            stored = replace(record, seq=_next_seq(conn, run_id))
            conn.execute(sa.insert(call_records).values(**call_row(stored, sealer=self._e.sealer)))
        return stored

    def turn(self, run_id: str, turn_key: str) -> builtins.list[CallRecord]:
        """Every record of the turn (live, replayed, discarded), in ``seq`` order, each row checked
        against its checksum before anything is filtered (a row whose outcome or discarded flag was
        changed outside the store is refused, never skipped)."""
        query = sa.select(call_records).where(_C.run_id == run_id, _C.turn_key == turn_key).order_by(_C.seq)
        with self._guard("reading the call records", run_id), self._e.read.begin() as conn:
            return [checked(row, self._e.url, self._e.sealer) for row in conn.execute(query).mappings()]

    def for_turn(self, run_id: str, turn_key: str) -> builtins.list[CallRecord]:
        """The turn's live, not discarded records, in ``seq`` order (what an attempt may replay);
        every row of the turn is checked first, as :meth:`turn` does."""
        return [r for r in self.turn(run_id, turn_key) if _replayable(r)]

    def discard_from(
        self, run_id: str, turn_key: str, seq: int, *, fencing_token: int | None, kind: str | None = None
    ) -> int:
        """Mark every live, not yet discarded record of the turn with ``seq`` >= ``seq`` (of
        ``kind`` only, if given) discarded (a divergence voided them; they are kept for audit);
        return how many. Fenced as :meth:`record`; every row of the turn from ``seq`` on is checked
        against its checksum before any is filtered or rewritten with a new one (a damaged row is
        refused, never certified)."""
        query = (
            sa.select(call_records)
            .where(_C.run_id == run_id, _C.turn_key == turn_key, _C.seq >= seq)
            .order_by(_C.seq)
        )
        with self._guard("discarding call records", run_id), self._e.write.begin() as conn:
            fenced(conn, run_id, fencing_token, lock=True)
            stored = conn.execute(query).mappings().all()
            rows = [checked(row, self._e.url, self._e.sealer) for row in stored]
            # the new checksums are over the stored rows (a sealed result is not sealed again)
            voided = [
                (r.seq, call_sum(run_id, {**row, "discarded": True}))
                for r, row in zip(rows, stored, strict=True)
                if _replayable(r) and (kind is None or r.kind == kind)
            ]
            if voided:
                conn.execute(
                    sa.update(call_records)
                    .where(_C.run_id == run_id, _C.seq == sa.bindparam("p_seq"))
                    .values(discarded=True, checksum=sa.bindparam("p_sum")),
                    [{"p_seq": seq, "p_sum": checksum} for seq, checksum in voided],
                )
        return len(voided)

    def list(self, run_id: str) -> builtins.list[CallRecord]:
        """Every record of the run (live, replayed, discarded), in ``seq`` order; ``[]`` for a run
        without records (or an unknown run)."""
        query = sa.select(call_records).where(_C.run_id == run_id).order_by(_C.seq)
        with self._guard("reading the call records", run_id), self._e.read.begin() as conn:
            return [checked(row, self._e.url, self._e.sealer) for row in conn.execute(query).mappings()]

    def summary(self, run_id: str) -> CallSummary:
        """The run's calls made (``live`` rows, discarded ones included: they were paid), calls
        replayed, and the tokens the replays saved (their prompt and completion tokens, summed)."""
        with self._guard("summing the call records", run_id), self._e.read.begin() as conn:
            return summarise(conn, [run_id])
