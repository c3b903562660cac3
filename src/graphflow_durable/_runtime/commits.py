"""The write path of a run session: its transitions handed to the store's writer, and their outcomes.

:class:`Commits` is held by the :class:`~graphflow_durable._runtime.session.RunSession` and is the
one owner of the run's head, of the commits handed over and not waited for yet (a parallel batch's
answers), and of a new run's creation, which waits for the round's first commit to go with it. It
moves the head as the store's writer answers; the manager (through the session) is its one caller while a
run is under way. It knows the run by its frozen key, commits under its lease's token, and reports
a lost lease to the run's control: a completion goes down through it to the store, never back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from graphflow_durable._agentstate.encoder import StateLog
from graphflow_durable._model.codec import dumps
from graphflow_durable._model.records import ENDED_STATUSES
from graphflow_durable._runtime.runlease import RunKey, RunLease
from graphflow_durable._runtime.stops import RunControl
from graphflow_durable._runtime.telemetry import Telemetry
from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable._storage.lease import iso
from graphflow_durable._storage.writer import CancelRequested, Outcome
from graphflow_durable.errors import LeaseLostError, StoreError
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunRecord, RunUpdate, Step, StepKind

__all__ = ["Commits", "to_the_end"]

T = TypeVar("T")

#: The write path acts for DurableGraphFlow: it logs as the flow does, so log filters keep working.
logger = logging.getLogger("graphflow_durable.flow")


class Commits:
    """A run's commits: each at the expected head under the lease's fencing token.

    Args:
        key: the run.
        lease: the run's lease (its token; a creation issues it, the round's last commit gives it up).
        control: told of a lost lease.
        states: the agent-state writer (its rows are splices against what it last committed).
    """

    def __init__(self, key: RunKey, lease: RunLease, control: RunControl, states: StateLog) -> None:
        self._key = key
        self._lease = lease
        self._control = control
        self._states = states
        self.head = 0  # the run's head as this driver last wrote or read it
        # Commits handed over and not waited for yet (a batch's answers), with their expected heads;
        # a new run's creation is one of them (expected head 0, its future gives the run's record).
        self._unsettled: list[tuple[int, asyncio.Future[Any]]] = []
        # A new run (its first step and agent states), to be created with the first commit.
        self._creation: CreateRequest | None = None
        self._creating: asyncio.Future[RunRecord] | None = None  # handed over, not settled yet
        self._refused = False  # the creation failed: the run id is not this session's run
        # The commit handed over last: the writer writes in order, so once it is done all are.
        self._last: asyncio.Future[int] | None = None
        self.unrecorded = False  # a commit still handed over as the run ended failed (settle_at_end)
        # A failed attempt's step could not be written (see RunSession.detach): since the attach.
        self.failure_unrecorded = False
        # A cancel requested of the run (Store.cancel_run), as a settled commit's head move read it.
        self._cancel_seen: float | None = None
        self.telemetry = Telemetry()  # the session's (it sets its own): what a commit reports to

    @property
    def created(self) -> bool:
        """Whether the session's run exists as this session made or found it: not still to be
        created with the first commit, nor created by a commit not settled yet, nor refused (a
        run of that id made by another driver meanwhile)."""
        return self._creation is None and self._creating is None and not self._refused

    def attached(self) -> None:
        """A new attach: a creation the last one had refused says nothing of the run found now."""
        self._refused = False
        self.failure_unrecorded = False

    def at(self, head: int) -> None:
        """The run's head is ``head`` (read from the store, or written outside this path)."""
        self.head = head

    def create_with_first(self, request: CreateRequest) -> None:
        """Create the run (with its first step) together with the next commit: in one transaction,
        one fsync. Until then nothing of the run is in the store; the head is the first step's."""
        self._creation = request
        self.head = 1

    async def create(self, request: CreateRequest) -> RunRecord:
        """Create the run now (at head 0), alone; its record once it is durable."""
        run = await self._key.store._driver.submit_create_run(request)
        self.head = run.head_seq
        return run

    def _hand_over_creation(self) -> None:
        """Hand the run's creation (given to :meth:`create_with_first`) over, first among the commits
        not settled yet."""
        request = self._creation
        assert request is not None
        self._creation = None
        if self.telemetry.enabled:  # the run's trace context, in the transaction that creates it
            request = dataclasses.replace(request, trace_context=self.telemetry.take_pending())
        self._creating = self._key.store._driver.submit_create_run(request)
        self._unsettled.append((0, self._creating))

    async def write(
        self,
        step: Step,
        messages: Sequence[MessageRecord],
        states: Sequence[AgentStateRecord],
        update: RunUpdate | None,
        *,
        wait: bool = True,
    ) -> int:
        """Commit one transition at the expected head under the lease's fencing token.

        The event loop runs on while the store's writer thread commits. A cancellation that arrives
        meanwhile waits for the commit's outcome before it is raised, so the head always
        says what is in the store.

        ``wait=False`` hands the commit over and returns the head it will make without waiting:
        for an answer of a parallel batch that is not its last, on which nothing is dispatched or
        reported, so that the batch's other answers join it in the writer's next group. Commits
        stay in order; the next waiting write (or :meth:`settle`) waits for it as well and raises
        its failure, the first in order, rather than its own refusal that followed from it. The
        commit that creates the run always waits: the run's fencing token is drawn there.
        """
        driver, states_log = self._key.store._driver, self._states
        creating = self._creation is not None
        started = time.perf_counter()
        try:
            # A run still to be created goes in the same transaction as its first commit, which the
            # writer writes under the token the creation draws there (the session learns it in
            # settle(): it waits for this one, so no later commit is handed over without it).
            with driver.together() if creating else contextlib.nullcontext():
                if creating:
                    self._hand_over_creation()
                request = CommitRequest(
                    self._key.run_id,
                    expected_head=self.head,
                    fencing_token=self._lease.token,
                    step=step,
                    messages=messages,
                    agent_states=states_log.encode(states, messages, self.head + 1),
                    update=update,
                )
                future = driver.submit_commit(request)
        except BaseException:
            states_log.clear()  # it remembered this commit's states: write the next ones whole
            raise
        self._unsettled.append((self.head, future))
        self._last = future
        if not wait and not creating:
            self.head += 1
            return self.head
        try:
            await self.settle()
        except StoreError:
            if step.kind is StepKind.ATTEMPT_FAILED:
                self.failure_unrecorded = True
            raise
        if self.telemetry.watching:  # else no span records and nothing meters: nothing to tell
            await self._observe(messages, states, time.perf_counter() - started)
        if self._cancel_seen is not None:
            self._cancel_requested(update)
        if update is not None and update.release_lease:
            self._lease.given_up()
        return self.head

    def _cancel_requested(self, update: RunUpdate | None) -> None:
        """A settled commit found a cancel of the run requested: stop dispatching (the run ends
        ``cancelled``), or, when this commit ended the round (stopped, finished), say that it ended
        before the cancel took effect (the run keeps the request: ``runs show`` says it too)."""
        requested_at, self._cancel_seen = self._cancel_seen, None
        assert requested_at is not None
        if update is None or update.status not in ENDED_STATUSES:
            self._control.cancel(requested_at)
            return
        logger.warning(
            "run %s: %s before the cancel requested at %s took effect (no dispatch was left to "
            "stop); the run keeps the request, and runs show says so",
            self._key.run_id,
            update.status,
            iso(requested_at),
        )

    async def _observe(
        self, messages: Sequence[MessageRecord], states: Sequence[AgentStateRecord], seconds: float
    ) -> None:
        """Tell the telemetry of a committed transition (sizes only, never message text); after the
        attach's first commit, store its trace context on the run (the run exists by then)."""
        telemetry = self.telemetry
        telemetry.committed(
            self.head,
            1 + len(messages) + len(states),
            lambda: sum(len(dumps(m.body)) for m in messages),
            seconds,
        )
        if not telemetry.enabled:
            return
        pending = telemetry.take_pending()
        if pending is not None:
            driver = self._key.store._driver
            try:
                await asyncio.to_thread(
                    driver.set_trace_context, self._key.run_id, pending, self._lease.token
                )
            except StoreError as exc:
                logger.warning("run %s: storing its trace context failed (%s)", self._key.run_id, exc)

    async def settle(self) -> None:
        """Wait for every commit handed over (through cancellations: one is raised afterwards), set
        the head to the last one written, and raise the first failure."""
        unsettled, self._unsettled = self._unsettled, []
        cancelled = False
        for _, future in unsettled:
            cancelled = await _settled(future) or cancelled
        creating, self._creating = self._creating, None  # among the unsettled: done now
        if creating is not None:
            if creating.exception() is not None:
                self._refused = True  # never write on (nor release) a run this session did not create
            else:
                self._lease.issued(creating.result().fencing_token)
        failure = None
        for expected, future in unsettled:
            error = future.exception()  # read even after a failure: none is logged as never retrieved
            if failure is None:  # the ones after a failure were refused because of it
                failure = error
                if error is not None:
                    self.head = expected
                elif future is not creating:
                    self.head = head = future.result()
                    if type(head) is CancelRequested:
                        self._cancel_seen = head.cancel_requested_at
        if failure is not None:
            self._states.clear()  # it remembered the failed commits' states: write the next ones whole
            raise failure
        if cancelled:
            raise asyncio.CancelledError

    async def settle_at_end(self) -> LeaseLostError | None:
        """As a run ends: wait for the commits still handed over (an interrupted batch's answers).
        The error that ended the run is the one the caller sees: a failure here is logged (a lost
        lease as :meth:`RunControl.lost` says it) and :attr:`unrecorded` is set (the team is then out
        of step with the store). Returns the refusal of an answer by the fencing token, for a round
        that ended quietly (its other turns were not started for the lost lease) to end with, as a
        refused commit does."""
        self.unrecorded = False
        if self._creation is not None:  # the round ended before its first commit: create the run alone
            self._hand_over_creation()
        # An abandoned turn's answer may still be in the writer (its handler, not this round, waits
        # for it): the run's end is read and recorded after it.
        cancelled = self._last is not None and await _settled(self._last)
        refused = None
        try:
            await self.settle()
        except LeaseLostError as exc:
            self.unrecorded = True
            self._control.lost(exc)
            refused = exc
        except Exception as exc:  # noqa: BLE001 -- logged; the run's own end is what the caller sees
            self.unrecorded = True
            logger.warning(
                "run %s: an answer of the interrupted batch was not recorded (%s); it runs again on resume",
                self._key.run_id,
                exc,
            )
        if self._cancel_seen is not None:
            self._cancel_requested(None)
        if cancelled:
            raise asyncio.CancelledError
        return refused


async def to_the_end(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` as a task of its own and wait for its end through any number of
    cancellations, which never reach it; then raise the cancellation if one arrived (its own
    error, if it failed, is retrieved and dropped then), else return its result."""
    task = asyncio.ensure_future(awaitable)
    if await _settled(task):
        if not task.cancelled():
            task.exception()
        raise asyncio.CancelledError
    return task.result()


async def _settled(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, through any number of cancellations; whether one arrived (the
    caller raises it once everything it waits for settled). A cancellation cancels only the waiter,
    never ``future``: the writer's outcome still arrives (cheaper than ``asyncio.wait`` or
    ``shield``, which wrap every wait in more futures and callbacks). The writer's own futures
    refuse a cancellation (:class:`~graphflow_durable._storage.writer.Outcome`): they are awaited
    directly, one turn of the event loop sooner than through a waiter of our own."""
    cancelled = False
    if isinstance(future, Outcome):
        while not future.done():
            try:
                await future
            except asyncio.CancelledError:
                cancelled = True  # raised once the outcome is in (the future refused it)
            except Exception:  # noqa: BLE001 -- the caller reads the outcome from the future
                pass
        return cancelled
    while not future.done():
        waiter = future.get_loop().create_future()

        def wake(_: asyncio.Future[Any], waiter: asyncio.Future[None] = waiter) -> None:
            if not waiter.done():
                waiter.set_result(None)

        future.add_done_callback(wake)
        try:
            await waiter
        except asyncio.CancelledError:
            cancelled = True
            future.remove_done_callback(wake)
    return cancelled
