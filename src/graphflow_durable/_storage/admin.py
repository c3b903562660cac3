"""Operations on a run from outside its driver: cancel, retry, and what ``runs show`` reads.

The store runs each function inside one of its transactions. Nothing here writes to a run that a
live driver holds (an unexpired lease whose holder is not provably dead), except a cancel
*request*: a column the driver reads when it renews its lease (:func:`~.leasing.renew`), after which
the driver itself records the run ``cancelled``. A run nobody holds is changed directly, and its
fencing token is replaced by a new one, so a driver whose lease ran out can no longer commit to it.
Deleting runs and retention are in :mod:`.retention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from graphflow_durable._model.records import ENDED_STATUSES
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.lease import NOBODY, locked, takeover_reason
from graphflow_durable._storage.rows import not_found
from graphflow_durable._storage.schema import input_requests, queue, runs, steps
from graphflow_durable.errors import ConflictError, RunStateError

__all__ = [
    "Cancellation",
    "Heartbeat",
    "Progress",
    "Retry",
    "cancel",
    "held",
    "progress",
    "retry",
    "run_state",
]

_R = runs.c

_SELECT_RUN_STATE = S.SELECT_LEASE_NOW.add_columns(_R.status, _R.cancel_requested_at, _R.parent_run_id)


@dataclass(frozen=True)
class Cancellation:
    """What :meth:`Store.cancel_run` did.

    Attributes:
        run_id: the run.
        outcome: ``"requested"`` (a live driver holds the run: it stops dispatching when it next
            renews its lease, at the latest one lease period later, and records the run
            ``cancelled``), ``"cancelled"`` (nobody held it: it is ``cancelled`` now), or
            ``"already cancelled"``.
        status: the run's status after the call.
        owner: the driver asked to stop (``"requested"``), else ``None``.
        lease_expires_at: that driver's lease expiry (epoch seconds, lease clock), else ``None``.
    """

    run_id: str
    outcome: Literal["requested", "cancelled", "already cancelled"]
    status: str
    owner: str | None = None
    lease_expires_at: float | None = None


@dataclass(frozen=True)
class Retry:
    """What :meth:`Store.retry_run` did.

    Attributes:
        run_id: the run.
        previous_status: its status before (``None``: a submission whose run was not created yet).
        status: its status now (a cancelled run becomes ``interrupted``, which workers claim).
        team: the team key it was submitted with: workers with that ``--team KEY`` claim it;
            ``None``: only a worker given a single team factory (any run) does.
        asked_again: the requests for human input whose deadline had passed with no default
            answer (the run failed on them): each has a new deadline, as long as its first, and its
            node asks it again when the run is resumed.
    """

    run_id: str
    previous_status: str | None
    status: str | None
    team: str | None
    asked_again: tuple[str, ...] = ()


def run_state(conn: sa.Connection, run_id: str, now: float, *, lock: bool = True) -> Any:
    """The run's status and lease (``lock``: locked for this transaction), or ``None``."""
    query = _SELECT_RUN_STATE
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update(of=runs)
    return conn.execute(query, {"p_run_id": run_id, "p_now": now}).first()


def held(row: Any) -> bool:
    """Whether a live driver holds the run's lease (unexpired, its process not provably gone)."""
    return row.lease_owner is not None and takeover_reason(row, NOBODY, float(row.db_now)) is None


def _free(conn: sa.Connection, row: Any, now: float, **values: Any) -> None:
    """Set ``values`` on a run nobody holds; clear its lease and give it a new fencing token (the
    store's next), so that a driver whose lease ran out can no longer commit to it."""
    changed = conn.execute(
        sa.update(runs)
        .where(_R.run_id == row.run_id, _R.fencing_token == row.fencing_token)
        .values(
            fencing_token=S.next_token(conn),
            **S.NO_HOLDER,
            cancel_requested_at=None,
            updated_at=now,
            **values,
        )
    ).rowcount
    if changed != 1:  # pragma: no cover - the row is locked (FOR UPDATE, SQLite's write lock)
        raise ConflictError(f"run {row.run_id} changed while it was being updated; retry", run_id=row.run_id)


def cancel(conn: sa.Connection, run_id: str, now: float) -> Cancellation:
    """Cancel ``run_id``: ask its live driver to stop, or record it ``cancelled`` if nobody holds it.

    Raises RunNotFoundError, or RunStateError when its last round ended (stopped, finished).
    """
    row = run_state(conn, run_id, now)
    if row is None:
        raise not_found(run_id)
    if row.status == "cancelled":
        return Cancellation(run_id, "already cancelled", "cancelled")
    if row.status in ENDED_STATUSES:
        raise RunStateError(
            f"run {run_id} is {row.status}: its last round ended and nothing runs, so there is nothing "
            "to cancel; delete it (graphflow-durable runs delete) if it is no longer wanted",
            run_id=run_id,
            status=row.status,
        )
    if held(row):
        conn.execute(
            sa.update(runs)
            .where(_R.run_id == run_id, _R.fencing_token == row.fencing_token)
            .values(cancel_requested_at=sa.func.coalesce(_R.cancel_requested_at, row.db_now))
        )
        return Cancellation(run_id, "requested", row.status, row.lease_owner, row.lease_expires_at)
    _free(conn, row, now, status="cancelled")
    return Cancellation(run_id, "cancelled", "cancelled")


def retry(conn: sa.Connection, run_id: str, now: float) -> Retry:
    """Queue ``run_id`` again for the worker pool: a cancelled run becomes ``interrupted``; the
    retry back-off of its queue row (and of a failed submission) is cleared.

    Raises RunNotFoundError; RunLockedError when a live driver holds it; RunStateError when its
    last round ended (stopped, finished).
    """
    row = run_state(conn, run_id, now)
    submitted = conn.execute(sa.select(queue.c.team).where(queue.c.run_id == run_id)).first()
    if row is None and submitted is None:
        raise not_found(run_id)
    if row is not None:
        if row.status in ENDED_STATUSES:
            raise RunStateError(
                f"run {run_id} is {row.status}: its last round ended, there is nothing to retry; give it "
                "a new task (run(task=...)) to start another round",
                run_id=run_id,
                status=row.status,
            )
        if held(row):
            raise locked(run_id, row)
        status = "interrupted" if row.status == "cancelled" else row.status
        _free(conn, row, now, status=status)
    if submitted is not None:
        conn.execute(sa.update(queue).where(queue.c.run_id == run_id).values(not_before=None, updated_at=now))
    return Retry(
        run_id,
        None if row is None else row.status,
        None if row is None else status,
        None if submitted is None else submitted.team,
        () if row is None else _ask_again(conn, run_id, now),
    )


def _ask_again(conn: sa.Connection, run_id: str, now: float) -> tuple[str, ...]:
    """Give the run's pending requests whose deadline passed with no default answer a new deadline,
    as far from now as the first was from the request; return their ids. Without it the retried run
    would fail on them again at once."""
    r = input_requests.c
    overdue = sa.and_(r.run_id == run_id, r.status == "pending", r.deadline < now, r.default_answer.is_(None))
    ids = tuple(conn.execute(sa.select(r.request_id).where(overdue).order_by(r.request_id)).scalars())
    if ids:
        conn.execute(
            sa.update(input_requests).where(overdue).values(deadline=now + (r.deadline - r.created_at))
        )
    return ids


@dataclass(frozen=True)
class Heartbeat:
    """A lease renewal as its holder sees it (:meth:`Store.heartbeat`).

    Attributes:
        expires_at: the lease's new expiry (epoch seconds, by the lease clock).
        cancel_requested_at: when a cancel of the run was requested (:meth:`Store.cancel_run`), not
            yet honoured; ``None``: none. The holder stops dispatching and records ``cancelled``.
    """

    expires_at: float
    cancel_requested_at: float | None


@dataclass(frozen=True)
class Progress:
    """Where a run is, for ``runs show``: its rounds and its head step.

    Attributes:
        rounds: how many rounds began (``start`` steps; a task given to a finished run begins one).
        head_kind: the kind of the head step (``None`` before the first step).
        head_node: the node whose answer the head step recorded, if it did.
        head_at: when the head step was committed (epoch seconds), or ``None``.
    """

    rounds: int
    head_kind: str | None
    head_node: str | None
    head_at: float | None


def progress(conn: sa.Connection, run_id: str, head: int) -> Progress:
    """The run's rounds and head step."""
    rounds = conn.execute(
        sa.select(sa.func.count()).where(steps.c.run_id == run_id, steps.c.kind == "start")
    ).scalar_one()
    top = conn.execute(
        sa.select(steps.c.kind, steps.c.node, steps.c.created_at).where(
            steps.c.run_id == run_id, steps.c.seq == head
        )
    ).first()
    if top is None:
        return Progress(int(rounds), None, None, None)
    return Progress(int(rounds), str(top.kind), top.node, float(top.created_at))
