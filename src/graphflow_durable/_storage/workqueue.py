"""The worker-pool queue (schema version 3): :class:`WorkQueue`, held by a store as ``store.queue``,
its value objects and the statements its claim runs.

A :class:`WorkQueue` runs its SQL on the engines of the :class:`~graphflow_durable.store.Store` that
made it (one connection pool), each operation one transaction inside :func:`~._storage.engine.guarded`
(database errors become :class:`StoreError`), like every store method. It holds no state of its own
beyond those engines, which the store owns and closes. Get one from ``Store(url).queue``; do not
build it yourself.
The worker-pool queue: value objects and the statements ``store.queue.claim()`` runs.

A *submission* (``store.queue.submit()``) is a row of ``graphflow_queue`` naming a run that does not
exist yet, the team key that knows how to build it and its task. A worker *claims* one claimable
item at a time, atomically:

- a run that is not finished, failed nor cancelled and whose lease is free, expired, or held by a
  process on this host that no longer exists (the run's lease is taken, with a new fencing token);
- a submission whose run does not exist yet and that nobody holds an unexpired claim on (the
  submission's claim is taken; the worker's team then creates the run and its lease).

Runs with a queue row carry the team key, the retry back-off or delayed start (``not_before``),
and their named queue, priority and partition there (schema version 15): the claim takes the first
by priority, then oldest, of the queues and partitions that are under their caps
(:mod:`~._storage.flowcontrol`; its statements in :mod:`~._storage.claimable`). On
PostgreSQL the candidate row is locked with ``FOR UPDATE SKIP LOCKED`` so many workers poll at once
without blocking or double-claiming; on SQLite ``BEGIN IMMEDIATE`` serialises the claimers.

Leases and claims expire by the lease clock (``statements.DB_NOW``: PostgreSQL's own clock; on
SQLite the ``p_now`` parameter, the claimer's ``time.time()``), so every statement here is executed
with ``p_now``; the retry back-off (``not_before``) is the workers' time. A run's lease is taken
through the one takeover path (:func:`~._storage.lease.take_over`), as a driver's acquire takes it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from sqlalchemy.engine import RowMapping

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.records import SealedValue
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.claimable import (
    claimable_runs,
    claimable_submissions,
    local_lease_pids,
    runs_claimable,
    submissions_claimable,
)
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.flowcontrol import (
    DEFAULT_QUEUE,
    SETTINGS,
    Gate,
    QueueSettings,
    check_queue_name,
    check_settings,
    configure,
    lock_queue,
    queue_stats,
    read_settings,
    why_not_started,
)
from graphflow_durable._storage.lease import NOBODY, check_lease_seconds, holder_gone, pid_alive, take_over
from graphflow_durable._storage.schema import queue, runs
from graphflow_durable._storage.sealing import PLAIN, Sealer, is_sealed, key_of, keyless
from graphflow_durable.errors import ConflictError, RunExistsError, StoreError, UsageError

__all__ = [
    "Claim",
    "ClaimKind",
    "Submission",
    "WorkQueue",
    "claimable_runs",
    "claimable_submissions",
    "local_lease_pids",
    "submission",
]

_log = logging.getLogger(__name__)

_TABLE = queue  # the queue table (``submit`` has a ``queue`` argument)
_Q = queue.c
_QT = "graphflow_queue"
_R = runs.c
#: At most this many candidates per claim (each a queue or partition found at its cap under its lock).
_CANDIDATES = 8
#: How long a claim tries for the first queue lock it needs (PostgreSQL), in seconds: not at all
#: (one try), since the worker claims on its event loop, where any wait holds up its runs' turns
#: and lease renewals; a queue whose lock is taken is left to the next poll.
_LOCK_WAIT = 0.0

ClaimKind = Literal["run", "submission"]


@dataclass(frozen=True)
class Claim:
    """What ``store.queue.claim()`` handed to a worker.

    Attributes:
        run_id: the run to drive.
        kind: ``"run"`` (the run exists; its lease was taken) or ``"submission"`` (the run does not
            exist yet; the submission's claim was taken and the worker's team creates the run).
        owner: the claiming worker (the lease owner the team must use).
        fencing_token: the run's new fencing token (``"run"``) or the submission's claim token.
        expires_at: when the lease/claim expires unless the team takes it over (epoch seconds).
        team: the submission's team key, or ``None`` for a run that was never submitted.
        task: the submitted task (JSON), or ``None``.
        status: the run's status before the claim (``None`` for a submission).
        reason: why it was claimable: ``"submitted"``, ``"free"``, ``"expired"`` or
            ``"holder process N on this host is gone"``.
        attempts: how many times workers failed this run before.
        claimable_since: when it became claimable (epoch seconds, by the database's clock): its
            submission, the end of its retry back-off, or the end of its previous holder's lease.
        alone: the run must be driven alone (see :meth:`WorkQueue.isolate`): the worker claims
            nothing else until it is done with it.
    """

    run_id: str
    kind: ClaimKind
    owner: str
    fencing_token: int
    expires_at: float
    team: str | None
    task: Any
    status: str | None
    reason: str
    attempts: int
    claimable_since: float | None = None
    alone: bool = False
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    partition: str | None = None


@dataclass(frozen=True)
class Submission:
    """A row of the queue: a submitted run (or a run workers failed), as read back."""

    run_id: str
    team: str | None
    task: Any
    status: str
    attempts: int
    not_before: float | None
    last_error: str | None
    claimed_by: str | None
    claim_expires_at: float | None
    created_at: float
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    partition: str | None = None


#: The fields of a :class:`Submission` that are columns of its queue row as they are (not the task).
_PLAIN_SUBMISSION_FIELDS = tuple(
    f.name for f in dataclasses.fields(Submission) if f.name not in ("task", "partition")
)


def submission(
    row: Mapping[str, Any] | RowMapping, sealer: Sealer = PLAIN, *, mark: bool = False
) -> Submission:
    """A queue row (JSON text) as a :class:`Submission`, its task and last error opened; with
    ``mark`` (a listing), one sealed with a key the store does not hold reads as a
    :class:`SealedValue` (the error as its text)."""
    run_id, task, error = row["run_id"], row["task"], row["last_error"]
    if mark and task is not None and (key_id := key_of(task)) is not None and not sealer.holds(key_id):
        task = SealedValue(key_id)
    elif task is not None:
        task = loads(sealer.open(task, _QT, run_id, "queue", "task"))
    if mark and error is not None and (key_id := key_of(error)) is not None and not sealer.holds(key_id):
        error = str(SealedValue(key_id))
    elif error is not None:
        error = sealer.open(error, _QT, run_id, "queue", "last_error")
    plain = {name: row[name] for name in _PLAIN_SUBMISSION_FIELDS}
    plain["last_error"] = error
    return Submission(**plain, task=task, partition=row["partition_key"])


def error_text(sealer: Sealer, run_id: str, error: str) -> str:
    """A last error as stored (at most 4000 characters): sealed with a codec; plain, it is the only
    content column that is not JSON, so one that looks sealed gets a space in front."""
    error = error[:4000]
    if sealer.on:
        return str(sealer.seal(error, _QT, run_id, "queue", "last_error"))
    return f" {error}" if is_sealed(error) else error


def _claimable_since(*times: float | None, now: float) -> float:
    """When an item became claimable: the latest of ``times`` (its submission, the end of its
    back-off, of the previous holder's lease), never after ``now`` (a dead holder's lease)."""
    return min(max((t for t in times if t is not None), default=now), now)


#: Queue columns a new submission leaves NULL.
_QUEUE_NULLS = ("not_before", "last_error", "claimed_by", "claim_host", "claim_pid", "claim_expires_at")


def _caller_traceparent() -> str | None:
    """The W3C ``traceparent`` of the submitting caller's current span: the run's trace, which the
    worker's drive joins (``None``: no span, or tracing off by AutoGen's switch)."""
    if os.environ.get("AUTOGEN_DISABLE_RUNTIME_TRACING", "").strip().lower() == "true":
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


class WorkQueue:
    """Submit, claim, release and fail runs of a worker pool: ``store.queue``.

    Shares the store's engines (and so its connection pool and its lifetime: closing the store
    closes the queue). Safe to share between threads, as the store is.
    """

    def __init__(self, engines: Engines) -> None:
        self._e = engines

    def _guard(self, action: str, run_id: str | None = None) -> AbstractContextManager[None]:
        return guarded(self._e, action, run_id=run_id)

    def submit(
        self,
        run_id: str,
        *,
        task: Any,
        team: str | None,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        partition: str | None = None,
        not_before: float | None = None,
    ) -> Submission:
        """Queue a new run for a worker pool: a worker whose teams include ``team`` will create the
        run and drive it with ``task`` (JSON, usually a string). Idempotent per ``run_id``: the same
        task, team, queue, priority and partition again is a no-op that returns the existing
        submission.

        ``queue`` names the queue whose settings bound it (:meth:`configure`; an unconfigured
        queue has no limits); ``priority``: lower first (then oldest); ``partition``: a key (a
        customer) of which at most ``partition_concurrency`` runs (1 by default) are driven at once;
        ``not_before``: no worker starts it before this time (epoch seconds, the workers' clock).
        The run keeps its queue, priority and partition through crashes and ``runs retry``.

        Raises:
            RunExistsError: (a :class:`UsageError`) ``run_id`` was submitted with another task or
                team, or a run with this id exists already without having been submitted.
            ConflictError: concurrent submissions of ``run_id`` kept racing (retry).
            NotSerializableError: ``task`` is not JSON.
            UsageError: ``run_id`` is not a valid run id (empty, white space around it, a
                non-printable character, too long).
        """
        check_run_id(run_id)
        check_queue_name(queue)
        if partition is not None:
            check_queue_name(partition, "partition")
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 2**31:
            raise UsageError(
                f"priority must be a whole number (lower first), not {priority!r}", option="priority"
            )
        if not_before is not None and (isinstance(not_before, bool) or not math.isfinite(not_before)):
            raise UsageError(
                f"not_before must be a time in epoch seconds, not {not_before!r}", option="not_before"
            )
        text = dumps(task, where=f"the task of run {run_id}")
        sealer = self._e.sealer
        stored = sealer.seal(text, _QT, run_id, "queue", "task") if sealer.on else text
        now = time.time()
        placed = {"queue": queue, "priority": priority, "partition_key": partition}
        for _attempt in range(2):
            try:
                with self._guard(f"submitting run {run_id}", run_id), self._e.write.begin() as conn:
                    row = conn.execute(sa.select(_TABLE).where(_Q.run_id == run_id)).mappings().first()
                    if row is not None and row["task"] is None:
                        row = None  # no submission: a run's failure bookkeeping (record_error/failure)
                    if row is not None:
                        was = sealer.open(row["task"], _QT, run_id, "queue", "task")
                        if was == text and row["team"] == team and _placed(row) == placed:
                            return submission(row, sealer)
                        raise RunExistsError(
                            f"run {run_id} was already submitted with team {row['team']!r}, task "
                            f"{was[:200]} and {_placed(row)}, not team {team!r}, task {text[:200]} "
                            f"and {placed}; submit the new task under a new run_id",
                            run_id=run_id,
                            team=row["team"],
                        )
                    exists = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first()
                    if exists is not None:
                        raise RunExistsError(
                            f"run {run_id} already exists in {self._e.url} and was not submitted; choose a "
                            "new run_id, or let a worker with teams=None resume the existing run",
                            run_id=run_id,
                        )
                    values = {
                        "run_id": run_id,
                        "team": team,
                        "task": stored,
                        "status": "pending",
                        "attempts": 0,
                        "claim_token": 0,
                        "created_at": now,
                        "updated_at": now,
                        **placed,
                    }
                    traced = {"trace_context": _caller_traceparent()}
                    conn.execute(sa.insert(_TABLE).values({**values, **traced, "not_before": not_before}))
                    made = {**values, **dict.fromkeys(_QUEUE_NULLS), "not_before": not_before}
                    return submission(made, sealer)
            except StoreError as exc:
                if not isinstance(exc.__cause__, sa.exc.IntegrityError):
                    raise
                # submitted concurrently by another process: read its row and compare
        raise ConflictError(
            f"submitting run {run_id} to {self._e.url} kept conflicting; retry",
            run_id=run_id,
            url=self._e.url,
        )

    def configure(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        worker_concurrency: int | None = None,
        partition_concurrency: int | None = None,
        rate: str | None = None,
    ) -> QueueSettings:
        """Set the given settings of queue ``name`` for every worker (``None``: left as it is; see
        :meth:`clear`); return its settings. ``concurrency``: runs of the queue driven at once across
        the pool; ``worker_concurrency``: in one worker; ``partition_concurrency``: per partition key
        (1 when unset); ``rate``: run starts and resumptions per period, ``"N/PERIOD"`` (``"100/60s"``,
        PERIOD like ``1s``, ``60s``, ``1m``, ``1h``).

        Raises:
            UsageError: a bad name or value (all are checked before anything is written).
        """
        check_queue_name(name)
        values = check_settings(
            {
                "concurrency": concurrency,
                "worker_concurrency": worker_concurrency,
                "partition_concurrency": partition_concurrency,
                "rate": rate,
            }
        )
        return self._set(name, values, ())

    def clear(self, name: str, setting: str) -> QueueSettings:
        """Remove ``setting`` (one of ``concurrency``, ``worker_concurrency``,
        ``partition_concurrency``, ``rate``) of queue ``name``: no such limit. :class:`UsageError`
        for another setting or a bad name."""
        check_queue_name(name)
        if setting not in SETTINGS:
            raise UsageError(
                f"no queue setting {setting!r}; clear one of {', '.join(SETTINGS)}", option="setting"
            )
        return self._set(name, {}, (setting,))

    def _set(self, name: str, values: dict[str, Any], clear: Sequence[str]) -> QueueSettings:
        with self._guard(f"configuring queue {name}"), self._e.write.begin() as conn:
            configure(conn, name, values, clear=clear)
            return read_settings(conn)[name]

    def settings(self) -> dict[str, QueueSettings]:
        """Every configured queue's settings, by name."""
        with self._guard("reading the queue settings"), self._e.read.begin() as conn:
            return read_settings(conn)

    def stats(self) -> list[dict[str, Any]]:
        """One dict per queue (configured or holding unfinished items): its settings and ``queued``,
        ``claimable``, ``active``, ``waiting``, ``backing_off``, ``scheduled``, ``oldest_queued_age``."""
        with self._guard("counting the queues"), self._e.read.begin() as conn:
            return queue_stats(conn, socket.gethostname(), time.time())

    def why_not_started(self, run_id: str) -> str | None:
        """Why queued run ``run_id`` is not being started now (not due, its queue at a cap, its
        partition busy, its rate), or ``None``."""
        with self._guard(f"reading the queue of run {run_id}", run_id), self._e.read.begin() as conn:
            return why_not_started(conn, run_id, socket.gethostname(), time.time())

    def get_submission(self, run_id: str) -> Submission | None:
        """The run's queue row (its submission, attempts and back-off), or ``None``."""
        with self._guard(f"reading the submission of run {run_id}", run_id), self._e.read.begin() as conn:
            row = conn.execute(sa.select(queue).where(queue.c.run_id == run_id)).mappings().first()
        return None if row is None else submission(row, self._e.sealer, mark=True)

    def list_submissions(self, *, waiting: bool = False) -> list[Submission]:
        """Queue rows in submission order; ``waiting=True``: only those whose run does not exist yet."""
        query = sa.select(queue).order_by(queue.c.created_at, queue.c.run_id)
        if waiting:
            query = query.where(~sa.exists().where(runs.c.run_id == queue.c.run_id))
        with self._guard("listing submissions"), self._e.read.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [submission(row, self._e.sealer, mark=True) for row in rows]

    def claim(
        self,
        owner: str,
        *,
        lease_seconds: float,
        teams: Sequence[str] | None = None,
        host: str | None = None,
        pid: int | None = None,
        skip: Collection[str] = (),
        alone: bool = False,
        queues: Sequence[str] | None = None,
        throttled: Callable[[str, str], None] | None = None,
    ) -> Claim | None:
        """Atomically take ONE claimable item for ``owner``, or return ``None`` when there is none.

        Claimable, in this order: an unfinished run (running or interrupted; never a failed or
        cancelled one, until ``Store.retry_run``) whose lease is free, expired, or held by a process
        on this host that no longer exists, and whose retry back-off has passed -- its lease is taken with a new fencing token; then a submission whose
        run does not exist yet and whose claim is free, expired or dead. Finished runs never are.
        ``teams`` limits both to queue rows with those team keys (``None``: any, including runs
        that were never submitted). A run whose expired lease ``owner`` holds itself is claimable
        too (its driver's commits, renewal and release failed, e.g. in a database outage): the new
        token fences that driver off. ``skip`` names the runs ``owner`` still drives, which are
        not claimed whatever their lease says. A run its driver asked to be driven alone
        (:meth:`isolate`) is claimed only by a claimant that drives nothing else (``alone``), which
        then claims nothing else until it is done with that run (the claim's ``alone``).

        Flow control: only items of ``queues`` (``None``: any) are taken, lower priority first,
        then oldest (a run before a submission of the same priority); a queue at its concurrency,
        worker-concurrency or rate cap, or a partition at its cap, is skipped, never blocking the
        items behind it. The caps are counted from the rows in this transaction (on PostgreSQL
        under the queue's advisory lock). A claim that finds nothing while a queue or partition was
        held back calls ``throttled(queue, why)`` for each.

        PostgreSQL locks the candidate with ``FOR UPDATE SKIP LOCKED``: concurrent claimers never
        block each other and never get the same item. SQLite serialises them (``BEGIN IMMEDIATE``).
        """
        check_lease_seconds(lease_seconds)
        host = socket.gethostname() if host is None else host
        pid = os.getpid() if pid is None else pid
        here = socket.gethostname()
        with self._guard("claiming work"):
            now = time.time()
            with self._e.read.begin() as conn:
                local = conn.execute(local_lease_pids(here), {"p_now": now}).all()
            dead = _dead_pids(here, local)
            with self._e.write.begin() as conn:
                want = _Wanted(owner, lease_seconds, teams, host, pid, dead, now, tuple(skip), alone, queues)
                found, gate = self._claim(conn, want)
        if found is None and throttled is not None and (gate.closed or gate.busy):
            with self._guard("reporting the throttled queues"):  # a StoreError, as the claim's own
                self._report_throttled(gate, want, throttled)
        if found is not None and found.reason not in ("free", "submitted"):
            _log.info(
                "run %s: %s claimed it (%s); token %d", found.run_id, owner, found.reason, found.fencing_token
            )
        return found

    def _claim(self, conn: sa.Connection, want: _Wanted) -> tuple[Claim | None, Gate]:
        """The claim's candidates under flow control: the best run and the best submission of the
        open queues and partitions; a candidate whose queue must be serialised is checked again
        under the queue's lock (PostgreSQL), its queue or partition shut if it reached a cap."""
        here, now = socket.gethostname(), want.now
        gate = Gate.read(conn, owner=want.owner, here=here, dead=want.dead, now=now)
        params = {"p_now": now}
        locked = False
        for _ in range(_CANDIDATES):
            run = conn.execute(
                claimable_runs(
                    teams=want.teams,
                    host=here,
                    dead_pids=want.dead,
                    now=now,
                    skip=want.skip,
                    alone=want.alone,
                    queues=want.queues,
                    gate=gate,
                ),
                params,
            ).first()
            query = claimable_submissions(
                teams=want.teams, host=here, dead_pids=want.dead, now=now, queues=want.queues, gate=gate
            )
            sub = conn.execute(query, params).mappings().first()
            if run is None and sub is None:
                return None, gate
            take_run = sub is None or (run is not None and int(run.priority) <= int(sub["priority"]))
            picked: Any = run if take_run else sub
            name, part = (
                (picked.queue, picked.partition_key)
                if take_run
                else (picked["queue"], picked["partition_key"])
            )
            if gate.locks(name, part) and conn.dialect.name == "postgresql":
                if not lock_queue(conn, name, wait=0.0 if locked else _LOCK_WAIT):
                    gate.shut(name, None, f"queue {name} is being claimed by another worker")
                    continue
                locked = True
                fresh = Gate.read(
                    conn,
                    owner=want.owner,
                    here=here,
                    dead=want.dead,
                    now=now,
                    settings=gate.settings,
                    only=name,
                )
                gate.closed.update(fresh.closed)
                gate.busy.update(fresh.busy)
                if gate.why(name, part) is not None:
                    continue
            found = (
                self._claim_run(conn, want, picked)
                if take_run
                else self._claim_submission(conn, want, picked)
            )
            if found is not None:
                at = S.lease_clock(conn, time.time())
                gate.record_start(conn, name, found.run_id, at)
            return found, gate
        return None, gate

    def _claim_run(self, conn: sa.Connection, want: _Wanted, row: Any) -> Claim | None:
        owner, lease_seconds, host, pid, now = want.owner, want.lease_seconds, want.host, want.pid, want.now
        if row.sealed and not self._e.sealer.on:  # its commits would be plain: refused, nothing claimed
            raise keyless(row.run_id, self._e.url, "driving it")
        # As anyone's: the claimant's own lease too is taken only once expired, or its process gone.
        taken = take_over(
            conn, row, asking=NOBODY, owner=owner, host=host, pid=pid, lease_seconds=lease_seconds, now=now
        )
        if taken is None:
            # a pid another holder (another PID namespace) still uses, or the row changed under us
            # (SQLite cannot lock it): the next poll tries again
            return None
        token, reason, expires = taken.token, taken.reason, taken.expires_at
        # driven alone once (the claim says so): its next crash, if any, is its own
        claimed = {**want.claimed(expires), "run_alone": None}
        conn.execute(sa.update(queue).where(queue.c.run_id == row.run_id).values(**claimed))
        return Claim(
            run_id=row.run_id,
            kind="run",
            owner=owner,
            fencing_token=token,
            expires_at=expires,
            team=row.team,
            task=self._task(row.run_id, row.task),
            status=row.status,
            reason="free" if row.lease_owner is None else reason,
            attempts=int(row.attempts),
            alone=bool(row.run_alone),
            queue=row.queue,
            priority=int(row.priority),
            partition=row.partition_key,
            claimable_since=_claimable_since(
                row.not_before,
                row.updated_at if row.lease_owner is None else row.lease_expires_at,
                now=float(row.db_now),
            ),
        )

    def _task(self, run_id: str, stored: str | None) -> Any:
        """A claimed run's task, opened (a sealed one without the key: refused, nothing claimed)."""
        text = self._e.sealer.open(stored, _QT, run_id, "queue", "task")
        return None if text is None else loads(text)

    def _claim_submission(self, conn: sa.Connection, want: _Wanted, row: Any) -> Claim | None:
        owner, lease_seconds = want.owner, want.lease_seconds
        token = S.next_token(conn)  # claim tokens from the same counter: never repeated for a run id
        # By the lease clock now, as run leases: not the candidate's time, which a wait for the
        # queue's lock (or SQLite's) may have left seconds behind: a claim that expired before it
        # was made would count against no cap.
        expires = S.lease_clock(conn, time.time()) + lease_seconds
        changed = conn.execute(
            sa.update(queue)
            .where(queue.c.run_id == row["run_id"], queue.c.claim_token == row["claim_token"])
            .values(**want.claimed(expires), claim_token=token)
        ).rowcount
        if changed != 1:
            return None
        return Claim(
            run_id=row["run_id"],
            kind="submission",
            owner=owner,
            fencing_token=token,
            expires_at=expires,
            team=row["team"],
            task=self._task(row["run_id"], row["task"]),
            status=None,
            reason="submitted" if row["claimed_by"] is None else "the previous claim expired or died",
            queue=row["queue"],
            priority=int(row["priority"]),
            partition=row["partition_key"],
            attempts=int(row["attempts"]),
            claimable_since=_claimable_since(
                row["created_at"],
                row["not_before"],
                None if row["claimed_by"] is None else row["claim_expires_at"],
                now=float(row["db_now"]),
            ),
        )

    def _report_throttled(self, gate: Gate, want: _Wanted, throttled: Callable[[str, str], None]) -> None:
        """Call ``throttled`` for each queue or partition the claim left out that holds an item the
        claimant could otherwise have taken (a cap with nothing behind it throttles nothing)."""
        here, params = socket.gethostname(), {"p_now": want.now}
        shut: list[tuple[str, str | None, str]] = [(name, None, why) for name, why in gate.closed.items()]
        shut += [(name, part, why) for (name, part), why in gate.busy.items() if name not in gate.closed]
        base: dict[str, Any] = {"teams": want.teams, "host": here, "dead_pids": want.dead, "now": want.now}
        with self._e.read.begin() as conn:
            for name, part, why in shut:
                inside = sa.true() if part is None else _Q.partition_key == part
                behind = sa.select(_R.run_id).select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
                behind = behind.where(*runs_claimable(**base, skip=want.skip, queues=[name]), inside).limit(1)
                waiting = sa.select(_Q.run_id).where(*submissions_claimable(**base, queues=[name]), inside)
                if conn.execute(behind, params).first() or conn.execute(waiting.limit(1), params).first():
                    throttled(name, why)

    def depth(self, teams: Sequence[str] | None = None) -> int:
        """How many items a worker of ``teams`` (``None``: any) could claim now: unfinished runs whose
        lease is free or expired and submissions not claimed, past their back-off (a lease held by a
        dead process counts once it expires)."""
        now = time.time()
        here = socket.gethostname()
        run_items = runs_claimable(teams=teams, host=here, dead_pids=(), now=now)
        submitted = submissions_claimable(teams=teams, host=here, dead_pids=(), now=now)
        count_runs = sa.select(sa.func.count()).select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
        with self._guard("counting the claimable work"), self._e.read.begin() as conn:
            found = conn.execute(count_runs.where(*run_items), {"p_now": now}).scalar_one()
            found += conn.execute(
                sa.select(sa.func.count()).select_from(queue).where(*submitted), {"p_now": now}
            ).scalar_one()
        return int(found)

    def release_claim(self, claim: Claim) -> bool:
        """Give back what :meth:`claim` took, if it is still held with the claim's token.

        A ``"run"`` claim releases the run's lease (a no-op once the worker's team re-acquired it);
        a ``"submission"`` claim frees the submission for another worker.
        """
        with (
            self._guard(f"releasing the claim on run {claim.run_id}", claim.run_id),
            self._e.write.begin() as conn,
        ):
            if claim.kind == "run":  # the run's lease, as the driver's release_lease releases it
                params = {"p_run_id": claim.run_id, "p_token": claim.fencing_token}
                return bool(conn.execute(S.RELEASE_LEASE, params).rowcount)
            released = conn.execute(
                sa.update(queue)
                .where(queue.c.run_id == claim.run_id, queue.c.claim_token == claim.fencing_token)
                .values(claimed_by=None, claim_host=None, claim_pid=None, claim_expires_at=None)
            ).rowcount
        return bool(released)

    def record_failure(self, run_id: str, *, error: str, retry_at: float) -> int:
        """Count a failed attempt at ``run_id`` and keep workers off it until ``retry_at``; return the
        number of failed attempts so far. Works for runs that were never submitted, too."""
        values = {"not_before": retry_at, "last_error": error_text(self._e.sealer, run_id, error)}
        with self._guard(f"recording a failure of run {run_id}", run_id), self._e.write.begin() as conn:
            return _note(conn, run_id, self._unsealed(conn, run_id, values), count=True)

    def defer(self, run_id: str, until: float, *, fencing_token: int) -> bool:
        """Keep workers off ``run_id`` until ``until`` (epoch seconds, the workers' clock): its driver
        releases it for a node's back-off. Counts no attempt and leaves its last error alone (a
        back-off is not a failure of the pool). Only while the lease is held with ``fencing_token``
        (a driver taken over changes nothing); returns whether it was. Works for runs that were never
        submitted, too."""
        with self._guard(f"deferring run {run_id}", run_id), self._e.write.begin() as conn:
            if conn.execute(_held(run_id, fencing_token)).first() is None:
                return False
            _note(conn, run_id, {"not_before": until}, count=False)
        return True

    def isolate(self, run_id: str, *, fencing_token: int) -> bool:
        """Have ``run_id`` driven alone: a worker claims it only while it drives nothing else, and
        claims nothing else until it gives it back (its driver could not tell its turn's crashes
        from another run's). Only while the lease is held with ``fencing_token``; returns whether it
        was. Works for runs that were never submitted, too."""
        with self._guard(f"isolating run {run_id}", run_id), self._e.write.begin() as conn:
            if conn.execute(_held(run_id, fencing_token)).first() is None:
                return False
            _note(conn, run_id, {"run_alone": True}, count=False)
        return True

    def record_error(self, run_id: str, *, error: str) -> None:
        """Keep ``error`` as the run's last error (``runs show``), counting no attempt and leaving its
        back-off alone: a run that failed outside a worker pool. Works for runs that were never
        submitted, too."""
        with self._guard(f"recording the error of run {run_id}", run_id), self._e.write.begin() as conn:
            values = {"last_error": error_text(self._e.sealer, run_id, error)}
            _note(conn, run_id, self._unsealed(conn, run_id, values), count=False)

    def _unsealed(self, conn: sa.Connection, run_id: str, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` without the plain error text of a store without the codec for a sealed run
        (the failure is counted, its words are not kept: they may quote the run's content)."""
        if self._e.sealer.on:
            return values
        sealed = conn.execute(sa.select(runs.c.sealed).where(runs.c.run_id == run_id)).scalar()
        if not sealed:
            return values
        _log.warning("run %s is sealed and this store has no codec: its last error is not kept", run_id)
        return {**values, "last_error": None}


def _placed(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    """A queue row's queue, priority and partition (what a submission's idempotency compares)."""
    return {"queue": row["queue"], "priority": row["priority"], "partition_key": row["partition_key"]}


def _held(run_id: str, fencing_token: int) -> sa.Select[Any]:
    """The run's row if its lease is held with ``fencing_token`` (PostgreSQL: locked, so that no
    takeover comes between the check and the update)."""
    return (
        sa.select(runs.c.run_id)
        .where(
            runs.c.run_id == run_id, runs.c.fencing_token == fencing_token, runs.c.lease_owner.is_not(None)
        )
        .with_for_update()
    )


def _note(conn: sa.Connection, run_id: str, values: dict[str, Any], *, count: bool) -> int:
    """Set ``values`` on the run's queue row (one more attempt if ``count``), made if it has none;
    return its attempts."""
    now = time.time()
    attempts = queue.c.attempts + 1 if count else queue.c.attempts
    changed = conn.execute(
        sa.update(queue)
        .where(queue.c.run_id == run_id)
        .values(attempts=attempts, updated_at=now, **values)
        .returning(queue.c.attempts)
    ).scalar()
    if changed is not None:
        return int(changed)
    conn.execute(
        sa.insert(queue).values(
            run_id=run_id,
            team=None,
            task=None,
            status="claimed",
            attempts=int(count),
            claim_token=0,
            created_at=now,
            updated_at=now,
            **values,
        )
    )
    return int(count)


def _dead_pids(host: str, held: Sequence[Any]) -> list[int]:
    """Of this host's pids holding unexpired leases/claims (rows ``pid, process``: a run lease with
    its holder's identity, a submission claim with ``None``), those whose every holder is dead: a
    run lease's holder only when :func:`holder_gone` proves it (same boot and PID namespace)."""
    verdict: dict[int, bool] = {}
    for pid, process in held:
        # a submission claim (no process identity): judged by host and pid only
        gone = not pid_alive(int(pid)) if process is None else holder_gone(host, int(pid), process)
        verdict[int(pid)] = verdict.get(int(pid), True) and gone
    return [pid for pid, gone in verdict.items() if gone]


@dataclass(frozen=True)
class _Wanted:
    """One claim call: who claims, for how long, which teams, and what it found dead."""

    owner: str
    lease_seconds: float
    teams: Sequence[str] | None
    host: str
    pid: int
    dead: Sequence[int]
    now: float
    skip: Sequence[str] = ()
    alone: bool = False
    queues: Sequence[str] | None = None

    def claimed(self, expires: float) -> dict[str, Any]:
        """The queue row's columns once this call holds its claim."""
        return {
            "status": "claimed",
            "claimed_by": self.owner,
            "claim_host": self.host,
            "claim_pid": self.pid,
            "claim_expires_at": expires,
            "updated_at": self.now,
        }
