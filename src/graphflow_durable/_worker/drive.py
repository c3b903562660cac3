"""One claimed run driven by its team, and how the claim ended: the worker's outcome policy.

What the run raised decides the outcome, as the :mod:`graphflow_durable.worker` docstring lists
(lost, deferred, failed after the longest or an exponential back-off); a run that returned is
judged by its stored status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from graphflow_durable._worker.backoff import DatabaseBackoff, one_line
from graphflow_durable.errors import (
    ConflictError,
    InputDeadlineError,
    LeaseLostError,
    RunLockedError,
    SchemaVersionError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Claim, Store

__all__ = ["Ended", "Outcome", "RunDriver"]

_log = logging.getLogger("graphflow_durable.worker")  # the pool's logger, wherever its parts live

Outcome = Literal[
    "finished", "stopped", "waiting", "cancelled", "interrupted", "failed", "lost", "deferred", "halted"
]

Ended = tuple[Outcome, str | None]
"""How a claim ended: the outcome and what to say about it (an error, a stop reason), if anything."""


class RunDriver:
    """Drives claimed runs for one worker and gives their claims back (recording failures).

    Args:
        owner: the worker's id (the team's lease owner, and the log lines').
        backoff_seconds, max_backoff_seconds: a failed run is retried after
            ``backoff_seconds * 2 ** attempts``, at most ``max_backoff_seconds``; a caller's mistake
            after ``max_backoff_seconds``.
        database: the worker's pause after database problems, which a database failure extends.
    """

    def __init__(
        self, owner: str, backoff_seconds: float, max_backoff_seconds: float, database: DatabaseBackoff
    ) -> None:
        self._owner = owner
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._database = database

    async def drive(self, store: Store, claim: Claim, build: Callable[[], DurableGraphFlow]) -> Ended:
        """Build the claimed run's team with ``build``, run it, and say how the claim ended.

        A cancellation (the worker halting the run) propagates; every other error is an outcome.
        """
        run_id = claim.run_id
        try:
            team = build()
            if team.run_id != run_id:
                raise UsageError(
                    f"the team factory for {claim.team!r} built a team for run {team.run_id!r}, not "
                    f"{run_id!r}; pass run_id=run_id and the other keyword arguments to DurableGraphFlow",
                    run_id=run_id,
                    option="run_id",
                )
            run = store.get_run(run_id)
            # A submitted task starts the run; once its round has started, resuming needs no task
            # (and the same task again would be recognised and not added twice anyway).
            start = claim.task if claim.task is not None and (run is None or run.task is None) else None
            await team.run(task=start)
        except (LeaseLostError, RunLockedError, ConflictError) as exc:
            # Another worker took the run over (this one was paused or too slow) or created it
            # first: the fencing token stopped every write; there is nothing to record here.
            self._give_back(store, claim)
            return "lost", str(exc)
        except (UsageError, SchemaVersionError) as exc:
            # A caller's mistake or bad configuration (a changed graph, a factory that builds another
            # run, a database newer than this package): it fails the same way until someone fixes
            # it, so it waits the longest back-off.
            self._give_back(store, claim)
            error = f"{type(exc).__name__}: {exc}"
            self._record_failure(store, claim, error, self._max_backoff)
            return (
                "failed",
                f"{error} (a mistake in the team or its configuration; retry in {self._max_backoff:g} s)",
            )
        except StoreError as exc:
            if isinstance(exc, StoreCorruptError):
                return self._failed(store, claim, exc)
            # The database failed, not the run: count no attempt against the run, pause this
            # worker's claims, and give the claim back (the run is claimed again later).
            pause = self._database.problem(f"driving run {run_id}", exc)
            self._give_back(store, claim)
            return "deferred", f"database problem (claims paused {pause:.3g} s; no attempt counted)"
        except InputDeadlineError as exc:
            # A request for a person passed its deadline with no default: the run fails the same
            # way until it is answered or retried (the claim query leaves it alone until then), so
            # no back-off: an answer makes it claimable at once.
            self._give_back(store, claim)
            error = f"{type(exc).__name__}: {exc}"
            self._record_failure(store, claim, error, 0.0)
            return "failed", f"{error} (left alone until answered or retried)"
        except Exception as exc:  # noqa: BLE001 -- the worker outlives any one run's failure
            return self._failed(store, claim, exc)
        try:
            final = store.get_run(run_id)
        except StoreError as exc:
            self._database.problem(f"reading run {run_id}", exc)
            return "interrupted", f"the run's status could not be read: {exc}"
        status = None if final is None else final.status
        if status == "finished":
            return "finished", None
        if status in ("stopped", "waiting"):
            result = final.result if final is not None and isinstance(final.result, dict) else {}
            return ("stopped" if status == "stopped" else "waiting"), result.get("stop_reason")
        if status == "cancelled":
            return "cancelled", "on request; 'graphflow-durable runs retry' queues it again"
        if final is not None and final.lease_owner not in (None, self._owner):
            return "lost", f"run {run_id} is now driven by {final.lease_owner}"
        return "interrupted", f"status {status}"

    def _failed(self, store: Store, claim: Claim, exc: BaseException) -> Ended:
        """The run's own failure (its team or an agent raised): count it, retry after a back-off."""
        self._give_back(store, claim)
        delay = min(self._backoff * 2**claim.attempts, self._max_backoff)
        error = f"{type(exc).__name__}: {exc}"
        self._record_failure(store, claim, error, delay)
        _log.debug("run %s failed", claim.run_id, exc_info=exc)
        return "failed", f"{error} (retry in {delay:g} s)"

    def _give_back(self, store: Store, claim: Claim) -> None:
        """Release the claim; if the database fails here, say so (the lease or claim then expires)."""
        try:
            store.queue.release_claim(claim)
        except StoreError as exc:
            _log.error(
                "worker %s: database problem while releasing the claim on run %s (it expires in %g s): %s",
                self._owner,
                claim.run_id,
                max(claim.expires_at - time.time(), 0.0),
                one_line(exc),
            )

    def _record_failure(self, store: Store, claim: Claim, error: str, delay: float) -> None:
        try:
            store.queue.record_failure(claim.run_id, error=error, retry_at=time.time() + delay)
        except StoreError as exc:
            _log.error(
                "worker %s: database problem while recording a failure of run %s (not recorded): %s",
                self._owner,
                claim.run_id,
                one_line(exc),
            )
