"""A worker that claims runs from a store and drives them to completion; run several for a pool.

Each worker polls ``store.queue.claim()`` for work its teams can do -- submitted runs (see
``store.queue.submit()``), interrupted runs, and runs whose driver died (lease expired, or a
dead process on this host) -- builds the team with its factory and calls ``run()``. Any number of
workers, in any number of processes and machines, may share one PostgreSQL database (or one SQLite
file on one machine): a run is driven by one worker at a time (leases with fencing tokens), and a
crashed worker's runs are taken over by the others.

Guarantees (see docs/worker-pool.md): every committed agent completion is recorded exactly once;
an agent that was running when its worker died runs again (at-least-once execution), at most
``max_crash_attempts`` times per turn, then the run ends ``failed`` (once more, driven alone by
a worker that claims nothing else meanwhile, when each of those deaths was shared with the same
other run's turn: a healthy run never fails for another's crash loop); takeover happens when the
lease expires, or at once when the dead worker was a process on the same host. A failed run is
never claimed again on its own: ``graphflow-durable runs retry`` (``Store.retry_run``) queues it.
No worker sits on a run for a retry's back-off of a second or more: its team leaves the run
``interrupted`` for it, and any worker claims it once due (``RELEASE_BACKOFF`` in the manager).

What a worker does when a run raises depends on the error's category (see :mod:`graphflow_durable.errors`):

- another worker holds or took the run (:class:`LeaseLostError`, :class:`RunLockedError`,
  :class:`ConflictError`): ``"lost"``; nothing is recorded, no attempt is counted;
- the database failed (a :class:`StoreError` that is none of those): ``"deferred"``; not the run's
  failure, so no attempt is counted: the claim is given back and this worker pauses its claims for
  a back-off (logged as a database problem);
- a caller's mistake or bad configuration (:class:`UsageError`: :class:`GraphMismatchError`, a team
  factory that built another run, a :class:`SchemaVersionError`...): ``"failed"``, retried only
  after ``max_backoff_seconds`` (the same mistake fails the same way: no hot retry loop);
- anything else (an agent or the team raised, :class:`StoreCorruptError`): ``"failed"``; a run its
  team recorded ``failed`` (an agent's error, a spent budget) is left alone until ``runs retry``,
  one whose status says otherwise is retried after an exponential back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal, Protocol

from opentelemetry.metrics import MeterProvider

from graphflow_durable._runtime.offloop import off_loop
from graphflow_durable._runtime.telemetry import PoolMetrics
from graphflow_durable._storage.flowcontrol import check_queue_name
from graphflow_durable._storage.urls import safe_url
from graphflow_durable.crypto import Codec
from graphflow_durable.errors import (
    ConflictError,
    InputDeadlineError,
    LeaseLostError,
    RunLockedError,
    SchemaVersionError,
    StoreConfigError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Claim, Store

__all__ = ["RunOutcome", "TeamFactory", "Worker", "check_options"]

_log = logging.getLogger(__name__)


class TeamFactory(Protocol):
    """Builds the team for ``run_id``, forwarding the keyword arguments to :class:`DurableGraphFlow`::

        def make_team(run_id: str, **durable: Any) -> DurableGraphFlow:
            return DurableGraphFlow(agents(), graph(), run_id=run_id, **durable)

    The keywords are ``store`` (the worker's :class:`Store`), ``lease_owner`` (the worker's id: the
    team takes over the lease the worker claimed) and ``lease_seconds``. Build fresh agents on every
    call: a worker drives several runs, and a run resumes in a fresh team.
    """

    def __call__(
        self, run_id: str, /, *, store: Store, lease_owner: str, lease_seconds: float
    ) -> DurableGraphFlow: ...


Outcome = Literal[
    "finished", "stopped", "waiting", "cancelled", "interrupted", "failed", "lost", "deferred", "halted"
]
"""How a claim ended in a worker (:class:`RunOutcome` describes each value)."""


@dataclass(frozen=True)
class RunOutcome:
    """How one claim ended in this worker.

    ``outcome`` is ``"finished"`` (the graph completed); ``"stopped"`` (the termination condition
    or ``max_turns`` ended the round: the run is done for the pool, and ``run()`` with no task
    continues it); ``"waiting"`` (a node waits for human input: an answer, ``Store.respond`` or
    ``graphflow-durable runs respond``, makes the run claimable again); ``"cancelled"``
    (``Store.cancel_run`` stopped it: the pool leaves it alone until ``Store.retry_run``);
    ``"interrupted"`` (the team stopped before the end, e.g. it was
    halted, or it released the run for a node's retry back-off: ``error`` says until when); ``"failed"`` (the team raised; a run recorded ``failed`` is left alone until
    ``Store.retry_run``, any other is retried after a back-off, the longest one for a caller's
    mistake or bad configuration); ``"lost"`` (another worker
    took the run over or got it first: this worker wrote nothing more); ``"deferred"`` (the
    database failed: no attempt was counted against the run, which is claimed again later);
    ``"halted"`` (this worker was stopped and cancelled the run, which is left interrupted for
    another worker).
    """

    run_id: str
    outcome: Outcome
    claim: Claim
    seconds: float
    error: str | None = None


def check_options(
    *,
    concurrency: int = 1,
    poll_interval: float = 0.5,
    lease_seconds: float = 30.0,
    grace_seconds: float = 30.0,
    backoff_seconds: float = 1.0,
    max_backoff_seconds: float = 300.0,
) -> None:
    """Refuse option values a :class:`Worker` cannot work with (:class:`UsageError`, naming the option)."""
    if concurrency < 1:
        raise UsageError(f"concurrency must be at least 1, not {concurrency}", option="concurrency")
    for option, value, positive in (
        ("poll_interval", poll_interval, True),
        ("lease_seconds", lease_seconds, True),
        ("grace_seconds", grace_seconds, False),
        ("backoff_seconds", backoff_seconds, False),
        ("max_backoff_seconds", max_backoff_seconds, False),
    ):
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "greater than 0" if positive else "0 or more"
            raise UsageError(f"{option} must be a number {bound}, not {value}", option=option)


# -- a claim's outcome, the pause after database problems, the stop ----------------------------

_Ended = tuple[Outcome, str | None]
"""How a claim ended: the outcome and what to say about it (an error, a stop reason), if anything."""


def _passing(exc: StoreError) -> bool:
    """Whether ``exc`` is a database problem that may pass (not a bad URL, a foreign database, a
    newer schema or corrupt rows: those stay until someone acts)."""
    return not isinstance(exc, (UsageError, SchemaVersionError, StoreCorruptError))


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one log line (libpq's messages span several)."""
    return " ".join(str(exc).split())


class _DatabaseBackoff:
    """Database errors in a row (claims and runs) of one worker, and the claim pause they set.

    Args:
        owner: the worker's id, for the log lines.
        backoff_seconds, max_backoff_seconds: the first pause, and the longest.
    """

    def __init__(self, owner: str, backoff_seconds: float, max_backoff_seconds: float) -> None:
        self._owner = owner
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._failures = 0  # database errors in a row
        self._since = 0.0  # monotonic time of the first of them
        self.resume_at = 0.0  # monotonic time before which nothing is claimed

    def problem(self, action: str, exc: StoreError) -> float:
        """Log a database error (not any run's fault) in one line and pause claiming; return the pause.

        The pause doubles with each problem in a row; problems during a pause (the other runs in
        flight hitting the same outage) do not lengthen it.
        """
        now = time.monotonic()
        if now < self.resume_at:
            pause = self.resume_at - now
        else:
            if self._failures == 0:
                self._since = now
            self._failures += 1
            pause = min(self._backoff * 2.0 ** (self._failures - 1), self._max_backoff)
            self.resume_at = now + pause
        # A sealed row this worker holds no key for is no outage: it stays until the worker gets the key.
        keyless = isinstance(exc, StoreConfigError) and exc.option == "codec"
        _log.error(
            "worker %s: %s while %s (claims paused %.3g s): %s",
            self._owner,
            "no key for sealed work" if keyless else "database problem",
            action,
            pause,
            _one_line(exc),
        )
        return pause

    def back(self) -> None:
        """The database answered: after problems, say so once and reset the back-off."""
        if self._failures:
            _log.warning(
                "worker %s: the database is back after %.1f s of problems; claims resumed",
                self._owner,
                time.monotonic() - self._since,
            )
        self._failures = 0


class _RunDriver:
    """Drives claimed runs for one worker and gives their claims back (recording failures): the
    worker's outcome policy. What the run raised decides the outcome, as the module docstring lists;
    a run that returned is judged by its stored status.

    Args:
        owner: the worker's id (the team's lease owner, and the log lines').
        backoff_seconds, max_backoff_seconds: a run that raised without being recorded ``failed``
            (e.g. a corrupt store) is retried after ``backoff_seconds * 2 ** attempts``, at most
            ``max_backoff_seconds``; a caller's mistake after ``max_backoff_seconds``.
        database: the worker's pause after database problems, which a database failure extends.
    """

    def __init__(
        self, owner: str, backoff_seconds: float, max_backoff_seconds: float, database: _DatabaseBackoff
    ) -> None:
        self._owner = owner
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._database = database

    async def drive(
        self,
        store: Store,
        claim: Claim,
        build: Callable[[], DurableGraphFlow],
        stale: Callable[[], str | None],
    ) -> _Ended:
        """Build the claimed run's team with ``build``, run it, and say how the claim ended.

        ``stale`` says why the claim may no longer be this worker's (``None``: it surely is); it is
        asked just before the team runs: a worker paused since it claimed does not start the run's
        turns (its queue's and partition's caps counted the claim free once it expired).
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
            team._release_backoffs()  # no worker sits on a run for a retry's back-off
            if claim.alone:
                team._drive_alone()
            run = await off_loop(lambda: store.get_run(run_id))
            # A submitted task starts the run; once its round has started, resuming needs no task
            # (and the same task again would be recognised and not added twice anyway).
            start = claim.task if claim.task is not None and (run is None or run.task is None) else None
            why = stale()
            if why is not None:
                await self._give_back(store, claim)
                return "lost", why
            outcome = await team.run(task=start)
        except (LeaseLostError, RunLockedError, ConflictError) as exc:
            # Another worker took the run over (this one was paused or too slow) or created it
            # first: the fencing token stopped every write; there is nothing to record here.
            await self._give_back(store, claim)
            return "lost", str(exc)
        except (UsageError, SchemaVersionError) as exc:
            # A caller's mistake or bad configuration (a changed graph, a factory that builds another
            # run, a database newer than this package): it fails the same way until someone fixes
            # it, so it waits the longest back-off.
            await self._give_back(store, claim)
            error = f"{type(exc).__name__}: {exc}"
            await self._record_failure(store, claim, error, self._max_backoff)
            return (
                "failed",
                f"{error} (a mistake in the team or its configuration; retry in {self._max_backoff:g} s)",
            )
        except StoreError as exc:
            if isinstance(exc, StoreCorruptError):
                return await self._failed(store, claim, exc)
            # The database failed, not the run: count no attempt against the run, pause this
            # worker's claims, and give the claim back (the run is claimed again later).
            pause = self._database.problem(f"driving run {run_id}", exc)
            await self._give_back(store, claim)
            return "deferred", f"database problem (claims paused {pause:.3g} s; no attempt counted)"
        except InputDeadlineError as exc:
            # A request for a person passed its deadline with no default: the run fails the same
            # way until it is answered or retried (the claim query leaves it alone until then), so
            # no back-off: an answer makes it claimable at once.
            await self._give_back(store, claim)
            error = f"{type(exc).__name__}: {exc}"
            await self._record_failure(store, claim, error, 0.0)
            return "failed", f"{error} (left alone until answered or retried)"
        except Exception as exc:  # noqa: BLE001 -- the worker outlives any one run's failure
            return await self._failed(store, claim, exc)
        try:
            final = await off_loop(lambda: store.get_run(run_id))
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
        # A run released for a node's back-off says until when (its stop reason).
        return "interrupted", outcome.stop_reason or f"status {status}"

    async def _failed(self, store: Store, claim: Claim, exc: BaseException) -> _Ended:
        """The run's own failure (its team or an agent raised): count it; a run recorded ``failed``
        waits for ``runs retry`` (the claim query leaves it alone), any other for a back-off."""
        await self._give_back(store, claim)
        delay = min(self._backoff * 2**claim.attempts, self._max_backoff)
        error = f"{type(exc).__name__}: {exc}"
        await self._record_failure(store, claim, error, delay)
        _log.debug("run %s failed", claim.run_id, exc_info=exc)
        try:
            run = await off_loop(lambda: store.get_run(claim.run_id))
        except StoreError:
            run = None
        if run is not None and run.status == "failed":
            return "failed", f"{error} (left alone until 'graphflow-durable runs retry {claim.run_id}')"
        return "failed", f"{error} (retry in {delay:g} s)"

    async def _give_back(self, store: Store, claim: Claim) -> None:
        """Release the claim; if the database fails here, say so (the lease or claim then expires)."""
        try:
            await off_loop(lambda: store.queue.release_claim(claim))
        except StoreError as exc:
            _log.error(
                "worker %s: database problem while releasing the claim on run %s (it expires in %g s): %s",
                self._owner,
                claim.run_id,
                max(claim.expires_at - time.time(), 0.0),
                _one_line(exc),
            )

    async def _record_failure(self, store: Store, claim: Claim, error: str, delay: float) -> None:
        try:
            await off_loop(
                lambda: store.queue.record_failure(claim.run_id, error=error, retry_at=time.time() + delay)
            )
        except StoreError as exc:
            _log.error(
                "worker %s: database problem while recording a failure of run %s (not recorded): %s",
                self._owner,
                claim.run_id,
                _one_line(exc),
            )


async def _drain(
    tasks: set[asyncio.Task[None]], wake: asyncio.Event, grace_seconds: float, halting: Callable[[], bool]
) -> None:
    """Wait for ``tasks`` (removing each as it ends) up to ``grace_seconds``, then cancel the rest and
    wait for them; ``wake`` is set on every stop request, and ``halting()`` says whether to halt now.

    A cancelled team stops dispatching and waits for its running agents' answers, at most its
    ``interrupt_grace_seconds``; once ``halting()``, each is cancelled a second time and stops waiting.
    """
    if not tasks:
        return
    deadline = time.monotonic() + grace_seconds
    while tasks and not halting():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        wake.clear()
        waker = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait({*tasks, waker}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        waker.cancel()
        tasks -= done
    # Halt: each team stops dispatching and waits for its running agents' answers, at most its
    # interrupt_grace_seconds. A signal during that wait (the second one) halts them at once.
    for task in tasks:
        task.cancel()
    recancelled = False
    while tasks:
        if halting() and not recancelled:
            recancelled = True
            await asyncio.sleep(0.01)  # the teams took the first cancellation and are waiting
            for task in tasks:
                task.cancel()  # a second one: each team stops waiting for its agents
            continue
        wake.clear()
        waker = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait({*tasks, waker}, return_when=asyncio.FIRST_COMPLETED)
        waker.cancel()
        tasks -= done


class Worker:
    """Claims runs whose team it knows and drives up to ``concurrency`` of them at a time.

    Args:
        store: a store URL or an open :class:`Store` (a URL is opened here and closed at the end).
            When the database cannot be reached yet (a worker started before its database, as
            containers often are), the worker logs it and keeps trying with the claim back-off
            once it runs, until the store opens or the worker is stopped; a bad URL, a database
            of another application or a newer schema raise here at once.
        factories: team key -> :class:`TeamFactory`; only runs submitted with one of these keys
            are claimed.
        team: a single factory instead, for a pool that runs one kind of team: every claimable
            run is claimed, including runs that were never submitted (no team key).
        concurrency: how many runs this worker drives at once (in one event loop).
        poll_interval: seconds between claims when there is nothing to do.
        lease_seconds: the lease of the runs this worker drives: how long a stopped or partitioned
            worker keeps its runs before another takes them over (a dead process on the same host
            loses them at once). Renewed every third of it while running.
        grace_seconds: after :meth:`request_stop`, how long in-flight runs may continue before they
            are halted: no new agent is dispatched, the agents already running may answer (and are
            recorded) within the team's ``interrupt_grace_seconds``, then the run is left
            interrupted, its lease released, for another worker. A second :meth:`request_stop`
            with ``halt`` (a second signal) stops waiting for those agents at once.
        backoff_seconds, max_backoff_seconds: a run whose team raised without recording it
            ``failed`` (a recorded failure waits for ``Store.retry_run``) is retried after
            ``backoff_seconds * 2 ** (failures - 1)``, at most ``max_backoff_seconds``; a run that
            failed on a caller's mistake (:class:`UsageError`) after ``max_backoff_seconds``. After
            a database error the worker claims nothing for the same growing back-off (reset by
            the next successful claim).
        owner: this worker's id (default ``host:pid:random``).
        meter_provider: the meter provider of the pool's metrics, ``graphflow_durable.queue.depth``
            (the items claimable now, observed when a reader collects),
            ``graphflow_durable.queue.claim.latency``, and per named queue (attribute ``queue``)
            ``graphflow_durable.queue.queued``, ``graphflow_durable.queue.active`` and the counter
            ``graphflow_durable.queue.throttled`` (claims that found nothing while a queue or
            partition was at a cap; attribute ``reason``) (default: the global one; nothing under
            ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``). A run's own metrics come from its team's.
        queues: the named queues this worker claims from (``None``: all).
        codec, allow_plaintext: the codec a store opened from a URL seals and opens its content
            with, and whether it reads plain rows too (see docs/encryption.md); an open
            :class:`Store` keeps its own.

    Raises:
        UsageError: (a ``ValueError``) neither or both of ``factories`` and ``team`` were given, or
            ``concurrency < 1``, or ``poll_interval``/``lease_seconds`` are not greater than 0, or
            ``grace_seconds``/``backoff_seconds``/``max_backoff_seconds`` are negative (or any of
            them is not finite); or the store URL is invalid, or names a database the store refuses
            (:class:`~graphflow_durable.errors.StoreConfigError`).
        SchemaVersionError: the database was written by a newer graphflow-durable.
    """

    def __init__(
        self,
        store: str | Store,
        factories: Mapping[str, TeamFactory] | None = None,
        *,
        team: TeamFactory | None = None,
        concurrency: int = 1,
        poll_interval: float = 0.5,
        lease_seconds: float = 30.0,
        grace_seconds: float = 30.0,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 300.0,
        owner: str | None = None,
        meter_provider: MeterProvider | None = None,
        queues: Sequence[str] | None = None,
        codec: Codec | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        if (factories is None) == (team is None):
            raise UsageError(
                "give Worker either factories={team key: factory} or team=factory, not both",
                option="factories",
            )
        check_options(
            concurrency=concurrency,
            poll_interval=poll_interval,
            lease_seconds=lease_seconds,
            grace_seconds=grace_seconds,
            backoff_seconds=backoff_seconds,
            max_backoff_seconds=max_backoff_seconds,
        )
        self._own_store = isinstance(store, str)
        self._url = safe_url(store) if isinstance(store, str) else store.url
        self._store_arg = store
        self._codec, self._allow_plaintext = codec, allow_plaintext
        self._store: Store | None = None if isinstance(store, str) else store
        self._factories = dict(factories) if factories is not None else {}
        self._single = team
        self._concurrency = concurrency
        self._poll = poll_interval
        self._lease = lease_seconds
        self._grace = grace_seconds
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.outcomes: list[RunOutcome] = []
        self._stopping = False
        self._halting = False
        self._wake: asyncio.Event | None = None
        # The runs this worker drives now. Their leases may have expired under its own id (its
        # driver could not renew in an outage) and be claimable again: not while that driver lives.
        self._driving: set[str] = set()
        self._alone = False  # driving a run that must be driven alone: claiming nothing else
        self._database = _DatabaseBackoff(self.owner, backoff_seconds, max_backoff_seconds)
        self._driver = _RunDriver(self.owner, backoff_seconds, max_backoff_seconds, self._database)
        self._queues = None if queues is None else [check_queue_name(q, "queues") for q in queues] or None
        self._metrics = PoolMetrics(meter_provider, self.owner, self._depth, self._queue_stats)
        if isinstance(store, str):
            try:
                self._store = Store(store, codec=codec, allow_plaintext=allow_plaintext)
                self._url = self._store.url
            except StoreError as exc:
                if not _passing(exc):
                    raise
                self._database.problem("opening the store", exc)  # run_forever() tries again

    @property
    def url(self) -> str:
        """The store's URL, password hidden."""
        return self._url

    @property
    def store(self) -> Store:
        """The worker's store.

        Raises:
            StoreError: the store is not open yet (its database could not be reached so far).
        """
        if self._store is None:
            raise StoreError(
                f"the store at {self._url} is not open yet: its database could not be reached so far "
                "(the running worker keeps trying)",
                url=self._url,
                action="opening the store",
            )
        return self._store

    @property
    def teams(self) -> list[str] | None:
        """The team keys this worker claims (``None``: any)."""
        return None if self._single is not None else sorted(self._factories)

    def request_stop(self, *, halt: bool = False) -> None:
        """Stop claiming; let in-flight runs finish within the grace period (``halt``: halt them now).

        Safe to call from a signal handler running in the worker's event loop.
        """
        self._stopping = True
        self._halting = self._halting or halt
        if self._wake is not None:
            self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop claiming and drain; a second signal halts in-flight runs at once.

        Call from inside the running event loop, in the main thread (Unix only). The handlers stay
        installed after the loop ends, until the process exits or the caller installs others: a
        signal while the process tears down (its loop closed, its threads joined) is logged and
        ignored instead of killing the process (exit 143).
        """
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            first = not self._stopping
            _log.warning(
                "worker %s: %s; %s",
                self.owner,
                signal.Signals(signum).name,
                "stopping: no new claims, in-flight runs may finish" if first else "halting in-flight runs",
            )
            self.request_stop(halt=not first)

        def handler(signum: int, frame: FrameType | None) -> None:
            # A Python-level handler, not loop.add_signal_handler(): the loop resets those to the
            # default action when it closes, and a signal during the teardown after it (a second
            # SIGTERM while the store closes and threads are joined) would kill the process.
            # Python runs this in the main thread between bytecodes, so the loop is not touched
            # concurrently; call_soon_threadsafe also wakes it from its select().
            if loop.is_closed():
                _log.info("worker %s: %s; already stopped, exiting", self.owner, signal.Signals(signum).name)
                return
            loop.call_soon_threadsafe(on_signal, signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, handler)

    async def run_forever(self) -> None:
        """Claim and drive runs until :meth:`request_stop`; then drain and return."""
        await self._loop(until_idle=False)

    async def run_until_idle(self) -> None:
        """Claim and drive runs until nothing is claimable and nothing is in flight (or a stop).

        A database problem while claiming pauses the claims; it does not end the loop. A run
        released for a retry's back-off is not claimable until it is due: this returns before it.
        """
        await self._loop(until_idle=True)

    # -- the loop ------------------------------------------------------------------------------

    async def _open(self) -> Store | None:
        """The store, opened from its URL if need be: a database problem is retried after the claim
        back-off until the store opens, or ``None`` once the worker was stopped meanwhile."""
        assert self._wake is not None
        while self._store is None and not self._stopping:
            pause = self._database.resume_at - time.monotonic()
            if pause > 0:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
                continue
            try:
                # In a thread: a connect that hangs (a partition) must not hold off the signals.
                self._store = await asyncio.to_thread(
                    Store, str(self._store_arg), codec=self._codec, allow_plaintext=self._allow_plaintext
                )
            except StoreError as exc:
                if not _passing(exc):
                    raise
                self._database.problem("opening the store", exc)
        if self._store is not None:
            self._database.back()
        return self._store

    def _queue_stats(self) -> list[dict[str, Any]] | None:
        """Each named queue's counts (the metrics reader's thread), ``None`` unknown."""
        store = self._store
        try:
            return None if store is None else store.queue.stats()
        except StoreError as exc:
            _log.debug("worker %s: counting the queues failed: %s", self.owner, exc)
            return None

    def _depth(self) -> int | None:
        """The items this worker could claim now (the metrics reader's thread), ``None`` unknown."""
        store = self._store
        try:
            return None if store is None else store.queue.depth(self.teams)
        except StoreError as exc:
            _log.debug("worker %s: counting the claimable work failed: %s", self.owner, exc)
            return None

    async def _loop(self, *, until_idle: bool) -> None:
        self._wake = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        try:
            store = await self._open()
            if store is None:
                return
            _log.info(
                "worker %s: started (teams %s, concurrency %d)", self.owner, self.teams, self._concurrency
            )
            while not self._stopping:
                claimed = False
                paused = time.monotonic() < self._database.resume_at
                while len(tasks) < self._concurrency and not (self._stopping or paused or self._alone):
                    asked = time.monotonic()
                    try:
                        claim = await self._claim(store)
                    except StoreError as exc:
                        self._database.problem("claiming work", exc)
                        paused = True
                        break
                    self._database.back()
                    if claim is None:
                        break
                    claimed = True
                    self._metrics.claimed(claim.claimable_since)
                    self._driving.add(claim.run_id)
                    self._alone = claim.alone  # a run to drive alone: nothing else until it is done
                    tasks.add(asyncio.ensure_future(self._drive(claim, asked)))
                if until_idle and not tasks and not claimed and not paused:
                    break
                self._wake.clear()
                waker = asyncio.ensure_future(self._wake.wait())
                done, _ = await asyncio.wait(
                    {*tasks, waker},
                    timeout=None if len(tasks) >= self._concurrency else self._poll,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waker.cancel()
                tasks -= done
        finally:
            await _drain(tasks, self._wake, self._grace, lambda: self._halting)
            _log.info("worker %s: stopped", self.owner)
            if self._own_store and self._store is not None:
                self._metrics.running = False
                self._store.close()

    async def _claim(self, store: Store) -> Claim | None:
        """One claim, off the event loop: on SQLite it may wait for another process's write up to
        the busy timeout, while this worker's lease renewals and its signals must not. ``None``:
        nothing claimable, or a stop came while it waited (a claim made after that is given back)."""
        assert self._wake is not None
        skip, alone = frozenset(self._driving), not self._driving

        def claim() -> Claim | None:
            return store.queue.claim(
                self.owner,
                lease_seconds=self._lease,
                teams=self.teams,
                skip=skip,
                alone=alone,
                queues=self._queues,
                throttled=self._metrics.throttled,
            )

        def give_back(late: Claim | None) -> None:
            if late is not None:
                store.queue.release_claim(late)

        claiming = asyncio.ensure_future(off_loop(claim, orphan=give_back))
        try:
            while not claiming.done():
                self._wake.clear()
                if self._stopping:
                    return None
                waker = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({claiming, waker}, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
            return claiming.result()
        finally:
            claiming.cancel()  # a no-op once done; else the call's late claim is given back

    def _stale(self, asked: float) -> str | None:
        """Why a claim asked for at monotonic time ``asked`` may no longer be this worker's (``None``:
        it surely is): the lease the claim took expires ``lease_seconds`` after it was written, and
        a driver stops dispatching a margin before that (see ``RunLease``)."""
        held = time.monotonic() - asked
        if held < self._lease - max(self._lease / 3, 0.05):
            return None
        return (
            f"the claim was made {held:.2f} s ago (lease {self._lease:g} s): its lease may have "
            "expired meanwhile (this worker was paused or slow), so the run is not started; its claim "
            "is given back for another claim"
        )

    def _factory(self, claim: Claim) -> TeamFactory:
        if self._single is not None:
            return self._single
        return self._factories[str(claim.team)]

    async def _drive(self, claim: Claim, asked: float) -> None:
        started = time.monotonic()
        run_id = claim.run_id

        def done(outcome: Outcome, error: str | None = None) -> None:
            self.outcomes.append(RunOutcome(run_id, outcome, claim, time.monotonic() - started, error))
            log = _log.warning if outcome in ("failed", "lost") else _log.info
            log("worker %s: run %s %s%s", self.owner, run_id, outcome, f": {error}" if error else "")

        def build() -> DurableGraphFlow:
            return self._factory(claim)(
                run_id, store=self.store, lease_owner=self.owner, lease_seconds=self._lease
            )

        _log.info("worker %s: claimed run %s (%s, %s)", self.owner, run_id, claim.kind, claim.reason)
        try:
            outcome, error = await self._driver.drive(self.store, claim, build, lambda: self._stale(asked))
        except asyncio.CancelledError:
            done("halted")
            raise
        finally:
            self._driving.discard(run_id)
            if claim.alone:
                self._alone = False
        done(outcome, error)
