"""Store methods: managing runs from outside their driver: cancel, retry, delete, prune, statistics and
progress (over ``_storage/admin.py`` and ``_storage/retention.py``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from graphflow_durable._storage import admin, retention
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.admin import Cancellation, Progress, Retry
from graphflow_durable._storage.retention import Removal, StoreStats
from graphflow_durable._storage.rows import not_found
from graphflow_durable._store.base import StoreBase

__all__ = ["OperationMethods"]


class OperationMethods(StoreBase):
    """Operations on runs from any process: cancel, retry, delete, prune, stats, progress."""

    def cancel_run(self, run_id: str) -> Cancellation:
        """Cancel a run, from any process.

        A run a live driver holds gets a cancel *request*: the driver learns of it when it next
        renews its lease (every third of its lease period), stops dispatching, lets the agents
        already running answer (recorded as usual), and records the run ``cancelled``, all within
        one lease period. A pending request is honoured by whichever driver holds the run next (the
        one asked may die first). A run nobody holds (interrupted, failed, or whose driver's lease
        ran out) is ``cancelled`` at once, no step written, its fencing token moved on. ``run()``
        with no task resumes a cancelled run; worker pools do not claim it until :meth:`retry_run`.

        Raises:
            RunNotFoundError: no such run.
            RunStateError: the run's last round ended (``stopped``, ``finished``): nothing to cancel.
        """
        with self._guard(f"cancelling run {run_id}", run_id), self._e.write.begin() as conn:
            return admin.cancel(conn, run_id, time.time())

    def retry_run(self, run_id: str) -> Retry:
        """Queue a failed, cancelled or interrupted run again for the worker pool: a cancelled run
        becomes ``interrupted`` (claimable), and the retry back-off of its queue row is cleared (the
        failure count is kept). A request for human input whose deadline passed with no default
        answer (``InputDeadlineError``: the pool leaves such a failed run alone) gets a new deadline,
        as long as its first, and is asked again (``Retry.asked_again``). Works on a submission
        whose run was never created, too.

        Raises:
            RunNotFoundError: no such run or submission.
            RunLockedError: a live driver holds the run (nothing to retry).
            RunStateError: the run's last round ended (``stopped``, ``finished``).
        """
        with self._guard(f"retrying run {run_id}", run_id), self._e.write.begin() as conn:
            return admin.retry(conn, run_id, time.time())

    def delete_run(self, run_id: str, *, force: bool = False, dry_run: bool = False) -> Removal:
        """Delete a run and everything of it, in one transaction: its steps, messages, agent states,
        queue row, and its nested runs (``parent_run_id`` equal to it, and the runs nested durable
        teams drove inside its turns: ``RUN/node/step/team``), recursively. A submission whose run
        was not created yet is deleted too. ``dry_run``: count, remove nothing.

        Raises:
            RunNotFoundError: no such run or submission.
            RunStateError: it (or a nested run) is ``running`` or held by a live driver, and
                ``force`` is false. With ``force`` it is deleted anyway; its driver fails on its next
                write (:class:`RunNotFoundError`) and writes nothing.
        """
        engine = self._e.read if dry_run else self._e.write
        with self._guard(f"deleting run {run_id}", run_id), engine.begin() as conn:
            return retention.delete(conn, run_id, time.time(), force=force, dry_run=dry_run)

    def prune(
        self,
        *,
        older_than: float,
        status: str | Sequence[str] = "finished",
        dry_run: bool = True,
        force: bool = False,
    ) -> Removal:
        """Retention: delete the runs with ``status`` (default ``finished``) last updated more than
        ``older_than`` seconds ago, each with its nested runs, as :meth:`delete_run` does.

        A dry run by default: it returns what would be removed and removes nothing; pass
        ``dry_run=False`` to delete. Runs ``running`` or held by a live driver are skipped (listed
        in ``skipped``) unless ``force``; naming ``status="running"`` needs ``force``.

        Raises:
            UsageError: an unknown status, or ``older_than`` negative or not finite.
            RunStateError: ``status`` includes ``running`` and ``force`` is false.
        """
        statuses = [status] if isinstance(status, str) else list(status)
        retention.check_prune(statuses, older_than, force)
        engine = self._e.read if dry_run else self._e.write
        with self._guard("pruning runs"), engine.begin() as conn:
            return retention.prune(conn, statuses, older_than, time.time(), force=force, dry_run=dry_run)

    def stats(self) -> StoreStats:
        """Runs per status, submissions waiting for a worker, and rows and bytes per table."""
        with self._guard("reading the store's statistics"), self._e.read.begin() as conn:
            return retention.stats(conn)

    def progress(self, run_id: str) -> Progress:
        """How many rounds the run began, and its head step's kind, node and time.

        Raises:
            RunNotFoundError: no such run.
        """
        with self._guard(f"reading run {run_id}", run_id), self._e.read.begin() as conn:
            row = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first()
            if row is None:
                raise not_found(run_id)
            return admin.progress(conn, run_id, int(row.head_seq))
