"""The run's lease as one driver holds it: its fencing token, when it was last confirmed, renewal,
and a brief hold for one write outside a run; and the run's key (:class:`RunKey`).

:class:`RunLease` is held by the :class:`~graphflow_durable._runtime.session.RunSession` and is the
one owner of the token and of the monotonic time of the last successful acquisition or renewal. It
knows the run by its frozen key and reports a lost lease, a halt or a cancel to the run's control
(:class:`~graphflow_durable._runtime.stops.RunControl`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from graphflow_durable._runtime.stops import RunControl
from graphflow_durable._storage.lease import iso
from graphflow_durable._storage.sealing import openable
from graphflow_durable.errors import LeaseLostError, RunNotFoundError, StateFormatError, StoreError
from graphflow_durable.store import RunRecord, Store

__all__ = ["RunKey", "RunLease"]

#: The lease acts for DurableGraphFlow: it logs as the flow does, so log filters keep working.
logger = logging.getLogger("graphflow_durable.flow")


@dataclass(frozen=True)
class RunKey:
    """Which run a driver drives, and as whom: the store (its driver object for commits and
    leases), the run id, the lease owner and the lease period."""

    store: Store
    run_id: str
    owner: str
    lease_seconds: float


class RunLease:
    """The lease of a session's run.

    :meth:`keep` renews it every ``lease_seconds / 3`` (at least 0.05 s) and retries through a
    database outage. The lease remembers, by the monotonic clock, when the last acquisition or
    renewal that succeeded was sent (:attr:`confirmed_at`); it is *fresh* while less than
    ``lease_seconds - margin`` has passed since (margin: ``max(lease_seconds / 3, 0.05)``). When it
    is not fresh the renewer halts the run (no new dispatch; the run is left to be resumed), and
    before each dispatch the manager calls :meth:`valid`, which asks the database (one renewal)
    unless the lease is fresh, and halts instead of dispatching when that fails.

    The window that remains: a dispatch decided with a fresh lease may start an agent up to
    ``margin`` before the lease expires in the database, and an agent already running is not
    stopped when the lease is lost (its answer is then refused by the fencing token, never
    recorded twice). A process paused (SIGSTOP, a VM freeze) between the check and the dispatch
    message itself would wake up past its margin: the participant's container checks the clock
    once more (:meth:`may_start`) immediately before it calls the agent, and does not start the
    turn then. What is left is a freeze between that last comparison and the agent's first
    statement, a few statements wide. The monotonic clock must not stop
    while the process runs (it does not count a suspended host on every platform).

    A renewal refuses an expired lease, even one nobody took (the run's queue and partition counted
    it free meanwhile): a driver frozen past its lease loses it when it wakes, and starts no turn.

    A renewal also learns of a cancel requested from another process (``Store.cancel_run``): the
    session then stops dispatching, and no dispatch is :meth:`valid` after it.
    """

    def __init__(self, key: RunKey, control: RunControl, has_run: Callable[[], bool]) -> None:
        self._key = key
        self._control = control
        self._has_run = has_run  # whether the run is stored as this driver made or found it
        self.token = 0
        self.confirmed_at = -math.inf  # monotonic time the last successful acquire/renew was sent
        self.released = False  # a commit of the session gave the lease up (the round's last one)
        # How long after a confirmation the lease is fresh: the key (its lease period) is this
        # lease's for good, and fresh() runs twice per transition.
        self._fresh_for = self.seconds - self.margin

    @property
    def seconds(self) -> float:
        return self._key.lease_seconds

    @property
    def margin(self) -> float:
        """How long before the lease's expiry this driver stops dispatching (seconds)."""
        return max(self.seconds / 3, 0.05)

    def fresh(self) -> bool:
        """Whether the lease is surely still ours by the monotonic clock (no database call)."""
        return time.monotonic() - self.confirmed_at < self._fresh_for

    async def may_start(self, node: str) -> bool:
        """Just before ``node``'s agent starts: whether the lease is still ours.

        The manager checked the lease before it dispatched the turn; a process frozen (SIGSTOP, a
        VM pause) after that check wakes up here past its margin, when another driver may have
        taken the run over and run this very turn. So the container asks once more, as the
        manager does: by the monotonic clock (no I/O) while the lease is fresh, else by one
        renewal, which a takeover refuses. When the lease is not ours the run is halted, as when
        the manager's own check fails, and the turn is not started (it stays in flight: the next
        driver runs it). A run not created yet has no stored lease to lose.
        """
        if self.fresh() or not self._has_run():
            return True
        elapsed = time.monotonic() - self.confirmed_at
        if await self._confirmed():
            return True
        logger.warning(
            "run %s: the lease, last confirmed %.2f s before %s's turn was about to start (lease "
            "%.2f s), is no longer this worker's; it does not start it, stops dispatching and leaves "
            "the run to be resumed",
            self._key.run_id,
            elapsed,
            node,
            self.seconds,
        )
        return False

    def unrenewed(self) -> str:
        """The stop reason of a round halted because the lease could not be confirmed."""
        since = time.time() - (time.monotonic() - self.confirmed_at)
        return (
            f"run {self._key.run_id}: stopped dispatching: the lease could not be renewed since "
            f"{iso(since) if math.isfinite(since) else 'the run started'} (lease {self.seconds:g} s); "
            "run() resumes it"
        )

    def created(self, token: int | None, at: float) -> None:
        """The session created the run, leased to it with ``token``, in a call sent at ``at``.
        ``None``: the creation goes with the round's first commit, which draws the token
        (:meth:`issued` gives it); until then no token is the run's (0 never is)."""
        self.token, self.confirmed_at, self.released = token or 0, at, False

    def issued(self, token: int) -> None:
        """The run's creation was written, with ``token`` (drawn in its transaction)."""
        self.token = token

    def given_up(self) -> None:
        """A commit of this driver gave the lease up (the round's last one)."""
        self.released = True

    def abandon(self) -> None:
        """Turns abandoned after an interrupt may still end in this process: no write of theirs may
        land on the run another process now drives (a token no lease ever has)."""
        self.token = -1

    def take(self) -> int:
        """Acquire the run's lease for the session's owner and process; the new fencing token."""
        key = self._key
        started = time.monotonic()
        self.token = key.store._driver.acquire_lease(
            key.run_id,
            key.owner,
            lease_seconds=self.seconds,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        self.confirmed_at, self.released = started, False
        return self.token

    @contextmanager
    def briefly(self) -> Iterator[RunRecord]:
        """Hold the run's lease for one write outside a run (reset, load_state); yield its record.

        Raises RunLockedError when another live process drives the run.
        """
        key = self._key
        self.take()
        try:
            run = key.store.get_run(key.run_id)
            if run is None:  # pragma: no cover - a run is never deleted under a held lease
                raise StateFormatError(f"run {key.run_id!r} disappeared from the store", run_id=key.run_id)
            yield openable(run, key.store._e.url)
        finally:
            key.store._driver.release_lease(key.run_id, self.token)

    def renew(self) -> float | None:
        """Renew the lease once (raises what the store raises); on success, note when. Returns when a
        cancel of the run was requested from another process (``None``: it was not)."""
        key = self._key
        if not self._has_run():
            return None  # created with the round's first commit (or refused): no lease stored to renew
        started = time.monotonic()
        beat = key.store._driver.heartbeat(key.run_id, key.owner, self.token, lease_seconds=self.seconds)
        self.confirmed_at = started
        return beat.cancel_requested_at

    def _gave_up(self, exc: StoreError) -> bool:
        """Whether a failed renewal only found that this session released the lease itself: the
        round's last commit gives it up, and may land while a renewal is under way. Our token is
        still the run's (nobody took the lease over) and nobody holds it."""
        if self.released:
            return True
        return (
            isinstance(exc, LeaseLostError)
            and exc.owner is None
            and exc.current_token == exc.token == self.token
        )

    async def valid(self) -> bool:
        """Before a dispatch: whether the lease is still ours (by the monotonic clock, else by one
        renewal, in a thread: the event loop runs on while the database answers); when it is not,
        or the database cannot say, the run is halted."""
        if self._control.cancelling is not None:
            return False
        return self.fresh() or await self._confirmed()

    async def _confirmed(self) -> bool:
        """One renewal, in a thread: whether the lease is still ours; when it is not, or the
        database cannot say, or a cancel was requested, the run is halted (or cancelled)."""
        control = self._control
        try:
            requested = await asyncio.to_thread(self.renew)
        except (LeaseLostError, RunNotFoundError) as exc:
            control.lost(exc)
            return False
        except StoreError as exc:
            logger.warning(
                "run %s: the lease could not be confirmed before a dispatch (%s); this worker stops "
                "dispatching and leaves the run to be resumed",
                self._key.run_id,
                exc,
            )
            control.halt(self.unrenewed())
            return False
        if requested is not None:
            control.cancel(requested)
            return False
        return True

    async def keep(self) -> None:
        """Keep the lease alive while running, through database outages; on losing it, or when it
        could not be renewed for ``lease_seconds - margin``, stop dispatching."""
        control, run_id = self._control, self._key.run_id
        interval = max(self.seconds / 3, 0.05)
        outage: float | None = None  # monotonic start of the current outage
        while True:
            await asyncio.sleep(interval)
            try:
                # In a thread: the event loop (every other run of the process) does not wait on it.
                requested = await asyncio.to_thread(self.renew)
            except (LeaseLostError, RunNotFoundError) as exc:
                if not self._gave_up(exc):
                    control.lost(exc)
                return
            except StoreError as exc:
                if outage is None:
                    outage = time.monotonic()
                    logger.warning(
                        "run %s: renewing the lease failed (%s); retrying every %.2f s",
                        run_id,
                        exc,
                        interval,
                    )
                if not control.halted and not self.fresh():
                    logger.warning(
                        "run %s: the lease was not renewed for %.2f s (lease %.2f s); this worker stops "
                        "dispatching and leaves the run to be resumed",
                        run_id,
                        time.monotonic() - self.confirmed_at,
                        self.seconds,
                    )
                    control.halt(self.unrenewed())
                continue
            if requested is not None:
                control.cancel(requested)
            if outage is not None:
                logger.info(
                    "run %s: the lease is renewed again after %.2f s of failures",
                    run_id,
                    time.monotonic() - outage,
                )
                outage = None
