"""The statements of the worker-pool claim: which runs and submissions are claimable, in what
order (priority, then oldest), within which named queues and outside the queues and partitions a
:class:`~._storage.flowcontrol.Gate` shut; and the pids of this host's holders, to test for liveness.

Every statement is executed with ``p_now`` (the lease clock, see ``statements.DB_NOW``); the retry
back-off (``not_before``) is the workers' time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.records import ENDED_STATUSES
from graphflow_durable._storage.flowcontrol import Gate, queue_of
from graphflow_durable._storage.schema import input_requests, queue, runs
from graphflow_durable._storage.statements import DB_NOW, LEASE_COLUMNS, STATEMENT_NOW

__all__ = [
    "claimable_runs",
    "claimable_submissions",
    "local_lease_pids",
    "runs_claimable",
    "submissions_claimable",
]

_Q = queue.c
_R = runs.c


#: Runs the pool never claims: ended rounds, runs cancelled on request and failed runs (until
#: retried: ``Store.retry_run`` makes them ``interrupted``).
_NOT_CLAIMED = (*ENDED_STATUSES, "cancelled", "failed")


def local_lease_pids(host: str) -> sa.Select[Any]:
    """Pids of this host's processes holding unexpired leases or claims (to test for liveness), each
    with its holder's identity: a run lease's ``lease_process`` (``""`` when unknown), ``NULL`` for
    a submission claim."""
    held_runs = sa.select(
        _R.lease_pid.label("pid"), sa.func.coalesce(_R.lease_process, "").label("process")
    ).where(
        _R.lease_host == host,
        _R.lease_pid.is_not(None),
        _R.lease_expires_at >= STATEMENT_NOW,
        _R.status.not_in(ENDED_STATUSES),
    )
    held_claims = sa.select(_Q.claim_pid.label("pid"), sa.null().label("process")).where(
        _Q.claim_host == host, _Q.claim_pid.is_not(None), _Q.claim_expires_at >= STATEMENT_NOW
    )
    union = sa.union(held_runs, held_claims).subquery()
    return sa.select(union.c.pid, union.c.process).distinct()


def _team_filter(teams: Sequence[str] | None) -> sa.ColumnElement[bool]:
    return sa.true() if teams is None else _Q.team.in_(list(teams))


def _queue_filter(queues: Sequence[str] | None, column: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    return sa.true() if queues is None else column.in_(list(queues))


def _late(now: float) -> sa.Exists:
    """The run has a pending request past its deadline."""
    return sa.exists().where(
        input_requests.c.run_id == _R.run_id,
        input_requests.c.status == "pending",
        input_requests.c.deadline < now,
    )


def _unfinished(now: float) -> sa.ColumnElement[bool]:
    """A run left to drive: not ended, cancelled or failed, and not waiting for a person unless a
    request's deadline passed (the driver then takes the configured default, or fails the run). A
    failed run, whatever the cause (an agent's error, a budget of retries or crashes spent, a deadline
    with no default), would most likely fail the same way again: it waits for ``runs retry``
    (``admin.retry`` makes it ``interrupted``), never re-claimed on its own."""
    return sa.or_(
        _R.status.not_in((*_NOT_CLAIMED, "waiting")),
        sa.and_(_R.status == "waiting", _late(now)),
    )


def _due(now: float) -> sa.ColumnElement[bool]:
    return sa.or_(_Q.not_before.is_(None), _Q.not_before <= now)


def _takeable(
    holder: Sequence[sa.Column[Any]], host: str, dead_pids: Sequence[int]
) -> sa.ColumnElement[bool]:
    """A lease or claim (its ``holder`` columns: owner, expiry, host, pid) that is free, expired,
    or held by a dead process of ``host``."""
    owner, expires, holder_host, holder_pid = holder
    return sa.or_(
        owner.is_(None),
        expires.is_(None),
        expires < DB_NOW,
        sa.and_(holder_host == host, holder_pid.in_(list(dead_pids))),
    )


def runs_claimable(
    *,
    teams: Sequence[str] | None,
    host: str,
    dead_pids: Sequence[int],
    now: float,
    skip: Sequence[str] = (),
    alone: bool = True,
    queues: Sequence[str] | None = None,
    gate: Gate | None = None,
) -> tuple[sa.ColumnElement[bool], ...]:
    holder = (_R.lease_owner, _R.lease_expires_at, _R.lease_host, _R.lease_pid)
    return (
        _unfinished(now),
        _takeable(holder, host, dead_pids),
        _R.run_id.not_in(list(skip)) if skip else sa.true(),
        _due(now),
        _team_filter(teams),
        sa.true() if alone else sa.func.coalesce(_Q.run_alone, sa.false()) == sa.false(),
        _queue_filter(queues, queue_of),
        sa.true() if gate is None else gate.open_items(queue_of),
    )


def claimable_runs(
    *,
    teams: Sequence[str] | None,
    host: str,
    dead_pids: Sequence[int],
    now: float,
    skip: Sequence[str] = (),
    alone: bool = True,
    queues: Sequence[str] | None = None,
    gate: Gate | None = None,
) -> sa.Select[Any]:
    """The first by priority, then oldest-updated, unfinished run whose lease may be taken (locked, skipping locked rows), but
    none of ``skip``.

    A lease is takeable when it is free, expired, or held by a dead process of this host, whoever
    holds it: the claimant's own lease too (left behind when the database failed under its driver),
    since the claim draws a new fencing token that fences that driver off. ``skip`` lists the runs
    the claimant still drives; unless ``alone`` (it drives nothing), runs that must be driven alone
    are not claimable.
    """
    return (
        sa.select(
            DB_NOW.label("db_now"),
            _R.run_id,
            _R.status,
            _R.updated_at,
            *LEASE_COLUMNS,
            _Q.team,
            _Q.task,
            _Q.not_before,
            sa.func.coalesce(_Q.attempts, 0).label("attempts"),
            sa.func.coalesce(_Q.run_alone, sa.false()).label("run_alone"),
            queue_of.label("queue"),
            sa.func.coalesce(_Q.priority, 0).label("priority"),
            _Q.partition_key,
            _R.sealed,
        )
        .select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
        .where(
            *runs_claimable(
                teams=teams,
                host=host,
                dead_pids=dead_pids,
                now=now,
                skip=skip,
                alone=alone,
                queues=queues,
                gate=gate,
            )
        )
        .order_by(sa.func.coalesce(_Q.priority, 0), _R.updated_at, _R.run_id)
        .limit(1)
        .with_for_update(of=runs, skip_locked=True)
    )


def submissions_claimable(
    *,
    teams: Sequence[str] | None,
    host: str,
    dead_pids: Sequence[int],
    now: float,
    queues: Sequence[str] | None = None,
    gate: Gate | None = None,
) -> tuple[sa.ColumnElement[bool], ...]:
    holder = (_Q.claimed_by, _Q.claim_expires_at, _Q.claim_host, _Q.claim_pid)
    no_run = ~sa.exists().where(_R.run_id == _Q.run_id)
    return (
        no_run,
        _takeable(holder, host, dead_pids),
        _due(now),
        _team_filter(teams),
        _queue_filter(queues, _Q.queue),
        sa.true() if gate is None else gate.open_items(_Q.queue),
    )


def claimable_submissions(
    *,
    teams: Sequence[str] | None,
    host: str,
    dead_pids: Sequence[int],
    now: float,
    queues: Sequence[str] | None = None,
    gate: Gate | None = None,
) -> sa.Select[Any]:
    """The first by priority, then oldest, submission whose run does not exist yet and whose claim
    is free, expired or dead (walking the ``priority, created_at`` index)."""
    where = submissions_claimable(
        teams=teams, host=host, dead_pids=dead_pids, now=now, queues=queues, gate=gate
    )
    return (
        sa.select(queue, DB_NOW.label("db_now"))
        .where(*where)
        .order_by(_Q.priority, _Q.created_at, _Q.run_id)
        .limit(1)
        .with_for_update(of=queue, skip_locked=True)
    )
