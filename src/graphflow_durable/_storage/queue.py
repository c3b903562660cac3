"""The worker-pool queue: value objects and the statements ``store.queue.claim()`` runs.

A *submission* (``store.queue.submit()``) is a row of ``graphflow_queue`` naming a run that does not
exist yet, the team key that knows how to build it and its task. A worker *claims* one claimable
item at a time, atomically:

- a run that is not finished and whose lease is free, expired, or held by a process on this host
  that no longer exists (the run's lease is taken, with a new fencing token);
- a submission whose run does not exist yet and that nobody holds an unexpired claim on (the
  submission's claim is taken; the worker's team then creates the run and its lease).

Runs with a queue row carry the team key and the retry back-off (``not_before``) there. On
PostgreSQL the candidate row is locked with ``FOR UPDATE SKIP LOCKED`` so many workers poll at once
without blocking or double-claiming; on SQLite ``BEGIN IMMEDIATE`` serialises the claimers.

Leases and claims expire by the lease clock (``statements.DB_NOW``: PostgreSQL's own clock; on
SQLite the ``p_now`` parameter, the claimer's ``time.time()``), so every statement here is executed
with ``p_now``; the retry back-off (``not_before``) is the workers' time. Only the store's
:class:`~graphflow_durable._storage.workqueue.WorkQueue` (``store.queue``) executes these statements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import ENDED_STATUSES
from graphflow_durable._storage.schema import input_requests, queue, runs
from graphflow_durable._storage.statements import DB_NOW, LEASE_COLUMNS

__all__ = [
    "Claim",
    "ClaimKind",
    "Submission",
    "claimable_runs",
    "claimable_submissions",
    "local_lease_pids",
    "submission",
]

ClaimKind = Literal["run", "submission"]

_Q = queue.c
_R = runs.c


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


def submission(row: Mapping[str, Any] | RowMapping) -> Submission:
    """A queue row (JSON text) as a :class:`Submission`."""
    task = row["task"]
    return Submission(
        run_id=row["run_id"],
        team=row["team"],
        task=None if task is None else loads(task),
        status=row["status"],
        attempts=row["attempts"],
        not_before=row["not_before"],
        last_error=row["last_error"],
        claimed_by=row["claimed_by"],
        claim_expires_at=row["claim_expires_at"],
        created_at=row["created_at"],
    )


#: Runs the pool never claims: ended rounds, and runs cancelled on request (until retried).
_NOT_CLAIMED = (*ENDED_STATUSES, "cancelled")


def local_lease_pids(host: str) -> sa.Select[Any]:
    """Pids of this host's processes holding unexpired leases or claims (to test for liveness), each
    with its holder's identity: a run lease's ``lease_process`` (``""`` when unknown), ``NULL`` for
    a submission claim."""
    held_runs = sa.select(
        _R.lease_pid.label("pid"), sa.func.coalesce(_R.lease_process, "").label("process")
    ).where(
        _R.lease_host == host,
        _R.lease_pid.is_not(None),
        _R.lease_expires_at >= DB_NOW,
        _R.status.not_in(ENDED_STATUSES),
    )
    held_claims = sa.select(_Q.claim_pid.label("pid"), sa.null().label("process")).where(
        _Q.claim_host == host, _Q.claim_pid.is_not(None), _Q.claim_expires_at >= DB_NOW
    )
    union = sa.union(held_runs, held_claims).subquery()
    return sa.select(union.c.pid, union.c.process).distinct()


def _team_filter(teams: Sequence[str] | None) -> sa.ColumnElement[bool]:
    return sa.true() if teams is None else _Q.team.in_(list(teams))


def _late(now: float, *, without_default: bool = False) -> sa.Exists:
    """The run has a pending request past its deadline (with no default answer, if asked)."""
    late = sa.exists().where(
        input_requests.c.run_id == _R.run_id,
        input_requests.c.status == "pending",
        input_requests.c.deadline < now,
    )
    return late.where(input_requests.c.default_answer.is_(None)) if without_default else late


def _unfinished(now: float) -> sa.ColumnElement[bool]:
    """A run left to drive: not ended nor cancelled, and not waiting for a person unless a request's deadline
    passed (the driver then takes the configured default, or fails the run). A run that failed on such a
    deadline (no default) would fail the same way again: it waits for an answer or a retry, which asks
    again with a new deadline (``admin.retry``)."""
    return sa.or_(
        sa.and_(
            _R.status.not_in((*_NOT_CLAIMED, "waiting")),
            sa.or_(_R.status != "failed", ~_late(now, without_default=True)),
        ),
        sa.and_(_R.status == "waiting", _late(now)),
    )


def _due(now: float) -> sa.ColumnElement[bool]:
    return sa.or_(_Q.not_before.is_(None), _Q.not_before <= now)


def claimable_runs(
    *, teams: Sequence[str] | None, host: str, dead_pids: Sequence[int], now: float, skip: Sequence[str] = ()
) -> sa.Select[Any]:
    """The oldest-updated unfinished run whose lease may be taken (locked, skipping locked rows), but
    none of ``skip``.

    A lease is takeable when it is free, expired, or held by a dead process of this host, whoever
    holds it: the claimant's own lease too (left behind when the database failed under its driver),
    since the claim draws a new fencing token that fences that driver off. ``skip`` lists the runs
    the claimant still drives.
    """
    takeable = sa.or_(
        _R.lease_owner.is_(None),
        _R.lease_expires_at.is_(None),
        _R.lease_expires_at < DB_NOW,
        sa.and_(_R.lease_host == host, _R.lease_pid.in_(list(dead_pids))),
    )
    return (
        sa.select(
            DB_NOW.label("db_now"),
            _R.run_id,
            _R.status,
            *LEASE_COLUMNS,
            _Q.team,
            _Q.task,
            sa.func.coalesce(_Q.attempts, 0).label("attempts"),
        )
        .select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
        .where(
            _unfinished(now),
            takeable,
            _R.run_id.not_in(list(skip)) if skip else sa.true(),
            _due(now),
            _team_filter(teams),
        )
        .order_by(_R.updated_at, _R.run_id)
        .limit(1)
        .with_for_update(of=runs, skip_locked=True)
    )


def claimable_submissions(
    *, teams: Sequence[str] | None, host: str, dead_pids: Sequence[int], now: float
) -> sa.Select[Any]:
    """The oldest submission whose run does not exist yet and whose claim is free, expired or dead."""
    takeable = sa.or_(
        _Q.claimed_by.is_(None),
        _Q.claim_expires_at.is_(None),
        _Q.claim_expires_at < DB_NOW,
        sa.and_(_Q.claim_host == host, _Q.claim_pid.in_(list(dead_pids))),
    )
    no_run = ~sa.exists().where(_R.run_id == _Q.run_id)
    return (
        sa.select(queue, DB_NOW.label("db_now"))
        .where(no_run, takeable, _due(now), _team_filter(teams))
        .order_by(_Q.created_at, _Q.run_id)
        .limit(1)
        .with_for_update(of=queue, skip_locked=True)
    )
