"""A run read back for a resume, every row checked against its checksum; and the store-wide scan.

:func:`read_log` is what :meth:`Store.load` runs in its read transaction: a row whose checksum
does not match raises :class:`StoreCorruptError` before anything is decoded or folded, so a damaged
row never reaches an agent. :func:`scan_run` checks every row of a run (also the scheduler texts
and agent-state rows a resume does not read) and reports the damage instead of raising.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._agentstate.reader import fold_states, references
from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunLog, StepKind, StepRecord, StoredMessage
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.checksum import (
    MESSAGES,
    STATES,
    STEPS,
    Damage,
    corrupt,
    message_sum,
    scheduler_matches,
    state_sum,
    step_matches,
    step_sum,
)
from graphflow_durable._storage.commit import not_found
from graphflow_durable._storage.rows import run_record

__all__ = ["Verification", "head_scheduler", "read_log", "scan_run"]


@dataclass(frozen=True)
class Verification:
    """What :meth:`Store.verify` found.

    Attributes:
        runs: the runs scanned, in creation order.
        damaged: each row whose content no longer matches its checksum, one :class:`Damage` each.
        checked: how many rows were checked (steps, messages and agent states).
        unchecked: rows with no checksum (written before schema version 6): not checked.
    """

    runs: tuple[str, ...] = ()
    damaged: tuple[Damage, ...] = ()
    checked: int = 0
    unchecked: int = 0

    @property
    def ok(self) -> bool:
        """Whether no damage was found."""
        return not self.damaged

    @classmethod
    def of(cls, runs: Sequence[str], scans: Iterable[tuple[list[Damage], int, int]]) -> Verification:
        """The verification of ``runs`` from their :func:`scan_run` results."""
        damaged: list[Damage] = []
        checked = unchecked = 0
        for found, ok, skipped in scans:
            damaged.extend(found)
            checked, unchecked = checked + ok, unchecked + skipped
        return cls(runs=tuple(runs), damaged=tuple(damaged), checked=checked, unchecked=unchecked)


@dataclass
class _Tally:
    damaged: list[Damage] = field(default_factory=list)
    checked: int = 0
    unchecked: int = 0

    def count(self, checksum: int | None) -> bool:
        """Count a row; whether it has a checksum to check."""
        if checksum is None:
            self.unchecked += 1
            return False
        self.checked += 1
        return True


def read_log(conn: sa.Connection, run_id: str, url: str, at: int | None = None) -> RunLog:
    """Everything needed to resume ``run_id`` (see ``Store.load``), each row checked; with ``at``,
    only its steps, messages and agent states up to step ``at`` and the scheduler of that step
    (the run's row is the stored one: see ``_model.history.cut_record``).

    Raises RunNotFoundError, or StoreCorruptError naming the first damaged row.
    """
    p: dict[str, Any] = {"p_run_id": run_id, "p_at": at}
    row = conn.execute(S.SELECT_RUN, p).mappings().first()
    if row is None:
        raise not_found(run_id)
    run = run_record(row)
    steps = []
    for s in conn.execute(S.SELECT_STEPS if at is None else S.SELECT_STEPS_TO, p):
        if s.checksum is not None and not step_matches(s.checksum, run_id, s.seq, s.kind, s.node, s.data):
            raise corrupt(Damage(run_id, STEPS, s.seq, node=s.node), url)
        steps.append(
            StepRecord(
                seq=s.seq, kind=StepKind(s.kind), node=s.node, data=loads(s.data), created_at=s.created_at
            )
        )
    scheduler = _scheduler(conn, run_id, run.head_seq if at is None else at, url)
    thread = []
    for m in conn.execute(S.SELECT_MESSAGES if at is None else S.SELECT_MESSAGES_TO, p):
        if m.checksum is not None and m.checksum != message_sum(
            run_id, m.seq, m.step_seq, m.published, m.body
        ):
            raise corrupt(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq), url)
        thread.append(
            StoredMessage(seq=m.seq, step_seq=m.step_seq, body=loads(m.body), published=bool(m.published))
        )
    rows = list(conn.execute(S.SELECT_LATEST_STATES if at is None else S.SELECT_LATEST_STATES_TO, p))
    for r in rows:
        if r.checksum is not None and r.checksum != state_sum(
            run_id, r.node, r.step_seq, r.base_step, r.body
        ):
            raise corrupt(Damage(run_id, STATES, r.step_seq, node=r.node), url)
    states, state_steps = fold_states(
        run_id, [(r.node, r.step_seq, r.base_step, r.body) for r in rows], references(thread)
    )
    return RunLog(
        run=run,
        steps=steps,
        messages=thread,
        scheduler=None if scheduler is None else loads(scheduler),
        agent_states=states,
        agent_state_steps=state_steps,
    )


def head_scheduler(conn: sa.Connection, run_id: str, url: str) -> Any:
    """The decoded scheduler JSON of the run's head step (``None`` before the first step), checked."""
    run = conn.execute(S.SELECT_RUN, {"p_run_id": run_id}).mappings().first()
    if run is None:
        raise not_found(run_id)
    text = _scheduler(conn, run_id, run["head_seq"], url)
    return None if text is None else loads(text)


def _scheduler(conn: sa.Connection, run_id: str, head: int, url: str) -> str | None:
    found = conn.execute(S.SELECT_SCHEDULER, {"p_run_id": run_id, "p_seq": head}).first()
    if found is None:
        return None
    text, checksum = found
    if checksum is not None and not scheduler_matches(checksum, text):
        raise corrupt(Damage(run_id, STEPS, head, column="scheduler"), url)
    return str(text)


def scan_run(conn: sa.Connection, run_id: str) -> tuple[list[Damage], int, int]:
    """Check every step, message and agent-state row of ``run_id``: the damage, rows checked,
    rows without a checksum. A run that does not exist has no rows (the caller checks it exists)."""
    tally = _Tally()
    p = {"p_run_id": run_id}
    for s in conn.execute(S.SCAN_STEPS, p):
        if tally.count(s.checksum):
            tally.damaged.extend(_step_damage(run_id, s))
    for m in conn.execute(S.SELECT_MESSAGES, p):
        if tally.count(m.checksum) and m.checksum != message_sum(
            run_id, m.seq, m.step_seq, m.published, m.body
        ):
            tally.damaged.append(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq))
    for r in conn.execute(S.SCAN_STATES, p):
        if tally.count(r.checksum) and r.checksum != state_sum(
            run_id, r.node, r.step_seq, r.base_step, r.body
        ):
            tally.damaged.append(Damage(run_id, STATES, r.step_seq, node=r.node))
    return _in_step_order(tally.damaged), tally.checked, tally.unchecked


def _step_damage(run_id: str, s: Any) -> Iterator[Damage]:
    if s.checksum == step_sum(run_id, s.seq, s.kind, s.node, s.data, s.scheduler):
        return
    # the low half covers the keys, kind, node and data: if it still matches, only the scheduler changed
    only_scheduler = step_matches(s.checksum, run_id, s.seq, s.kind, s.node, s.data)
    yield Damage(run_id, STEPS, s.seq, node=s.node, column="scheduler" if only_scheduler else None)


def _in_step_order(damaged: Iterable[Damage]) -> list[Damage]:
    order = {STEPS: 0, MESSAGES: 1, STATES: 2}
    return sorted(damaged, key=lambda d: (d.step, order[d.table], d.seq or 0, d.node or ""))
