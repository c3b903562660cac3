"""The worker-pool queue (schema version 3): :class:`WorkQueue`, held by a store as ``store.queue``.

A :class:`WorkQueue` runs its SQL on the engines of the :class:`~graphflow_durable.store.Store` that
made it (one connection pool), each operation one transaction inside :func:`~._storage.engine.guarded`
(database errors become :class:`StoreError`), like every store method. It holds no state of its own
beyond those engines, which the store owns and closes. The statements and value objects it uses are
in ``queue``. Get one from ``Store(url).queue``; do not build it yourself.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.lease import NOBODY, holder_gone, pid_alive, process_identity, takeover_reason
from graphflow_durable._storage.queue import (
    Claim,
    Submission,
    claimable_runs,
    claimable_submissions,
    local_lease_pids,
    submission,
)
from graphflow_durable._storage.schema import queue, runs
from graphflow_durable.errors import ConflictError, RunExistsError, StoreError

__all__ = ["WorkQueue"]

_log = logging.getLogger(__name__)

#: Queue columns a new submission leaves NULL.
_QUEUE_NULLS = ("not_before", "last_error", "claimed_by", "claim_host", "claim_pid", "claim_expires_at")


class WorkQueue:
    """Submit, claim, release and fail runs of a worker pool: ``store.queue``.

    Shares the store's engines (and so its connection pool and its lifetime: closing the store
    closes the queue). Safe to share between threads, as the store is.
    """

    def __init__(self, engines: Engines) -> None:
        self._e = engines

    def _guard(self, action: str, run_id: str | None = None) -> AbstractContextManager[None]:
        return guarded(self._e, action, run_id=run_id)

    def submit(self, run_id: str, *, task: Any, team: str | None) -> Submission:
        """Queue a new run for a worker pool: a worker whose teams include ``team`` will create the
        run and drive it with ``task`` (JSON, usually a string). Idempotent per ``run_id``: the same
        task and team again is a no-op that returns the existing submission.

        Raises:
            RunExistsError: (a :class:`UsageError`) ``run_id`` was submitted with another task or
                team, or a run with this id exists already without having been submitted.
            ConflictError: concurrent submissions of ``run_id`` kept racing (retry).
            NotSerializableError: ``task`` is not JSON.
            UsageError: ``run_id`` is not a valid run id (empty, white space around it, a
                non-printable character, too long).
        """
        check_run_id(run_id)
        text = dumps(task, where=f"the task of run {run_id}")
        now = time.time()
        for _attempt in range(2):
            try:
                with self._guard(f"submitting run {run_id}", run_id), self._e.write.begin() as conn:
                    row = conn.execute(sa.select(queue).where(queue.c.run_id == run_id)).mappings().first()
                    if row is not None and row["task"] is None:
                        row = None  # no submission: a run's failure bookkeeping (record_error/failure)
                    if row is not None:
                        if row["task"] == text and row["team"] == team:
                            return submission(row)
                        raise RunExistsError(
                            f"run {run_id} was already submitted with team {row['team']!r} and task "
                            f"{row['task'][:200]}, not team {team!r} and task {text[:200]}; submit the new "
                            "task under a new run_id",
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
                        "task": text,
                        "status": "pending",
                        "attempts": 0,
                        "claim_token": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                    conn.execute(sa.insert(queue).values(values))
                    return submission({**values, **dict.fromkeys(_QUEUE_NULLS)})
            except StoreError as exc:
                if not isinstance(exc.__cause__, sa.exc.IntegrityError):
                    raise
                # submitted concurrently by another process: read its row and compare
        raise ConflictError(
            f"submitting run {run_id} to {self._e.url} kept conflicting; retry",
            run_id=run_id,
            url=self._e.url,
        )

    def get_submission(self, run_id: str) -> Submission | None:
        """The run's queue row (its submission, attempts and back-off), or ``None``."""
        with self._guard(f"reading the submission of run {run_id}", run_id), self._e.read.begin() as conn:
            row = conn.execute(sa.select(queue).where(queue.c.run_id == run_id)).mappings().first()
        return None if row is None else submission(row)

    def list_submissions(self, *, waiting: bool = False) -> list[Submission]:
        """Queue rows in submission order; ``waiting=True``: only those whose run does not exist yet."""
        query = sa.select(queue).order_by(queue.c.created_at, queue.c.run_id)
        if waiting:
            query = query.where(~sa.exists().where(runs.c.run_id == queue.c.run_id))
        with self._guard("listing submissions"), self._e.read.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [submission(row) for row in rows]

    def claim(
        self,
        owner: str,
        *,
        lease_seconds: float,
        teams: Sequence[str] | None = None,
        host: str | None = None,
        pid: int | None = None,
        skip: Collection[str] = (),
    ) -> Claim | None:
        """Atomically take ONE claimable item for ``owner``, or return ``None`` when there is none.

        Claimable, in this order: an unfinished run (running, interrupted or failed) whose lease is
        free, expired, or held by a process on this host that no longer exists, and whose retry
        back-off has passed -- its lease is taken with a new fencing token; then a submission whose
        run does not exist yet and whose claim is free, expired or dead. Finished runs never are.
        ``teams`` limits both to queue rows with those team keys (``None``: any, including runs
        that were never submitted). A run whose expired lease ``owner`` holds itself is claimable
        too (its driver's commits, renewal and release failed, e.g. in a database outage): the new
        token fences that driver off. ``skip`` names the runs ``owner`` still drives, which are
        not claimed whatever their lease says.

        PostgreSQL locks the candidate with ``FOR UPDATE SKIP LOCKED``: concurrent claimers never
        block each other and never get the same item. SQLite serialises them (``BEGIN IMMEDIATE``).
        """
        host = socket.gethostname() if host is None else host
        pid = os.getpid() if pid is None else pid
        here = socket.gethostname()
        with self._guard("claiming work"):
            now = time.time()
            with self._e.read.begin() as conn:
                local = conn.execute(local_lease_pids(here), {"p_now": now}).all()
            dead = _dead_pids(here, local)
            with self._e.write.begin() as conn:
                want = _Wanted(owner, lease_seconds, teams, host, pid, dead, now, tuple(skip))
                found = self._claim_run(conn, want) or self._claim_submission(conn, want)
        if found is not None and found.reason not in ("free", "submitted"):
            _log.info(
                "run %s: %s claimed it (%s); token %d", found.run_id, owner, found.reason, found.fencing_token
            )
        return found

    def _claim_run(self, conn: sa.Connection, want: _Wanted) -> Claim | None:
        owner, lease_seconds, host, pid, now = want.owner, want.lease_seconds, want.host, want.pid, want.now
        here = socket.gethostname()
        query = claimable_runs(teams=want.teams, host=here, dead_pids=want.dead, now=now, skip=want.skip)
        row = conn.execute(query, {"p_now": now}).first()
        if row is None:
            return None
        # As anyone's: the claimant's own lease too is taken only once expired, or its process gone.
        reason = takeover_reason(row, NOBODY, float(row.db_now))
        if reason is None:  # a pid another holder (another PID namespace) still uses: not this one
            return None
        token = S.next_token(conn)  # after the row's lock (SQLite: the write lock)
        params = {"p_run_id": row.run_id, "p_old_token": row.fencing_token, "p_token": token, "p_now": now}
        lease = {
            "p_owner": owner,
            "p_host": host,
            "p_pid": pid,
            "p_process": process_identity(pid),
            "p_seconds": lease_seconds,
        }
        early = reason.startswith("holder process")
        expires = conn.execute(S.UPDATE_LEASE, {**params, **lease, "p_early": early}).scalar()
        if expires is None:
            return None  # changed under us (SQLite cannot lock it); the next poll tries again
        expires = float(expires)
        conn.execute(sa.update(queue).where(queue.c.run_id == row.run_id).values(**want.claimed(expires)))
        return Claim(
            run_id=row.run_id,
            kind="run",
            owner=owner,
            fencing_token=token,
            expires_at=expires,
            team=row.team,
            task=None if row.task is None else loads(row.task),
            status=row.status,
            reason="free" if row.lease_owner is None else reason,
            attempts=int(row.attempts),
        )

    def _claim_submission(self, conn: sa.Connection, want: _Wanted) -> Claim | None:
        owner, lease_seconds, now = want.owner, want.lease_seconds, want.now
        here = socket.gethostname()
        query = claimable_submissions(teams=want.teams, host=here, dead_pids=want.dead, now=now)
        row = conn.execute(query, {"p_now": now}).mappings().first()
        if row is None:
            return None
        token = S.next_token(conn)  # claim tokens from the same counter: never repeated for a run id
        expires = float(row["db_now"]) + lease_seconds  # by the lease clock, as run leases
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
            task=None if row["task"] is None else loads(row["task"]),
            status=None,
            reason="submitted" if row["claimed_by"] is None else "the previous claim expired or died",
            attempts=int(row["attempts"]),
        )

    def release_claim(self, claim: Claim) -> bool:
        """Give back what :meth:`claim` took, if it is still held with the claim's token.

        A ``"run"`` claim releases the run's lease (a no-op once the worker's team re-acquired it);
        a ``"submission"`` claim frees the submission for another worker.
        """
        with (
            self._guard(f"releasing the claim on run {claim.run_id}", claim.run_id),
            self._e.write.begin() as conn,
        ):
            if claim.kind == "run":  # the run's lease, as Store.release_lease releases it
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
        values = {"not_before": retry_at, "last_error": error[:4000]}
        with self._guard(f"recording a failure of run {run_id}", run_id), self._e.write.begin() as conn:
            return _note(conn, run_id, values, count=True)

    def record_error(self, run_id: str, *, error: str) -> None:
        """Keep ``error`` as the run's last error (``runs show``), counting no attempt and leaving its
        back-off alone: a run that failed outside a worker pool. Works for runs that were never
        submitted, too."""
        with self._guard(f"recording the error of run {run_id}", run_id), self._e.write.begin() as conn:
            _note(conn, run_id, {"last_error": error[:4000]}, count=False)


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
