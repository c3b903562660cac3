"""One team's hold on its stored run: the run session.

:class:`RunSession` is held by :class:`~graphflow_durable.flow.DurableGraphFlow` and handed to its
manager and participant containers. It holds everything the team knows about its stored run: the
store, the run id (bound to an outer turn for a nested team), the lease and its fencing token, the
write path and its head, the agent-state writer, and the run's control (halted, a fatal error). The
write path (``commits.write``) is the single crossing into the store while a run is under way: one
completion flows down manager -> write path -> agent-state writer -> store, never back up.

Its parts: the run's control (:class:`~graphflow_durable._runtime.stops.RunControl`: halted, a lost
lease, a cancel, a fatal error), the lease (:class:`~graphflow_durable._runtime.runlease.RunLease`)
and the write path (:class:`~graphflow_durable._runtime.commits.Commits`, the owner of the head: the
commits handed to the store's writer and their outcomes), the last two made for the run's frozen
key (:class:`~graphflow_durable._runtime.runlease.RunKey`) when the session binds to a run. What the
session does to the team itself (restore it from the log, read its participants' states, seed it
with a loaded state) goes through :mod:`~graphflow_durable._runtime.team`. Only this module
assigns the session's fields; its parts report to the control, never back to the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from autogen_agentchat.base import TaskResult

from graphflow_durable._agentstate.encoder import StateLog
from graphflow_durable._model import graphid as _graphid
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.records import FRESH_BUDGET, AgentStateRow, RunLog, RunStatus
from graphflow_durable._model.restore import Plan
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._runtime import team as stored
from graphflow_durable._runtime.commits import Commits, to_the_end
from graphflow_durable._runtime.config import default_store_url, shared_store
from graphflow_durable._runtime.container import Turns, outer_run_store
from graphflow_durable._runtime.runlease import RunKey, RunLease
from graphflow_durable._runtime.stops import RunControl, install_log_filters
from graphflow_durable._runtime.team import TeamView
from graphflow_durable._runtime.telemetry import Telemetry
from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable._storage.sealing import openable
from graphflow_durable._storage.urls import parse_store_url
from graphflow_durable.context import current_execution
from graphflow_durable.errors import (
    GraphMismatchError,
    LeaseLostError,
    SchemaVersionError,
    StoreCorruptError,
    StoreError,
)
from graphflow_durable.scheduler import GraphSpec, initial
from graphflow_durable.store import (
    ENDED_STATUSES,
    CallRecord,
    InputRequest,
    RunRecord,
    RunUpdate,
    Step,
    StepKind,
    Store,
)

__all__ = ["RunSession", "last_error"]

#: The session acts for DurableGraphFlow: it logs as the flow does, so log filters keep working.
logger = logging.getLogger("graphflow_durable.flow")


def _database_fault(error: BaseException | None) -> bool:
    """Whether ``error`` is the database failing (an outage, a full disk), not the run or its data."""
    return isinstance(error, StoreError) and not isinstance(error, (StoreCorruptError, SchemaVersionError))


def last_error(error: BaseException) -> str:
    """``error`` as a run's last error: its type and the first line of its message (GraphFlow's
    error text goes on with the agent's traceback)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


class RunSession:
    """A team's stored run: store, run id, lease, head, agent-state writer, halt and fatal error.

    Args:
        team: the team (what the session restores and reads states from).
        store: a URL or a :class:`Store` (``None``: the default store, or the outer run's store
            for a nested team); a URL is checked at once and opened on first use.
        run_id: the run (``None``: a new random id, or the outer turn's run for a nested team).
        owner: the lease owner id (``None``: a new one for this session).
        lease_seconds, allow_graph_change, max_crash_attempts: as
            :class:`~graphflow_durable.DurableGraphFlow`.
        spec: the graph's scheduling rules' view of it.
        graph_description: the graph as :func:`graphid.describe_graph` describes it.

    The lease and what remains of the one-driver window are :class:`RunLease`'s (``self.lease``).
    """

    def __init__(
        self,
        team: TeamView,
        *,
        store: str | Store | None,
        run_id: str | None,
        owner: str | None,
        lease_seconds: float,
        allow_graph_change: bool,
        spec: GraphSpec,
        graph_description: dict[str, Any],
        max_crash_attempts: int = 5,
    ) -> None:
        if isinstance(store, str):
            # Parsed, not opened (no connection, no file): a bad URL fails here, where it is
            # written, instead of at the first run. The store is opened on first use.
            parse_store_url(store)
        self.team = team
        self.store_arg = store
        self._store: Store | None = store if isinstance(store, Store) else None
        self.run_id = uuid.uuid4().hex if run_id is None else check_run_id(run_id)
        self.run_id_given = run_id is not None
        self.nested = False  # the run id was derived from an outer durable turn
        self.outer_attempt = 0  # the attempt of the outer turn the nested run was last bound in
        self.parent_run_id: str | None = None  # the outer run, for a nested run in the outer run's store
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.allow_graph_change = allow_graph_change
        self.spec = spec
        self.graph_description = graph_description
        self.fingerprint = _graphid.fingerprint(graph_description)
        self.synced = False  # the team in memory equals the store's head
        self.states = StateLog()  # what this writer last committed per node, for splices
        self.control = RunControl(self.run_id)  # halted, lost lease, cancel, fatal error
        # The lease and the write path of the run bound last (made for its key, see _bound).
        self._key: RunKey | None = None
        self._lease: RunLease | None = None
        self._commits: Commits | None = None
        self.turns = Turns(self, lambda node: self.lease.may_start(node), lambda: self.control.fatal)
        # Live call records a database fault kept out of the store (see recorded.CallLink).
        self.unwritten: list[CallRecord] = []
        install_log_filters()  # a lost lease or an outage: no library tracebacks in the ERROR log
        self.pending_import: Mapping[str, Any] | None = None  # a loaded state for a run not yet created
        self.resumed_round: list[tuple[Mapping[str, Any], bool]] | None = None
        self.max_crash_attempts = max_crash_attempts
        self.telemetry = Telemetry()  # the team gives its providers (DurableGraphFlow's arguments)
        self.releases_backoffs = False  # driven by a pool worker: a long back-off releases the run
        self.driven_alone = False  # claimed by a pool worker that drives nothing else meanwhile
        self.always_resume = False  # this call runs in the always-resume test mode (see tear_down)
        self._torn_down_at: int | None = None  # the head at the last tear_down
        # What the last attach found, for the resume's budget (see take_resume_budget); and the head
        # at which it found the previous driver dead, until a commit of this driver counts it.
        self._died = self._fresh_budget = False
        self._died_at: int | None = None
        self._died_with: frozenset[str] = frozenset()

    @property
    def store(self) -> Store:
        """The store (opened on first use)."""
        if self._store is None:
            url = self.store_arg if isinstance(self.store_arg, str) else default_store_url()
            self._store = shared_store(url)
        return self._store

    def _bound(self) -> tuple[RunLease, Commits]:
        """The lease and the write path of the run this session drives now: made anew when the run
        (its store, id, owner, lease period) is another than the one they were made for."""
        key = self._key
        # Compared field by field, not by building a RunKey to compare: this runs several times
        # per transition (the store by identity, as RunKey's equality does; the opened one, read
        # without the property: a session whose store is not open yet has no key either).
        if (
            key is None
            or self._lease is None
            or self._commits is None
            or key.store is not self._store
            or key.run_id != self.run_id
            or key.owner != self.owner
            or key.lease_seconds != self.lease_seconds
        ):
            key = RunKey(self.store, self.run_id, self.owner, self.lease_seconds)
            self._key = key
            self.control.run_id = key.run_id
            lease = RunLease(key, self.control, lambda: commits.created)
            commits = Commits(key, lease, self.control, self.states)
            commits.telemetry = self.telemetry
            self._lease, self._commits = lease, commits
        return self._lease, self._commits

    @property
    def lease(self) -> RunLease:
        """The run's lease as this driver holds it."""
        return self._bound()[0]

    @property
    def commits(self) -> Commits:
        """The run's write path (the owner of the head)."""
        return self._bound()[1]

    @property
    def fencing_token(self) -> int:
        """The run's fencing token as this driver holds it (what a write of its turns is fenced by)."""
        return self.lease.token

    @property
    def opened_store(self) -> Store | None:
        """The store if it was opened (or given), else ``None``."""
        return self._store

    def bind_to_outer_turn(self, team_name: str) -> bool:
        """Inside an agent's turn of a durable run, a team given no run id drives that turn's run:
        ``"{outer idempotency key}/{team name}"``, in the outer run's store unless one was given.

        Returns whether the session now drives another run, or the same run in another attempt of
        the outer turn (which calls this team again from its start), than before.
        """
        outer = current_execution()
        if self.run_id_given or outer is None:
            return False
        outer_store = outer_run_store()
        if self.store_arg is None and outer_store is not None:
            self._store = outer_store
            self.parent_run_id = outer.run_id  # recorded on the run's row when it is created
        self.nested = True
        run_id = f"{outer.idempotency_key}/{team_name}"
        if run_id == self.run_id and outer.attempt == self.outer_attempt:
            return False
        self.run_id, self.outer_attempt = run_id, outer.attempt
        self.forget()
        # A state loaded before the team knew this run (its agent's state restored to the outer
        # node's last committed turn, e.g. by SocietyOfMindAgent) predates this turn: the turn's run
        # resumes from the store, or starts from a reset team as every outer turn's run does.
        self.pending_import = None
        return True

    async def tear_down(self) -> None:
        """The always-resume test mode, between two parts of one run: drop what the team holds in
        memory (each agent reset, as a new process builds it; the team out of step with the store),
        so that the next attach rebuilds it from the store as a new process's resume does."""
        await self.team.reset_agents()
        self.forget()
        self._torn_down_at = self.commits.head

    def forget(self) -> None:
        """The team no longer matches the store's head: the next attach restores it."""
        self.synced = False
        self.states.clear()
        self.resumed_round = None

    def _creation(
        self, first_step: Step | None = None, states: Sequence[AgentStateRow] = ()
    ) -> CreateRequest:
        """The request that creates this session's run (at head 1 with ``first_step``)."""
        return CreateRequest(
            self.run_id,
            graph_fingerprint=self.fingerprint,
            graph=self.graph_description,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            parent_run_id=self.parent_run_id,
            first_step=first_step,
            agent_states=states,
        )

    async def _restore(self) -> Plan:
        """Put the team at the store's head."""
        return await stored.restore(self.team, self.store, self.run_id, self.spec, self.states)

    async def _import(self, state: Mapping[str, Any], *, origin: int) -> None:
        """Seed the run with a loaded state (its messages from ``origin`` on) in one commit."""
        self.pending_import = None
        self.states.clear()  # the loaded agent states are written whole
        await self.commits.write(*stored.imported(self.team, self.spec, state, origin=origin))

    # -- the run's lifecycle -------------------------------------------------------------------

    async def attach(self) -> RunRecord | None:
        """Claim the run and make the team equal to the store's head.

        Returns the run's record, or ``None`` for a new run: it is created in the transaction of
        the round's first commit (``Commits.create_with_first``), the lease with it.
        """
        # Opening a store by URL (its engine, its schema checked and migrated) takes tens of
        # milliseconds, more on a new database: done in a thread, so that the other runs on this
        # event loop do not stall for it (shared_store is thread-safe).
        store = self._store if self._store is not None else await asyncio.to_thread(lambda: self.store)
        lease, commits = self._bound()
        started = time.monotonic()
        run = store.get_run(self.run_id)
        if run is not None:
            openable(run, store._e.url)  # without the run's keys: refused before the lease is taken
        self.resumed_round = None
        self._died = self._fresh_budget = False
        self._died_at = None
        self.control.attached()
        commits.attached()
        if run is None:
            self.states.clear()
            if self.pending_import is None:
                # Created in one transaction with the round's first commit (Commits.write): a new
                # run's row, its first snapshot of every agent and that commit cost one commit.
                await self.team.reset_if_used()
                step = Step(StepKind.CREATED, None, Cursor.fresh(initial(self.spec)).to_json(self.spec))
                states = self.states.encode(await self.team.agent_states(), (), 1)
                commits.create_with_first(self._creation(step, states))
                self.synced = True
                lease.created(None, started)  # its token is drawn when the creation is written
                return None
            try:
                run = await commits.create(self._creation())
            except BaseException:
                self.states.clear()
                raise
            self.synced = True
            lease.created(run.fencing_token, started)
            async with self._released_on_failure(lease):
                # A loaded state: the run's status is the state's (a finished one runs nothing).
                await self._import(self.pending_import, origin=0)
                await self._restore()
                return store.get_run(self.run_id)
        self.check_graph(run)
        await asyncio.to_thread(lease.take)
        async with self._released_on_failure(lease):
            return await self._taken(store, run)

    @contextlib.asynccontextmanager
    async def _released_on_failure(self, lease: RunLease) -> AsyncIterator[None]:
        """The rest of an attach once the lease is ours: anything it raises (a damaged state, the
        database gone, a cancellation) gives the lease up before it propagates, so that the next
        driver resumes the run at once, not after the lease expires (best effort, as in detach)."""
        try:
            yield
        except BaseException:
            self.synced = False
            await to_the_end(self.release(lease))
            raise

    async def release(self, lease: RunLease) -> None:
        """Give the lease up (best effort: a WARNING when the database cannot; it then expires)."""
        try:
            await asyncio.to_thread(self.store._driver.release_lease, self.run_id, lease.token)
        except StoreError as exc:
            logger.warning(
                "run %s: releasing its lease failed too (%s); the next driver can resume it once the "
                "lease expires (%g s after its last renewal)",
                self.run_id,
                exc,
                self.lease_seconds,
            )

    async def _taken(self, store: Store, run: RunRecord) -> RunRecord | None:
        """The attach of a stored run once its lease is ours: the team made equal to its head."""
        commits = self.commits
        run = openable(store.get_run(self.run_id) or run, store._e.url)  # committed before the lease was ours
        if run.head_seq != self._torn_down_at:  # another driver moved the run since: they may have run
            self.control.unstarted = ()
        self._torn_down_at = None
        # Still "running" once the lease is ours: the driver before us ended without recording how
        # (an answer, a failure, an interrupt, a park all record a status), so it died with its
        # process (see docs/lifecycle.md, "Crash loops").
        self._died = run.status == "running"
        self._fresh_budget = isinstance(run.result, Mapping) and bool(run.result.get(FRESH_BUDGET))
        if run.cancel_requested_at is not None and run.status not in ENDED_STATUSES:
            self.control.cancel(run.cancel_requested_at)  # asked of a driver that stopped before it saw it
        stale = not self.synced or commits.head != run.head_seq
        commits.at(run.head_seq)
        self._died_at = run.head_seq if self._died else None
        self._died_with = frozenset()
        if self._died:  # the other runs whose turns died with the same process
            died_with = await asyncio.to_thread(store._driver.died_with, self.run_id, run.head_seq)
            self._died_with = died_with or frozenset()
        if self.pending_import is not None:
            # Another process created the run after load_state() found none: the loaded state
            # becomes the run's new starting point, as load_state() does on an existing run.
            await self._import(self.pending_import, origin=run.message_count)
            await self._restore()
        elif stale:
            at = await self._restore()
            if not at.cursor.finished:
                self.resumed_round = at.current_round()
        self.synced = True
        return store.get_run(self.run_id)

    async def begin_trace(self, team_name: str, run: RunRecord | None, start_ns: int) -> None:
        """Start the attach's workflow span (see :class:`Telemetry`): ``run`` is what the attach
        returned (``None``: a new run), ``start_ns`` when the attach began."""
        stored = None
        driver = self.store._driver
        recordable = self.telemetry.may_record()
        if run is not None and recordable:
            stored = await asyncio.to_thread(driver.trace_context, self.run_id)
        elif run is None and recordable:  # a new run: submitted to a pool, its submit's trace
            submitted = await asyncio.to_thread(driver.submitted_trace_context, self.run_id)
            stored = None if submitted is None else json.dumps({"root": submitted})
        resumed = run is not None and run.status not in ENDED_STATUSES
        self.turns.tracer = self.telemetry.agent_tracer()
        self.telemetry.begin(
            team_name,
            self.run_id,
            stored=stored,
            start_ns=start_ns,
            resumed_from_step=run.head_seq if resumed and run is not None else None,
            took_over=self._died,
        )

    async def end_trace(self, error: BaseException | None = None) -> None:
        """End the attach's workflow span with the run's status as stored now (read only when the
        span or the metrics record it) and ``error``, what ended the attach if it failed."""
        telemetry = self.telemetry
        status = "unknown"
        if telemetry.enabled and self.control.said_lost:
            telemetry.lease_lost()
        if telemetry.metering or telemetry.enabled:
            try:
                run = await asyncio.to_thread(self.store.get_run, self.run_id)
                status = "unknown" if run is None else run.status
                if run is not None and telemetry.enabled:
                    telemetry.round(await asyncio.to_thread(self.store._driver.rounds, self.run_id))
            except StoreError:
                status = "unknown"
        telemetry.end(status, error)

    def answer_used(self, request: InputRequest) -> None:
        """A turn takes ``request``'s answer: an ``answer`` event (never the answer's text)."""
        waited = None if request.answered_at is None else request.answered_at - request.created_at
        self.telemetry.answered(request.node, request.request_id, request.answered_by, waited)

    def replayed(self, tokens: int) -> None:
        """A recorded call of a turn was replayed instead of made (``tokens``: its model tokens)."""
        self.telemetry.replayed(tokens)

    def rate_limit_waited(self, key: str, seconds: float) -> None:
        """A model call of a turn waited ``seconds`` for its turn of rate limit ``key``."""
        self.telemetry.rate_limit_waited(key, seconds)

    async def detach(self, clean: bool, failed: bool, error: BaseException | None = None) -> None:
        """Record how the run ended if the manager did not (interrupted or failed, with ``error`` as
        the run's last error: what ``runs show`` shows); free the lease.

        Best effort, so that the error that ended the run is the one the caller sees: when the
        database cannot do a step (the fault that ended the run: an outage, a full disk), it logs
        a WARNING and goes on. Recording the end and releasing the lease are tried separately: a
        released lease lets the next driver resume the run at once (it shows ``running`` with no
        owner until then); a lease that could not be released is no longer renewed, so the next
        driver's attach takes the run over once it expires, and resumes it.

        Nothing here blocks the event loop (the other runs of the process, their lease renewals):
        the end goes to the store's writer like any commit, the reads and the release to a thread.
        The caller awaits this through cancellations (``commits.to_the_end``).
        """
        store = self.store
        lease, commits = self._bound()
        self.control.fatal = None
        if not clean:
            self.synced = False
        if lease.released or not commits.created:
            return  # the round's last commit recorded its end and gave the lease up; or no run of ours
        # The driver before this one died with turns in flight and no commit of this one counted
        # those crashes (the resume's commit failed), or a failed attempt could not be recorded:
        # the run is left "running", as a dead driver leaves it, so that the next driver counts
        # each of those turns once (a crash); an end recorded here would count them not at all.
        uncounted = commits.failure_unrecorded or (
            self._died_at is not None and self._died_at == commits.head
        )
        try:
            # Read in a thread too: the end often follows a database fault, and a read then waits
            # up to the connection's timeouts.
            run = None if uncounted else await asyncio.to_thread(store.get_run, self.run_id)
            if run is not None and run.status == "running" and run.fencing_token == lease.token:
                scheduler = await asyncio.to_thread(store._driver.head_scheduler, self.run_id)
                commits.at(
                    await store._driver.submit_commit(
                        CommitRequest(
                            self.run_id,
                            expected_head=run.head_seq,
                            fencing_token=lease.token,
                            step=Step(StepKind.INTERRUPT, None, scheduler or {}),
                            update=RunUpdate(status=self._end_status(failed, error), release_lease=True),
                        )
                    )
                )
                if failed and error is not None:
                    await self._record_error(error)
                return
        except StoreError as exc:
            self.synced = False
            logger.warning(
                "run %s: recording that the run %s failed too (%s); it shows 'running' until it is resumed",
                self.run_id,
                "failed" if failed else "was interrupted",
                exc,
            )
        await self.release(lease)

    async def _record_error(self, error: BaseException) -> None:
        """Keep ``error`` as the run's last error (best effort, as the rest of :meth:`detach`)."""
        try:
            await asyncio.to_thread(self.store.queue.record_error, self.run_id, error=last_error(error))
        except StoreError as exc:
            logger.warning("run %s: recording its error failed too (%s)", self.run_id, exc)

    def _end_status(self, failed: bool, error: BaseException | None) -> RunStatus:
        """The status of a run that ended without the manager recording it. A database fault (a
        commit that failed in an outage or on a full disk, the database back by now) is not the
        run's failure: nothing of it was lost, so it is ``interrupted``, resumable as it is (a pool
        claims no ``failed`` run on its own: such a run would wait for ``runs retry``)."""
        if failed and not _database_fault(error):
            return "failed"
        return "interrupted" if self.control.cancelling is None else "cancelled"

    async def answered(self, request_ids: Sequence[str]) -> list[str]:
        """Which of the run's ``request_ids`` are answered (read in a thread)."""
        return await asyncio.to_thread(self.store.requests.answered, self.run_id, request_ids)

    async def parked(self, request_ids: Sequence[str]) -> None:
        """The round parked for human input (committed ``waiting``). Answers to all of its requests
        that came while the park committed (after the manager's last look) make the run resumable
        again at once; the next attach restores the team from the store (a waiting turn's agent may
        have changed its state before it asked)."""
        self.forget()
        self.telemetry.event("park", {"requests": len(request_ids), "request_ids": list(request_ids)})
        wake = self.store.requests.wake_if_answered
        if await asyncio.to_thread(wake, self.run_id, request_ids, fencing_token=self.fencing_token):
            logger.info("run %s: answered while it parked; it is ready to resume", self.run_id)

    def halt(self, reason: str | None = None) -> None:
        """Stop dispatching new nodes (an interrupt); answers already running are still recorded.
        ``reason``: the round's stop reason (the first given wins; without one, GraphFlow's)."""
        self.control.halt(reason)

    async def may_dispatch(self) -> bool:
        """Before a dispatch: whether the lease is still held (else the run was halted)."""
        return await self.lease.valid()

    def fail(self, exc: BaseException) -> None:
        """The manager hit an error it cannot record, or a turn one GraphFlow passes on only as text
        (a request's deadline passed): the run ends with it, and ``run()`` raises it."""
        self.control.fail(exc)

    def check_graph(self, run: RunRecord) -> None:
        """Refuse a stored run whose graph differs from this team's (unless allowed)."""
        if run.graph_fingerprint == self.fingerprint:
            return
        diff = _graphid.describe_difference(run.graph, self.graph_description)
        if self.allow_graph_change:
            logger.warning(
                "run %s: resuming with a changed graph (allowed): %s", self.run_id, "; ".join(diff)
            )
            return
        raise GraphMismatchError(
            f"run {self.run_id!r} was started with a different graph:\n  "
            + "\n  ".join(diff or ["(fingerprints differ)"])
            + "\nresume it with the original graph, use a new run_id, or pass allow_graph_change=True",
            run_id=self.run_id,
            differences=tuple(diff),
        )

    async def restart(self) -> None:
        """After the team's reset: commit a ``reset`` step (a fresh cursor after the run's messages,
        every participant's state, written whole) under a lease held just for it.

        A nested team's run belongs to its outer turn, and the next outer turn drives a run of its
        own: nothing is written for it.
        """
        self.turns.clear()
        self.pending_import = None
        self.forget()
        if self.nested or self.store.get_run(self.run_id) is None:
            return
        self.store.requests.cancel(self.run_id)  # a pending request belongs to a turn that is gone
        lease, commits = self._bound()
        with lease.briefly() as run:
            commits.at(run.head_seq)
            cursor = Cursor.fresh(initial(self.spec), origin=run.message_count)
            self.states.clear()
            states = await self.team.agent_states()
            update = RunUpdate(status="interrupted", task=[])
            await self.commits.write(
                Step(StepKind.RESET, None, cursor.to_json(self.spec)), (), states, update
            )
        # The team's reset left the manager's cursor at origin 0, but the stored thread continues at
        # run.message_count: the next run must restore the cursor (new origin) from the store.
        self.synced = False

    async def load(self, state: Mapping[str, Any]) -> bool:
        """``load_state()`` of a state in the durable format.

        On a stored run the state becomes its new starting point at once, under a lease held just
        for it (its earlier history stays in the store, as after ``reset()``; the next run restores
        the team from the store). Otherwise the team loads it in memory and the run is seeded with
        it when it is created.

        A nested team outside an outer turn loads it in memory only: the run it drives next is the
        next outer turn's, which resumes from the store when it exists (a re-run of an interrupted
        turn) and otherwise starts from a reset team; the run of the turn it drove last is left alone.

        Returns whether the next run continues the state (``False``: loaded in memory only).
        """
        self.turns.clear()
        self.resumed_round = None
        if self.nested and current_execution() is None:
            # Its agent's state restored to the outer node's last committed turn (SocietyOfMindAgent
            # saves its inner team's state with its own): older than the turn's stored inner run.
            await self.team.load_plain(state)
            self.pending_import, self.synced = None, False
            return False
        if self.store.get_run(self.run_id) is not None:
            lease, commits = self._bound()
            with lease.briefly() as run:
                commits.at(run.head_seq)
                self.check_graph(run)
                await self._import(state, origin=run.message_count)
            self.synced = False
            return True
        await self.team.load_plain(state)
        self.pending_import = state
        self.synced = True
        return True

    def take_resume_budget(self) -> tuple[frozenset[str] | None, bool]:
        """What the last attach found, once: the other runs whose turns died with the process of
        the run's previous driver if it died with turns in flight (their crashes count; ``None``:
        it did not), and whether ``runs retry`` gave its nodes a fresh budget."""
        found = (self._died_with if self._died else None), self._fresh_budget
        self._died, self._fresh_budget, self._died_with = False, False, frozenset()
        return found

    async def defer(self, until: float) -> None:
        """No pool worker claims the run before ``until`` (epoch seconds, the workers' clock): its
        queue row's ``not_before``, set while this driver holds the lease (fenced by its token: a
        driver taken over changes nothing), before the commit that releases it."""
        queue = self.store.queue
        await asyncio.to_thread(queue.defer, self.run_id, until, fencing_token=self.fencing_token)

    async def isolate(self) -> None:
        """Have a pool worker claim the run only to drive it alone (its queue row's ``run_alone``),
        set while this driver holds the lease, before the commit that releases it."""
        queue = self.store.queue
        await asyncio.to_thread(queue.isolate, self.run_id, fencing_token=self.fencing_token)

    def take_resumed_round(self) -> list[tuple[Mapping[str, Any], bool]]:
        """What the round resumed by the last attach had produced before (message dump, whether it
        was user input), once; empty when the attach resumed nothing."""
        resumed, self.resumed_round = self.resumed_round or [], None
        return resumed

    async def settle_at_end(self) -> LeaseLostError | None:
        """As a run ends: wait for the commits still handed over (see :meth:`Commits.settle_at_end`);
        when one of them failed, the team is out of step with the store."""
        commits = self.commits
        try:
            return await commits.settle_at_end()
        finally:
            if commits.unrecorded:
                self.synced = False

    def abandon(self) -> None:
        """The run's turns were abandoned after an interrupt (they may still end in this process):
        no write of theirs may land on the run another process now drives."""
        self.lease.abandon()

    # -- the team from the stored run, for the flow ----------------------------------------------

    def last_round(self) -> list[tuple[Mapping[str, Any], bool]]:
        """The stored run's last round: each message's dump and whether it was user input, in order."""
        return stored.last_round(self.team, self.store.load(self.run_id), self.spec)

    def stored_result(self, run: RunRecord, create: Callable[[Mapping[str, Any]], Any]) -> TaskResult:
        """The result of the run's last round, as its uninterrupted run returned it."""
        return stored.stored_result(self.store.load(self.run_id), self.spec, run, create)

    async def state_of(self, log: RunLog) -> dict[str, Any]:
        """The team state (TeamState dump, durable format) at the head of ``log`` (the run, or its
        cut at a past step)."""
        return await stored.state_of(self.team, log, self.spec, self.run_id, self.fingerprint)

    async def state_at_head(self) -> dict[str, Any]:
        """The team state (TeamState dump, durable format) at the store's head."""
        return await self.state_of(self.store.load(self.run_id))
