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

from graphflow_durable._agentstate.decoder import fold_states, references
from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunLog, StepKind, StepRecord, StoredMessage
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.checksum import (
    CALLS,
    MESSAGES,
    STATES,
    STEPS,
    Damage,
    call_sum,
    corrupt,
    message_sum,
    scheduler_matches,
    state_sum,
    step_matches,
    step_sum,
)
from graphflow_durable._storage.schema import call_records
from graphflow_durable._storage.sealing import PLAIN, Sealer

RUNS = "graphflow_runs"

__all__ = [
    "Verification",
    "head_scheduler",
    "message_gaps",
    "read_log",
    "read_steps",
    "scan_run",
    "step_gaps",
]


@dataclass(frozen=True)
class Verification:
    """What :meth:`Store.verify` found.

    Attributes:
        runs: the runs scanned, in creation order.
        damaged: each row whose content no longer matches its checksum, and each gap in a run's
            log (missing steps or messages, rows beyond the run row's head), one :class:`Damage` each.
        checked: how many rows were checked (steps, messages, agent states and call records).
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


def read_log(
    conn: sa.Connection, run_id: str, url: str, at: int | None = None, sealer: Sealer = PLAIN
) -> RunLog:
    """Everything needed to resume ``run_id`` (see ``Store.load``), each row checked; with ``at``,
    only its steps, messages and agent states up to step ``at`` and the scheduler of that step
    (the run's row is the stored one: see ``_model.history.cut_record``).

    Raises RunNotFoundError, or StoreCorruptError naming the first damaged row or gap (steps not
    ``1..head``, messages not ``0..message_count - 1``: checked on the seqs already read). Each
    content value is opened by ``sealer`` after its checksum matched (a value that does not open
    is a StoreCorruptError naming its row; a sealed one without the key, a StoreConfigError).
    """
    p: dict[str, Any] = {"p_run_id": run_id, "p_at": at}
    stepped = read_steps(conn, run_id, url, at, sealer)
    run = stepped.run
    opened = sealer.open
    thread = []
    for m in conn.execute(S.SELECT_MESSAGES if at is None else S.SELECT_MESSAGES_TO, p):
        if m.checksum is not None and m.checksum != message_sum(
            run_id, m.seq, m.step_seq, m.published, m.body
        ):
            raise corrupt(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq), url)
        body = opened(m.body, MESSAGES, run_id, m.seq, "body", seq=m.seq)
        thread.append(
            StoredMessage(seq=m.seq, step_seq=m.step_seq, body=loads(body), published=bool(m.published))
        )
    # a cut (``at``) has no stored message count to compare with: only holes between its messages
    count = run.message_count if at is None else None
    if gaps := message_gaps(run_id, count, [(m.seq, m.step_seq) for m in thread]):
        raise corrupt(gaps[0], url)
    rows = list(conn.execute(S.SELECT_LATEST_STATES if at is None else S.SELECT_LATEST_STATES_TO, p))
    for r in rows:
        if r.checksum is not None and r.checksum != state_sum(
            run_id, r.node, r.step_seq, r.base_step, r.body
        ):
            raise corrupt(Damage(run_id, STATES, r.step_seq, node=r.node), url)
    bodies = [
        (
            r.node,
            r.step_seq,
            r.base_step,
            opened(r.body, STATES, run_id, f"{r.node}@{r.step_seq}", "body", seq=r.step_seq, node=r.node),
        )
        for r in rows
    ]
    states, state_steps = fold_states(run_id, bodies, references(thread))
    return RunLog(
        run=run,
        steps=stepped.steps,
        messages=thread,
        scheduler=stepped.scheduler,
        agent_states=states,
        agent_state_steps=state_steps,
    )


def read_steps(
    conn: sa.Connection, run_id: str, url: str, at: int | None = None, sealer: Sealer = PLAIN
) -> RunLog:
    """The run's row, its steps (up to step ``at``) and the scheduler of its head (or of ``at``),
    each row checked as :func:`read_log` checks it: a :class:`RunLog` with no messages and no agent
    states (what drawing its nodes' states needs, without reading its thread)."""
    p: dict[str, Any] = {"p_run_id": run_id, "p_at": at}
    run = S.run_row(conn, run_id, sealer)
    steps = []
    for s in conn.execute(S.SELECT_STEPS if at is None else S.SELECT_STEPS_TO, p):
        if s.checksum is not None and not step_matches(s.checksum, run_id, s.seq, s.kind, s.node, s.data):
            raise corrupt(Damage(run_id, STEPS, s.seq, node=s.node), url)
        data = sealer.open(s.data, STEPS, run_id, s.seq, "data", seq=s.seq, node=s.node)
        steps.append(
            StepRecord(
                seq=s.seq, kind=StepKind(s.kind), node=s.node, data=loads(data), created_at=s.created_at
            )
        )
    head = run.head_seq if at is None else at
    if gaps := step_gaps(run_id, head, [s.seq for s in steps]):
        raise corrupt(gaps[0], url)
    scheduler = _scheduler(conn, run_id, head, url)
    return RunLog(
        run=run,
        steps=steps,
        messages=(),
        scheduler=None if scheduler is None else loads(scheduler),
        agent_states={},
    )


def head_scheduler(conn: sa.Connection, run_id: str, url: str) -> Any:
    """The decoded scheduler JSON of the run's head step (``None`` before the first step), checked."""
    run = conn.execute(S.SELECT_RUN, {"p_run_id": run_id}).mappings().first()
    if run is None:
        raise S.not_found(run_id)
    text = _scheduler(conn, run_id, run["head_seq"], url)
    return None if text is None else loads(text)


def _scheduler(conn: sa.Connection, run_id: str, head: int, url: str) -> str | None:
    found = conn.execute(S.SELECT_SCHEDULER, {"p_run_id": run_id, "p_seq": head}).first()
    if found is None:
        if head > 0:  # the run's row names a head step that is not stored
            raise corrupt(_missing(run_id, STEPS, head, head, f"steps 1..{head} expected"), url)
        return None
    text, checksum = found
    if checksum is not None and not scheduler_matches(checksum, text):
        raise corrupt(Damage(run_id, STEPS, head, column="scheduler"), url)
    return str(text)


def scan_run(conn: sa.Connection, run_id: str) -> tuple[list[Damage], int, int]:
    """Check every step, message, agent-state and call-record row of ``run_id``, and the gaps in its steps and
    messages: the damage, rows checked, rows without a checksum. A run that does not exist has no
    rows (the caller checks it exists). Checksums are over the stored text: a sealed store is
    checked without its keys (``runs verify --decrypt`` opens the values: ``_storage/rekey.py``)."""
    tally = _Tally()
    p = {"p_run_id": run_id}
    run = conn.execute(S.SELECT_RUN, p).mappings().first()
    if run is None:
        return [], 0, 0
    seqs: list[int] = []
    for s in conn.execute(S.SCAN_STEPS, p):
        seqs.append(s.seq)
        if tally.count(s.checksum):
            tally.damaged.extend(_step_damage(run_id, s))
    tally.damaged.extend(step_gaps(run_id, run["head_seq"], seqs))
    pairs: list[tuple[int, int]] = []
    for m in conn.execute(S.SELECT_MESSAGES, p):
        pairs.append((m.seq, m.step_seq))
        if tally.count(m.checksum) and m.checksum != message_sum(
            run_id, m.seq, m.step_seq, m.published, m.body
        ):
            tally.damaged.append(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq))
    tally.damaged.extend(message_gaps(run_id, run["message_count"], pairs))
    for r in conn.execute(S.SCAN_STATES, p):
        if tally.count(r.checksum) and r.checksum != state_sum(
            run_id, r.node, r.step_seq, r.base_step, r.body
        ):
            tally.damaged.append(Damage(run_id, STATES, r.step_seq, node=r.node))
    calls = sa.select(call_records).where(call_records.c.run_id == run_id).order_by(call_records.c.seq)
    for c in conn.execute(calls).mappings():
        if tally.count(c["checksum"]) and c["checksum"] != call_sum(run_id, c):
            tally.damaged.append(Damage(run_id, CALLS, c["step"], seq=c["seq"], node=c["node"]))
    return _in_step_order(tally.damaged), tally.checked, tally.unchecked


def step_gaps(run_id: str, head: int, seqs: Sequence[int]) -> list[Damage]:
    """The gaps in a run's step seqs (ascending, as read): steps of ``1..head`` missing, and steps
    stored beyond ``head`` (the run row's head moved back). One pass over seqs already read."""
    found: list[Damage] = []
    expected_all = f"steps 1..{head} expected"
    next_seq = 1
    beyond = [seq for seq in seqs if seq > head]
    for seq in seqs:
        if seq > head:
            break
        if seq > next_seq:
            found.append(_missing(run_id, STEPS, next_seq, seq - 1, expected_all))
        next_seq = seq + 1
    if next_seq <= head:
        found.append(_missing(run_id, STEPS, next_seq, head, expected_all))
    if beyond:
        found.append(
            Damage(
                run_id,
                STEPS,
                beyond[0],
                problem=f"{_seqs('step', beyond[0], beyond[-1])} stored beyond the run's head step "
                f"{head} (its head_seq was moved back)",
            )
        )
    return found


def message_gaps(run_id: str, count: int | None, pairs: Sequence[tuple[int, int]]) -> list[Damage]:
    """The gaps in a run's thread: ``pairs`` are its messages' ``(seq, step_seq)`` ascending, as
    read; messages of ``0..count - 1`` missing, and messages stored at or beyond ``count`` (the run
    row's message count moved back). With ``count`` ``None`` (a cut), only holes between messages."""
    found: list[Damage] = []
    last = (pairs[-1][0] if pairs else -1) if count is None else count - 1
    expected_all = f"messages 0..{last} expected"
    next_seq, before = 0, 0
    beyond = [(seq, step) for seq, step in pairs if seq > last]
    for seq, step in pairs:
        if seq > last:
            break
        if seq > next_seq:
            found.append(_missing(run_id, MESSAGES, next_seq, seq - 1, expected_all, step))
        next_seq, before = seq + 1, step
    if next_seq <= last:
        found.append(_missing(run_id, MESSAGES, next_seq, last, expected_all, before))
    if beyond:
        (first, step), end = beyond[0], beyond[-1][0]
        found.append(
            Damage(
                run_id,
                MESSAGES,
                step,
                seq=first,
                problem=f"{_seqs('message', first, end)} stored beyond the run's message count "
                f"{count} (its message_count was moved back)",
            )
        )
    return found


def _seqs(what: str, first: int, last: int) -> str:
    """``"step 4 is"`` or ``"steps 4..6 are"``."""
    return f"{what} {first} is" if first == last else f"{what}s {first}..{last} are"


def _missing(run_id: str, table: str, first: int, last: int, expected: str, step: int = 0) -> Damage:
    """The gap ``first..last`` in ``table`` (a message gap: ``step`` is its neighbour's step)."""
    problem = f"{_seqs('step' if table == STEPS else 'message', first, last)} missing ({expected})"
    if table == STEPS:
        return Damage(run_id, table, first, problem=problem)
    return Damage(run_id, table, step, seq=first, problem=problem)


def _step_damage(run_id: str, s: Any) -> Iterator[Damage]:
    if s.checksum == step_sum(run_id, s.seq, s.kind, s.node, s.data, s.scheduler):
        return
    # the low half covers the keys, kind, node and data: if it still matches, only the scheduler changed
    only_scheduler = step_matches(s.checksum, run_id, s.seq, s.kind, s.node, s.data)
    yield Damage(run_id, STEPS, s.seq, node=s.node, column="scheduler" if only_scheduler else None)


def _in_step_order(damaged: Iterable[Damage]) -> list[Damage]:
    order = {RUNS: -1, STEPS: 0, MESSAGES: 1, STATES: 2, CALLS: 3}
    return sorted(damaged, key=lambda d: (d.step, order[d.table], d.seq or 0, d.node or ""))
