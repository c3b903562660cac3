"""The run session of :class:`~graphflow_durable.flow.DurableGraphFlow`: the team against its store.

:class:`RunSession` is the base class of ``DurableGraphFlow`` that holds what a run does with the
store: attaching (create the run, or take its lease and bring the team to the store's head),
renewing the lease while running, detaching (record how the run ended, free the lease), starting
the stored run afresh on reset, restoring the team from the run's log, and ``_write``, the single
crossing into the store while a run is under way. ``flow.py`` keeps the AutoGen-facing wiring: the
constructor (which sets the attributes declared here), the factories, ``run_stream``, state and
component config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import GraphFlow
from autogen_core import AgentId, SingleThreadedAgentRuntime

from graphflow_durable._agentstate.writer import StateLog
from graphflow_durable._model import graphid as _graphid
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.restore import Plan, cursor_from_log, plan
from graphflow_durable._runtime.link import Journal
from graphflow_durable._runtime.manager import DurableChatAgentContainer, DurableGraphFlowManager
from graphflow_durable.errors import GraphMismatchError, LeaseLostError, StateFormatError
from graphflow_durable.scheduler import GraphSpec, initial
from graphflow_durable.store import (
    AgentStateRecord,
    MessageRecord,
    RunLog,
    RunRecord,
    RunStatus,
    RunUpdate,
    Step,
    Store,
)

__all__ = ["RunSession"]

#: These methods are DurableGraphFlow's: they log as the flow does.
logger = logging.getLogger("graphflow_durable.flow")


class RunSession(GraphFlow):
    """The store-facing half of :class:`~graphflow_durable.flow.DurableGraphFlow` (its base class)."""

    if TYPE_CHECKING:  # set by DurableGraphFlow.__init__
        _run_id: str
        _allow_graph_change: bool
        _lease_seconds: float
        _owner: str
        _spec: GraphSpec
        _graph_description: dict[str, Any]
        _fingerprint: str
        _token: int
        _synced: bool
        _pending_import: Mapping[str, Any] | None
        _states: StateLog
        _journal: Journal
        _resumed_round: list[tuple[Mapping[str, Any], bool]] | None

        @property
        def store(self) -> Store: ...

    # -- attaching to the run and detaching from it ------------------------------------------------

    async def _renew_lease(self) -> None:
        """Keep the lease alive while running; on losing it, stop dispatching."""
        interval = max(self._lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                self.store.renew_lease(
                    self._run_id, self._owner, self._token, lease_seconds=self._lease_seconds
                )
            except LeaseLostError as exc:
                logger.error("run %s: %s; this worker stops dispatching", self._run_id, exc)
                self._journal.halted = True
                self._journal.fatal = exc
                return

    async def _attach(self) -> RunRecord | None:
        """Claim the run and make the in-memory team equal to the store's head.

        Returns the run's record, or ``None`` when this call created the run.
        """
        store = self.store
        run = store.get_run(self._run_id)
        if run is None:
            run = store.create_run(
                self._run_id,
                graph_fingerprint=self._fingerprint,
                graph=self._graph_description,
                owner=self._owner,
                lease_seconds=self._lease_seconds,
            )
            self._token = run.fencing_token
            self._journal.head = run.head_seq
            self._synced = True
            self._states.clear()
            if self._pending_import is not None:
                # A loaded state: the run's status is the state's (a finished one runs nothing).
                await self._import_state(self._pending_import, origin=0)
                self._pending_import = None
                await self._restore(store.load(self._run_id))
                return store.get_run(self._run_id)
            if self._initialized:
                await GraphFlow.reset(self)
            await self._snapshot_all()
            return None
        self._check_graph(run)
        self._token = store.acquire_lease(
            self._run_id,
            self._owner,
            lease_seconds=self._lease_seconds,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        run = store.get_run(self._run_id) or run  # what committed before the lease was ours
        stale = not self._synced or self._journal.head != run.head_seq
        self._journal.head = run.head_seq
        self._resumed_round = None
        if self._pending_import is not None:
            # Another process created the run after load_state() found none: the loaded state
            # becomes the run's new starting point, as load_state() does on an existing run.
            await self._import_state(self._pending_import, origin=run.message_count)
            self._pending_import = None
            await self._restore(store.load(self._run_id))
        elif stale:
            at = await self._restore(store.load(self._run_id))
            if not at.cursor.finished:
                start = at.cursor.round_start
                self._resumed_round = [(e.body, e.completes is None) for e in at.entries[start:]]
        self._synced = True
        return store.get_run(self._run_id)

    def _detach(self, clean: bool, failed: bool) -> None:
        """Record how the run ended if the manager did not (interrupted or failed); free the lease."""
        store = self.store
        if not clean:
            self._synced = False
        run = store.get_run(self._run_id)
        if run is not None and run.status == "running" and run.fencing_token == self._token:
            self._journal.head = store.commit(
                self._run_id,
                expected_head=run.head_seq,
                fencing_token=self._token,
                step=Step("interrupt", None, store.head_scheduler(self._run_id) or {}),
                update=RunUpdate(status="failed" if failed else "interrupted"),
            )
        store.release_lease(self._run_id, self._token)

    def _check_graph(self, run: RunRecord) -> None:
        if run.graph_fingerprint == self._fingerprint:
            return
        diff = _graphid.describe_difference(run.graph, self._graph_description)
        if self._allow_graph_change:
            logger.warning(
                "run %s: resuming with a changed graph (allowed): %s", self._run_id, "; ".join(diff)
            )
            return
        raise GraphMismatchError(
            f"run {self._run_id!r} was started with a different graph:\n  "
            + "\n  ".join(diff or ["(fingerprints differ)"])
            + "\nresume it with the original graph, use a new run_id, or pass allow_graph_change=True"
        )

    async def _snapshot_all(self) -> None:
        """Record every participant's starting state, so an interrupted turn can be undone in-process."""
        states = [AgentStateRecord(p.name, await p.save_state()) for p in self._participants]
        cursor = Cursor.fresh(initial(self._spec))
        self._write(Step("created", None, cursor.to_json(self._spec)), (), states, None)

    async def _stored_result(self, run: RunRecord) -> TaskResult:
        """The result of the run's last round, as its uninterrupted run returned it."""
        log = self.store.load(self._run_id)
        cursor = cursor_from_log(log, self._spec)
        thread = [m for m in log.messages if m.seq >= cursor.origin + cursor.round_start]
        factory = self._message_factory
        messages = [factory.create(m.body) for m in thread]
        result = run.result if isinstance(run.result, Mapping) else {}
        return TaskResult(messages=messages, stop_reason=result.get("stop_reason"))

    async def _restart_run(self) -> None:
        """Start the stored run afresh after a reset: commit a ``reset`` step (fresh cursor after the
        run's messages, every participant's state) under a lease held just for it."""
        store = self.store
        if store.get_run(self._run_id) is None:
            return
        async with self._briefly_leased() as run:
            cursor = Cursor.fresh(initial(self._spec), origin=run.message_count)
            states = [AgentStateRecord(p.name, await p.save_state()) for p in self._participants]
            self._journal.head = store.commit(
                self._run_id,
                expected_head=run.head_seq,
                fencing_token=self._token,
                step=Step("reset", None, cursor.to_json(self._spec)),
                agent_states=states,
                update=RunUpdate(status="interrupted", task=[]),
            )
        # GraphFlow.reset() left the manager's cursor at origin 0, but the stored thread continues at
        # run.message_count: the next run must restore the cursor (new origin) from the store.
        self._synced = False

    @asynccontextmanager
    async def _briefly_leased(self) -> AsyncIterator[RunRecord]:
        """Hold the run's lease for one write outside a run (reset, load_state); yield its record.

        Raises RunLockedError when another live process drives the run.
        """
        store = self.store
        self._token = store.acquire_lease(
            self._run_id,
            self._owner,
            lease_seconds=self._lease_seconds,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        try:
            run = store.get_run(self._run_id)
            if run is None:  # pragma: no cover - a run is never deleted under a held lease
                raise StateFormatError(f"run {self._run_id!r} disappeared from the store")
            self._journal.head = run.head_seq
            yield run
        finally:
            store.release_lease(self._run_id, self._token)

    async def _import_into_existing(self, state: Mapping[str, Any]) -> None:
        """``load_state()`` on a stored run: the state becomes its new starting point at once.

        The run's earlier history stays in the store (as after ``reset()``); the next run restores
        the team from the store.
        """
        async with self._briefly_leased() as run:
            self._check_graph(run)
            await self._import_state(state, origin=run.message_count)
        self._synced = False

    # -- the single crossing into the store during a run ----------------------------------------

    def _write(
        self,
        step: Step,
        messages: Sequence[MessageRecord],
        states: Sequence[AgentStateRecord],
        update: RunUpdate | None,
    ) -> int:
        try:
            head = self.store.commit(
                self._run_id,
                expected_head=self._journal.head,
                fencing_token=self._token,
                step=step,
                messages=messages,
                agent_states=self._states.encode(states, messages, self._journal.head + 1),
                update=update,
            )
        except BaseException:
            self._states.clear()  # it remembered this commit's states: write the next ones whole
            raise
        self._journal.head = head
        return head

    # -- restoring from the store ----------------------------------------------------------------

    async def _restore(self, log: RunLog) -> Plan:
        """Put the team at the store's head. On the embedded runtime every message is created once
        and shared by the thread and the buffers; elsewhere the state goes through load_state."""
        at = plan(log, self._spec, self._participant_names)
        runtime = self._runtime
        if not isinstance(runtime, SingleThreadedAgentRuntime):
            await GraphFlow.load_state(self, await self._state_at(log, at))
        else:
            if not self._initialized:
                await self._init(runtime)
            thread = [self._message_factory.create(e.body) for e in at.entries]
            manager = await runtime.try_get_underlying_agent_instance(
                AgentId(self._group_chat_manager_topic_type, self._team_id), DurableGraphFlowManager
            )
            await manager.restore(thread, at.cursor)
            for name, topic in zip(self._participant_names, self._participant_topic_types, strict=True):
                container = await runtime.try_get_underlying_agent_instance(
                    AgentId(topic, self._team_id), DurableChatAgentContainer
                )
                buffer, deferred = at.buffers[name]
                await container.restore(
                    [thread[i] for i in buffer], [thread[i] for i in deferred], log.agent_states.get(name)
                )
        self._states.prime(log.run.message_count)
        return at

    async def _state_at(self, log: RunLog, at: Plan | None = None) -> dict[str, Any]:
        """The team state (TeamState dump, durable format) at the store's head."""
        at = at or plan(log, self._spec, self._participant_names)
        states = {
            p.name: log.agent_states[p.name] if p.name in log.agent_states else await p.save_state()
            for p in self._participants
        }
        result = log.run.result if isinstance(log.run.result, Mapping) else {}
        return at.team_state(
            self._run_id, self._group_chat_manager_name, states, self._fingerprint, result.get("stop_reason")
        )

    async def _import_state(self, state: Mapping[str, Any], *, origin: int) -> None:
        """Seed the run with a loaded state: its thread (from message ``origin`` on), agent states
        and cursor in one commit."""
        agent_states = state["agent_states"]
        manager = agent_states[self._group_chat_manager_name]
        ext = manager["graphflow_durable"]
        thread = [self._message_factory.create(m) for m in manager["message_thread"]]
        records = [
            MessageRecord(origin + i, m.dump(), isinstance(m, BaseChatMessage)) for i, m in enumerate(thread)
        ]
        states = [
            AgentStateRecord(name, agent_states[name]["agent_state"])
            for name in self._participant_names
            if name in agent_states
        ]
        cursor = replace(Cursor.from_extension(ext), origin=origin)
        status: RunStatus = "interrupted" if cursor.status == "running" else cursor.status
        reason = ext.get("stop_reason") if cursor.finished else None
        self._states.clear()  # the loaded agent states are written whole
        self._write(
            Step("import", None, cursor.to_json(self._spec), {"dispatches": ext.get("dispatches", {})}),
            records,
            states,
            RunUpdate(status=status, result={"stop_reason": reason}),
        )
