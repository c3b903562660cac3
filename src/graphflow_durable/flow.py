"""DurableGraphFlow: a drop-in GraphFlow whose runs survive crashes."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.base import ChatAgent, TaskResult, Team, TerminationCondition
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraph, GraphFlow
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import GraphFlowConfig
from autogen_core import AgentId, AgentRuntime, CancellationToken, SingleThreadedAgentRuntime

from . import _graphid
from ._cursor import Cursor
from ._manager import DurableChatAgentContainer, DurableGraphFlowManager, Journal, task_key
from ._restore import Plan, cursor_from_log, plan
from ._snapshots import StateLog
from .errors import GraphMismatchError, LeaseLostError, NotSerializableError, StateFormatError
from .scheduler import GraphSpec, initial
from .store import AgentStateRecord, MessageRecord, RunLog, RunRecord, RunStatus, RunUpdate, Step, Store

__all__ = ["DEFAULT_STORE_ENV", "DurableGraphFlow", "DurableGraphFlowConfig", "default_store_url"]

logger = logging.getLogger(__name__)

DEFAULT_STORE_ENV = "GRAPHFLOW_DURABLE_STORE"
"""Environment variable naming the store URL used when ``store=`` is not given."""


def default_store_url() -> str:
    """``$GRAPHFLOW_DURABLE_STORE``, else ``sqlite:///./.graphflow_durable/runs.db`` (created on use)."""
    url = os.environ.get(DEFAULT_STORE_ENV)
    if url:
        return url
    path = Path.cwd() / ".graphflow_durable" / "runs.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


class DurableGraphFlowConfig(GraphFlowConfig):
    """The declarative configuration of :class:`DurableGraphFlow`: GraphFlow's plus the store and run."""

    store: str | None = None
    run_id: str | None = None


class DurableGraphFlow(GraphFlow):
    """A :class:`~autogen_agentchat.teams.GraphFlow` whose every transition is committed to a database.

    Swap the class name and add ``store=`` and ``run_id=``: every agent completion, the
    remaining-count decrements and the ready-queue enqueues it causes are committed in one
    transaction. A new process constructing the same team with the same ``run_id`` and calling
    :meth:`run` continues where the last commit left off.

    Args:
        participants: as GraphFlow.
        graph: as GraphFlow.
        name, description, termination_condition, max_turns, runtime, custom_message_types: as
            GraphFlow.
        store: a store URL (``sqlite:///runs.db``, ``postgresql://...``) or a :class:`Store`.
            Default: ``$GRAPHFLOW_DURABLE_STORE``, else ``./.graphflow_durable/runs.db``.
        run_id: the run to create or resume. Default: a new random id (see :attr:`run_id`).
        allow_graph_change: resume a stored run even if its graph differs from ``graph``.
        lease_seconds: how long this process's claim on the run lasts without renewal; a crashed
            process's run can be taken over after this (at once on the same host).
        lease_owner: the owner id this team drives the run as. Default: a new id per team. A worker
            that claimed the run (:meth:`Store.claim`) passes its own id, so the team takes the lease
            over from the claim (with a new fencing token) instead of being refused.

    Raises:
        ValueError: as GraphFlow, for invalid graphs or participants.
    """

    component_config_schema = DurableGraphFlowConfig
    component_provider_override = "graphflow_durable.DurableGraphFlow"

    def __init__(
        self,
        participants: list[ChatAgent],
        graph: DiGraph,
        *,
        name: str | None = None,
        description: str | None = None,
        termination_condition: TerminationCondition | None = None,
        max_turns: int | None = None,
        runtime: AgentRuntime | None = None,
        custom_message_types: list[type[BaseAgentEvent | BaseChatMessage]] | None = None,
        store: str | Store | None = None,
        run_id: str | None = None,
        allow_graph_change: bool = False,
        lease_seconds: float = 30.0,
        lease_owner: str | None = None,
    ) -> None:
        super().__init__(
            participants,
            graph,
            name=name,
            description=description,
            termination_condition=termination_condition,
            max_turns=max_turns,
            runtime=runtime,
            custom_message_types=custom_message_types,
        )
        self._store_arg = store
        self._store: Store | None = store if isinstance(store, Store) else None
        self._run_id = run_id or uuid.uuid4().hex
        self._allow_graph_change = allow_graph_change
        self._lease_seconds = lease_seconds
        self._owner = lease_owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._spec = GraphSpec.from_digraph(graph)
        self._graph_description = _graphid.describe_graph(graph, [p.name for p in participants])
        self._fingerprint = _graphid.fingerprint(self._graph_description)
        self._token = 0
        self._synced = False  # in-memory state equals the store's head
        self._pending_import: Mapping[str, Any] | None = None
        self._states = StateLog()  # what this writer last committed per node, for deltas
        self._journal = Journal(
            run_id=self._run_id,
            spec=self._spec,
            participants={p.name: p for p in participants},
            write=self._write,
            fingerprint=self._fingerprint,
        )

    # -- public surface --------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The id of the run this team drives (generated when not given)."""
        return self._run_id

    @property
    def store(self) -> Store:
        """The store this team commits to (opened on first use)."""
        if self._store is None:
            url = self._store_arg if isinstance(self._store_arg, str) else default_store_url()
            self._store = Store(url)
        return self._store

    def run_info(self) -> RunRecord | None:
        """The stored run's record (status, head, lease...), or ``None`` before the first run."""
        return self.store.get_run(self._run_id)

    # -- AutoGen factories -----------------------------------------------------------------------

    def _create_group_chat_manager_factory(
        self,
        name: str,
        group_topic_type: str,
        output_topic_type: str,
        participant_topic_types: list[str],
        participant_names: list[str],
        participant_descriptions: list[str],
        output_message_queue: Any,
        termination_condition: TerminationCondition | None,
        max_turns: int | None,
        message_factory: Any,
    ) -> Callable[[], DurableGraphFlowManager]:
        def _factory() -> DurableGraphFlowManager:
            return DurableGraphFlowManager(
                name=name,
                group_topic_type=group_topic_type,
                output_topic_type=output_topic_type,
                participant_topic_types=participant_topic_types,
                participant_names=participant_names,
                participant_descriptions=participant_descriptions,
                output_message_queue=output_message_queue,
                termination_condition=termination_condition,
                max_turns=max_turns,
                message_factory=message_factory,
                graph=self._graph,
                journal=self._journal,
            )

        return _factory

    def _create_participant_factory(
        self,
        parent_topic_type: str,
        output_topic_type: str,
        agent: ChatAgent | Team,
        message_factory: Any,
    ) -> Callable[[], DurableChatAgentContainer]:
        def _factory() -> DurableChatAgentContainer:
            return DurableChatAgentContainer(
                parent_topic_type, output_topic_type, agent, message_factory, self._journal
            )

        return _factory

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

    # -- running -------------------------------------------------------------------------------

    async def run_stream(
        self,
        *,
        task: str | BaseChatMessage | Sequence[BaseChatMessage] | None = None,
        cancellation_token: CancellationToken | None = None,
        output_task_messages: bool = True,
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]:
        """Run, or resume, the stored run; see :meth:`GraphFlow.run_stream`.

        With no task: resume an unfinished run, or return a finished run's stored result without
        running anything. With the task the current unfinished round started with: resume it
        without adding the task again. With another task: add it as user input (unfinished run)
        or start a new round (finished run).
        """
        messages = _task_messages(task)
        if self._is_running:
            raise ValueError("The team is already running, it cannot run again until it is stopped.")
        run = await self._attach()
        renewer = asyncio.ensure_future(self._renew_lease())
        finished_cleanly = failed = False
        try:
            if run is not None and run.status == "finished" and messages is None:
                yield await self._stored_result(run)
                finished_cleanly = True
                return
            if (
                messages is not None
                and run is not None
                and run.status != "finished"
                and run.task == task_key(messages)
            ):
                logger.info("run %s: same task as the interrupted round; resuming it", self._run_id)
                messages = None
            inner = super().run_stream(
                task=messages,
                cancellation_token=cancellation_token,
                output_task_messages=output_task_messages,
            )
            if cancellation_token is not None:
                cancellation_token.add_callback(self._halt)
            try:
                while True:
                    # GraphFlow's stream, on a cancellation, waits for the runtime to go idle
                    # before it lets go; the manager must stop dispatching *before* that wait, or
                    # the graph runs on to its end inside the cancelled task. So the inner stream
                    # is advanced in its own task and a cancellation of ours halts first.
                    advance = asyncio.ensure_future(inner.__anext__())
                    try:
                        item = await asyncio.shield(advance)
                    except StopAsyncIteration:
                        break
                    except asyncio.CancelledError:
                        self._halt()
                        advance.cancel()
                        with contextlib.suppress(BaseException):
                            await advance
                        raise
                    yield item
                finished_cleanly = True
            finally:
                if not finished_cleanly:
                    self._journal.halted = True
                    await inner.aclose()
        except RuntimeError as exc:
            failed = True
            fatal = self._journal.fatal
            if fatal is not None and fatal is not exc:
                raise fatal from exc
            raise
        finally:
            renewer.cancel()
            self._journal.fatal = None
            self._detach(finished_cleanly, failed)

    def _halt(self) -> None:
        """Stop dispatching new nodes (an interrupt); answers already running are still recorded."""
        self._journal.halted = True

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
                await self._import_state(self._pending_import)
                self._pending_import = None
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
        if self._pending_import is not None:
            if run.message_count:
                store.release_lease(self._run_id, self._token)
                raise StateFormatError(
                    f"run {self._run_id!r} already has {run.message_count} messages in the store; load_state() "
                    "seeds a new run only: construct the team with a new run_id to continue the loaded state"
                )
            await self._import_state(self._pending_import)
            self._pending_import = None
        elif stale:
            await self._restore(store.load(self._run_id))
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
        log = self.store.load(self._run_id)
        cursor = cursor_from_log(log, self._spec)
        thread = [m for m in log.messages if m.seq >= cursor.origin + cursor.round_start]
        factory = self._message_factory
        messages = [factory.create(m.body) for m in thread]
        result = run.result if isinstance(run.result, Mapping) else {}
        return TaskResult(messages=messages, stop_reason=result.get("stop_reason"))

    # -- restoring from the store ----------------------------------------------------------------

    async def _restore(self, log: RunLog) -> None:
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
        self._states.prime(log.agent_states, log.agent_state_steps, log.run.message_count)

    async def _state_at(self, log: RunLog, at: Plan | None = None) -> dict[str, Any]:
        """The team state (TeamState dump, durable format) at the store's head."""
        at = at or plan(log, self._spec, self._participant_names)
        states = {
            p.name: log.agent_states[p.name] if p.name in log.agent_states else await p.save_state()
            for p in self._participants
        }
        return at.team_state(self._run_id, self._group_chat_manager_name, states, self._fingerprint)

    async def _import_state(self, state: Mapping[str, Any]) -> None:
        """Seed the new run with a loaded state: its thread, agent states and cursor in one commit."""
        agent_states = state["agent_states"]
        manager = agent_states[self._group_chat_manager_name]
        ext = manager["graphflow_durable"]
        thread = [self._message_factory.create(m) for m in manager["message_thread"]]
        records = [MessageRecord(i, m.dump(), isinstance(m, BaseChatMessage)) for i, m in enumerate(thread)]
        states = [
            AgentStateRecord(name, agent_states[name]["agent_state"])
            for name in self._participant_names
            if name in agent_states
        ]
        cursor = Cursor.from_extension(ext)
        status: RunStatus = "finished" if cursor.finished else "interrupted"
        self._write(
            Step("import", None, cursor.to_json(self._spec), {"dispatches": ext.get("dispatches", {})}),
            records,
            states,
            RunUpdate(status=status),
        )

    # -- state, reset, component ----------------------------------------------------------------

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """Load a saved team state; the next :meth:`run` continues it durably under :attr:`run_id`.

        The argument is deep-copied. A state saved by plain ``GraphFlow`` (no ``graphflow_durable``
        section) is validated and repaired first -- lost in-flight speakers, an empty ready queue
        with work left, lost loop bookkeeping -- and what was changed is logged. The run must be
        new (or empty) in the store.

        Raises:
            StateFormatError: the state has the wrong shape, or the run already has history.
            UnrepairableStateError: a legacy state whose thread the graph cannot explain.
        """
        copied: dict[str, Any] = copy.deepcopy(dict(state))
        agent_states = copied.get("agent_states")
        manager = (
            agent_states.get(self._group_chat_manager_name) if isinstance(agent_states, Mapping) else None
        )
        if not isinstance(manager, Mapping):
            raise StateFormatError(
                f"not a team state: expected 'agent_states' with a {self._group_chat_manager_name!r} entry, "
                "as GraphFlow.save_state() writes"
            )
        if "graphflow_durable" not in manager:
            from .integrity import repair_state

            repaired = repair_state(copied, graph=self._graph, graph_fingerprint=self._fingerprint)
            for change in repaired.changes:
                logger.warning("run %s: repaired a legacy GraphFlow state: %s", self._run_id, change)
            copied = copy.deepcopy(dict(repaired.state))
        run = self.store.get_run(self._run_id)
        if run is not None and run.message_count:
            raise StateFormatError(
                f"run {self._run_id!r} already has {run.message_count} messages in the store; load_state() "
                "seeds a new run only: construct the team with a new run_id to continue the loaded state"
            )
        self._journal.deferred.clear()
        await GraphFlow.load_state(self, copied)
        self._pending_import = copied
        self._synced = True

    async def reset(self) -> None:
        """Reset the team as GraphFlow does, and start the stored run afresh (its history is kept)."""
        await GraphFlow.reset(self)
        self._journal.deferred.clear()
        self._journal.contexts.clear()
        self._pending_import = None
        self._states.clear()
        store = self.store
        run = store.get_run(self._run_id)
        if run is None:
            return
        token = store.acquire_lease(
            self._run_id,
            self._owner,
            lease_seconds=self._lease_seconds,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        try:
            cursor = Cursor.fresh(initial(self._spec), origin=run.message_count)
            states = [AgentStateRecord(p.name, await p.save_state()) for p in self._participants]
            self._journal.head = store.commit(
                self._run_id,
                expected_head=run.head_seq,
                fencing_token=token,
                step=Step("reset", None, cursor.to_json(self._spec)),
                agent_states=states,
                update=RunUpdate(status="interrupted", task=[]),
            )
        finally:
            store.release_lease(self._run_id, token)
        # GraphFlow.reset() left the manager's cursor at origin 0, but the stored thread continues at
        # run.message_count: the next run must restore the cursor (new origin) from the store.
        self._synced = False

    async def save_state(self) -> Mapping[str, Any]:
        """A JSON-serialisable deep copy of the team's state, in the durable format.

        Taken at any moment, even mid-run, it is a consistent cut: a fresh team resumes it with
        :meth:`load_state` and :meth:`run`. See docs/state-format.md.
        """
        if self._pending_import is None and self.store.get_run(self._run_id) is not None:
            # The store's head is the consistent cut. In memory, mid-run, an in-flight agent may be
            # mid-turn (its state already holding this turn's input, its buffer already cleared),
            # an answer may have reached some participants' buffers before the manager committed
            # it, and the manager extends its thread before its commit: none of that is a cut.
            return await self._state_at(self.store.load(self._run_id))
        return copy.deepcopy(dict(await super().save_state()))

    def _to_config(self) -> DurableGraphFlowConfig:
        for node in self._graph.nodes.values():
            for edge in node.edges:
                if edge.condition_function is not None:
                    raise NotSerializableError(
                        f"edge {node.name!r} -> {edge.target!r} has a callable condition, which cannot be "
                        "serialised; use a string condition, or rebuild the team in code instead of "
                        "dump_component()/load_component()"
                    )
        base = super()._to_config()
        url = self._store_arg if isinstance(self._store_arg, str) else None
        return DurableGraphFlowConfig(**base.model_dump(), store=url, run_id=self._run_id)

    @classmethod
    def _from_config(cls, config: GraphFlowConfig) -> DurableGraphFlow:
        participants = [ChatAgent.load_component(p) for p in config.participants]
        termination = (
            TerminationCondition.load_component(config.termination_condition)
            if config.termination_condition
            else None
        )
        store = getattr(config, "store", None)
        run_id = getattr(config, "run_id", None)
        return cls(
            participants,
            config.graph,
            name=config.name,
            description=config.description,
            termination_condition=termination,
            max_turns=config.max_turns,
            store=store,
            run_id=run_id,
        )


def _task_messages(
    task: str | BaseChatMessage | Sequence[BaseChatMessage] | None,
) -> list[BaseChatMessage] | None:
    """Normalise a task as GraphFlow does (same errors)."""
    if task is None:
        return None
    if isinstance(task, str):
        return [TextMessage(content=task, source="user")]
    if isinstance(task, BaseChatMessage):
        return [task]
    if isinstance(task, list):
        if not task:
            raise ValueError("Task list cannot be empty.")
        if not all(isinstance(m, BaseChatMessage) for m in task):
            raise ValueError("All messages in task list must be valid BaseChatMessage types")
        return list(task)
    raise ValueError("Task must be a string, a BaseChatMessage, or a list of BaseChatMessage.")
