"""DurableGraphFlow: a drop-in GraphFlow whose runs survive crashes.

The public facade. The team holds a :class:`~graphflow_durable._runtime.session.RunSession` (its
stored run) and hands it to its manager and participant containers; what a run does with the
store is there, AutoGen's private names are in ``_runtime``, and no SQL is anywhere near. Here:
the team's construction, its run, the public methods over its stored run outside a run (its
record, the answer to a request, its history, transcript and fork; each one call into the store),
its state; then what a call does on the run it attached (:func:`_opening`) and the pump that drains
GraphFlow's stream (:func:`_pump`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import replace as _replace
from typing import Any

from autogen_agentchat.base import ChatAgent, TaskResult, Team, TerminationCondition
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory
from autogen_agentchat.teams import DiGraph, GraphFlow
from autogen_core import AgentRuntime, CancellationToken
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from graphflow_durable._model import graphid as _graphid
from graphflow_durable._model.history import last_round_of
from graphflow_durable._model.human import HumanInput, InputRequest, human_input_config, human_inputs
from graphflow_durable._model.records import NodeFailure
from graphflow_durable._model.task import task_key, task_messages
from graphflow_durable._runtime.commits import to_the_end
from graphflow_durable._runtime.config import (
    DEFAULT_STORE_ENV,
    DurableGraphFlowConfig,
    GraphFlowConfig,
    always_resume,
    check_crash_attempts,
    config_store_url,
    default_store_url,
    durable_state,
    flow_arguments,
    refuse_callables,
)
from graphflow_durable._runtime.container import DurableChatAgentContainer
from graphflow_durable._runtime.gate import HumanGate, on_waiting_run
from graphflow_durable._runtime.manager import DurableGraphFlowManager
from graphflow_durable._runtime.session import RunSession
from graphflow_durable._runtime.stops import ALWAYS_RESUME_STOP, forget_stale_shutdown
from graphflow_durable._runtime.team import TeamView, limit_calls
from graphflow_durable._runtime.team import record_calls as record_calls_of
from graphflow_durable._runtime.telemetry import Telemetry
from graphflow_durable._storage.lease import check_lease_seconds
from graphflow_durable.errors import NodeFailedError, UsageError
from graphflow_durable.ratelimit import RateLimit
from graphflow_durable.retry import (
    RetryPolicy,
    TimeoutPolicy,
    policies_config,
    register_events,
    retry_policies,
    timeout_policies,
)
from graphflow_durable.scheduler import GraphSpec
from graphflow_durable.store import ENDED_STATUSES, RunRecord, StepInfo, Store

__all__ = [
    "DEFAULT_STORE_ENV",
    "DurableGraphFlow",
    "DurableGraphFlowConfig",
    "HumanInput",
    "InputRequest",
    "SEQ_KEY",
    "attach_stream",
    "default_store_url",
]

logger = logging.getLogger(__name__)

#: run_stream's arguments and stream, for its private halves.
_Task = str | BaseChatMessage | Sequence[BaseChatMessage] | None
_Token = CancellationToken | None
_Stream = AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]


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
        store: a store URL (``sqlite:///runs.db``, ``postgresql://...``, options in the query) or a
            :class:`Store`. Default: ``$GRAPHFLOW_DURABLE_STORE``, else ``./.graphflow_durable/runs.db``.
            A URL is parsed and its options checked here (nothing is connected or created); the
            store is opened on first use.
        run_id: the run to create or resume. Default: a new random id (see :attr:`run_id`); inside
            an agent's turn of a durable run (a nested team), the outer turn's idempotency key and
            this team's name, so an interrupted inner team resumes inside when the outer turn runs
            again. A nested team given no ``store`` stores where the outer run does. A run id is 1 to
            500 printable characters (letters, digits, punctuation such as ``-_.:/``, inner spaces;
            no control characters or line breaks) with no white space at either end; an empty or
            white-space id is refused (``UsageError``), never replaced by a random one.
        allow_graph_change: resume a stored run even if its graph differs from ``graph``.
        lease_seconds: how long this process's claim on the run lasts without renewal; a crashed
            process's run can be taken over after this (at once on the same host).
        lease_owner: the owner id this team drives the run as. Default: a new id per team. A worker
            that claimed the run (``store.queue.claim()``) passes its own id, so the team takes the
            lease over from the claim (with a new fencing token) instead of being refused.
        interrupt_grace_seconds: after an interrupt (the run's task cancelled, e.g. by Ctrl+C, or
            its ``cancellation_token`` cancelled), how long :meth:`run` waits for the agents already
            running to answer (their answers are recorded). Past it, it stops waiting: the agents'
            turns still running are cancelled and forgotten (nothing they do later is recorded), the
            run is left ``interrupted`` with those nodes to run again, the lease is released, and
            :meth:`run` ends as on any interrupt. A second cancellation of the task stops waiting at
            once. An agent that ignores cancellation may keep running in the background of this
            process (a thread cannot be stopped); exit the process to end it.
        human_input: how ``UserProxyAgent`` participants' input functions work: ``"inline"`` (the
            default: the function is called and its answer recorded at once, so a crash before the
            turn's commit never asks again), ``"wait"`` (the request is recorded, the run parks as
            ``waiting`` and :meth:`run` returns; answer later from any process with :meth:`respond`,
            ``Store.respond`` or ``graphflow-durable runs respond``), a :class:`HumanInput` (a mode
            with a deadline and a default answer), or a mapping of ``UserProxyAgent`` node names to
            those (key ``"*"``: the others; another participant's name is a ``UsageError``).
        retry: what a node's turn that raises does (see README, "When an agent fails or hangs"):
            ``None`` (the default: the run fails, as GraphFlow's does), a :class:`RetryPolicy`, a
            number of attempts, or a mapping of node names to those (key ``"*"``: the others). A
            retryable error (:func:`~graphflow_durable.retry.is_retryable`) is recorded as an
            ``attempt_failed`` step, the agent is restored to its state at the turn's dispatch, and
            the turn runs again after the policy's back-off; when the attempts are spent the run is
            ``failed`` and :meth:`run` raises :class:`~graphflow_durable.NodeFailedError`.
        timeout: how long a node's turn may take: ``None`` (no limit), a :class:`TimeoutPolicy`,
            seconds (its ``run_timeout``), or a mapping as for ``retry``. A turn past its limit is
            cancelled and fails with :class:`~graphflow_durable.NodeTimeoutError` (retryable).
        max_crash_attempts: how many times a node's turn may die with its process (SIGKILL, out of
            memory, a crashing native tool: its dispatch was committed and no answer, failure or
            interrupt was recorded before the next driver resumed it) before the run ends ``failed``
            instead of dispatching it again: :meth:`run` and every worker of a pool then leave it
            alone (``run()`` raises :class:`~graphflow_durable.NodeFailedError`) until
            ``graphflow-durable runs retry RUN`` gives the node a fresh budget. Default 5; an int
            1 or more.
        record_calls: record every model call and tool call the participants make inside their
            turns (:func:`~graphflow_durable.recorded`, wrapped here: each participant's model
            client and workbenches, AssistantAgent and its subclasses, SocietyOfMindAgent, and the
            agents of nested teams), so that a turn that runs again -- resumed after a crash, or
            retried -- replays the calls it already made instead of paying for them or repeating a
            tool's side effect. See README, "Recorded model and tool calls". Default ``False``.
        rate_limits: a :class:`~graphflow_durable.RateLimit` or a list: every model call of the agents
            takes a turn of each, shared by every process through the run's store
            (:func:`~graphflow_durable.rate_limited`; a replayed call spends nothing). docs/rate-limits.md.
        tracer_provider: the OpenTelemetry tracer provider of the run's spans (one
            ``invoke_workflow`` span per run()/run_stream(), all of a run's in one trace, across
            processes; no message text). Default: the global one. As AutoGen's runtime, nothing is
            recorded when ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``. Not part of the component config.
        meter_provider: the meter provider of the ``graphflow_durable.*`` metrics (as
            ``tracer_provider``).

    Raises:
        ValueError: as GraphFlow, for invalid graphs or participants.
        UsageError: (a ``ValueError``) ``run_id`` is not a valid run id; ``retry`` or ``timeout``
            has a bad value or names a node that is not a participant.
        StoreConfigError: (a ``UsageError``) ``store`` is a URL that is malformed or unsupported,
            or has an unknown option or a bad value (as :class:`Store` says; no password shown).
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
        interrupt_grace_seconds: float = 5.0,
        human_input: str | HumanInput | Mapping[str, Any] | None = None,
        retry: RetryPolicy | int | Mapping[str, Any] | None = None,
        timeout: TimeoutPolicy | float | Mapping[str, Any] | None = None,
        max_crash_attempts: int = 5,
        record_calls: bool = False,
        rate_limits: RateLimit | Sequence[RateLimit] | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        check_crash_attempts(max_crash_attempts)
        lease_seconds = check_lease_seconds(lease_seconds)
        if not isinstance(record_calls, bool):
            raise UsageError(
                f"record_calls must be True or False, not {record_calls!r}", option="record_calls"
            )
        if not math.isfinite(interrupt_grace_seconds) or interrupt_grace_seconds < 0:
            raise UsageError(
                f"interrupt_grace_seconds must be a number 0 or more, not {interrupt_grace_seconds}",
                option="interrupt_grace_seconds",
            )
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
        register_events(self._message_factory)  # a stored NodeRetryEvent loads back on every team
        self._rate_limits = limit_calls(participants, rate_limits)  # none: nothing wrapped
        self._record_calls = record_calls
        if record_calls:
            record_calls_of(participants)
        self._team_view = TeamView(self)
        self._session = RunSession(
            self._team_view,
            store=store,
            run_id=run_id,
            owner=lease_owner,
            lease_seconds=lease_seconds,
            allow_graph_change=allow_graph_change,
            spec=GraphSpec.from_digraph(graph),
            graph_description=_graphid.describe_graph(graph, [p.name for p in participants]),
            max_crash_attempts=max_crash_attempts,
        )
        self._session.telemetry = Telemetry(tracer_provider, meter_provider)
        self._participant_map: dict[str, ChatAgent | Team] = {p.name: p for p in participants}
        self._driven = False  # this object has run (or loaded a state into) the run
        self._interrupt_grace = float(interrupt_grace_seconds)
        self._gate = HumanGate(self._session, *human_inputs(human_input, [p.name for p in participants]))
        self._gate.install(participants)
        names = [p.name for p in participants]
        self._session.turns.policies(retry_policies(retry, names), timeout_policies(timeout, names))

    # -- AutoGen factories -----------------------------------------------------------------------

    def _create_group_chat_manager_factory(
        self, *args: Any, **kwargs: Any
    ) -> Callable[[], DurableGraphFlowManager]:
        """GraphFlow's manager factory (same arguments), building the durable manager."""

        def _factory() -> DurableGraphFlowManager:
            return DurableGraphFlowManager(
                *args, graph=self._graph, participants=self._participant_map, link=self._session, **kwargs
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
                parent_topic_type, output_topic_type, agent, message_factory, self._session.turns
            )

        return _factory

    # -- running -------------------------------------------------------------------------------

    async def run_stream(
        self,
        *,
        task: str | BaseChatMessage | Sequence[BaseChatMessage] | None = None,
        cancellation_token: CancellationToken | None = None,
        output_task_messages: bool = True,
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]:
        """Run, or resume, the stored run; see :meth:`GraphFlow.run_stream`.

        - No task: resume an interrupted or failed round; continue a round stopped by the
          termination condition (or ``max_turns``) as a new round, as GraphFlow does; on a finished
          run (the graph completed), return the stored result without running anything.
        - The task the current unfinished round began with: resume it without adding the task
          again. The same on the first call of a new team object on an ended run whose last round
          began with this task: return the stored result (re-running a script is idempotent).
        - Another task: add it as user input (unfinished round) or start a new round.

        A round resumed by a new team object (a re-run script after a crash) returns the round's
        whole result, as the uninterrupted run would have; the stream yields only what is new. A
        nested team called by another attempt of its outer turn yields the round's earlier messages
        too (and those of its ended round when it returns its stored result): the outer agent's turn
        runs again from its start and hears the whole round, as its uninterrupted turn did.
        """
        stream = (self._always_resumed if always_resume() else self._attached_stream)(
            task, cancellation_token, output_task_messages
        )
        async with contextlib.aclosing(stream):
            async for item in stream:
                yield item

    async def _always_resumed(
        self, task: _Task, cancellation_token: _Token, output_task_messages: bool
    ) -> _Stream:
        """The always-resume test mode (``$GRAPHFLOW_DURABLE_ALWAYS_RESUME=1``, ``pytest
        --gfd-always-resume``): after each answer's commit the round stops before its next dispatch,
        the team forgets what it holds in memory (the agents are reset, the session is out of step
        with the store) and the next attach rebuilds it from the store (each agent's stored state
        loaded, the scheduler from the stored cursor: a new process's resume), until the round ends.
        One resume per answer: linear in the run's length. The caller sees one call: the stream and
        the result of the uninterrupted run (state that is not durable shows as a different one)."""
        session = self._session
        produced: list[BaseAgentEvent | BaseChatMessage] = []
        while True:
            result: TaskResult | None = None
            session.always_resume = True
            try:
                part = self._attached_stream(task, cancellation_token, output_task_messages)
                async with contextlib.aclosing(part):
                    async for item in part:
                        if isinstance(item, TaskResult):
                            result = item
                        else:
                            yield item
            finally:
                session.always_resume = False
            if result is None:
                return
            produced.extend(result.messages)
            cancelled = cancellation_token is not None and cancellation_token.is_cancelled()
            if session.control.halt_reason != ALWAYS_RESUME_STOP or cancelled:
                yield TaskResult(messages=produced, stop_reason=result.stop_reason)
                return
            await session.tear_down()
            task = None  # the run's own round, resumed

    async def _attached_stream(
        self, task: _Task, cancellation_token: _Token, output_task_messages: bool
    ) -> _Stream:
        """One call of :meth:`run_stream`: attach the run, run or resume its round, detach."""
        messages = task_messages(task)
        if self._is_running:
            raise ValueError("The team is already running, it cannot run again until it is stopped.")
        session = self._session
        if session.bind_to_outer_turn(self.name):
            self._driven = False  # a new outer turn: a run this object has not driven
        first_call = not self._driven
        started_ns = time.time_ns()
        run = await session.attach()  # the lease is ours from here on (given up if it raises)
        self._driven = True
        renewer = asyncio.ensure_future(session.lease.keep())
        finished_cleanly = failed = abandoned = False
        error: BaseException | None = None
        try:  # whatever raises from here on, the finally below gives the lease up
            await session.begin_trace(self.name, run, started_ns)
            tasks = session.telemetry.context()  # the team's tasks run in the workflow span's trace
            result, messages = await _opening(
                session, run, messages, first_call, self._message_factory.create
            )
            session.telemetry.task(messages or [])
            if result is not None:  # a finished or parked run, or a re-run script's ended round
                if session.nested and first_call:  # see below: the outer turn hears its round again
                    ended = await asyncio.to_thread(session.last_round)
                    for message in self._round_messages(ended, output_task_messages):
                        yield message
                yield result
                finished_cleanly = True
                return
            earlier = self._round_messages(session.take_resumed_round(), output_task_messages)
            if messages is not None or not first_call:
                earlier = []  # GraphFlow's habit: a call returns what it produced
            if session.nested:
                # A nested team's caller is an outer turn run again from its start (another attempt),
                # and its agent may build its answer from the stream (SocietyOfMindAgent does): it
                # hears what the round had produced before, as the uninterrupted turn did.
                for message in earlier:
                    yield message
            forget_stale_shutdown(self._runtime)
            inner = super().run_stream(
                task=messages,
                cancellation_token=cancellation_token,
                output_task_messages=output_task_messages,
            )
            if cancellation_token is not None:
                cancellation_token.add_callback(session.halt)
            # GraphFlow's stream, on a cancellation, waits for the runtime to go idle before it
            # lets go; the manager must stop dispatching *before* that wait, or the graph runs on
            # to its end inside the cancelled task. So the inner stream is drained by a task of its
            # own (one for the whole stream, not one per item) and a cancellation of ours halts
            # first, then cancels that task.
            items: asyncio.Queue[Any] = asyncio.Queue()
            pump = tasks.run(asyncio.ensure_future, _pump(inner, items))
            try:
                while True:
                    try:
                        item = await items.get()
                        if isinstance(item, _Raised):
                            raise item.error  # a cancellation (the token's) halts as ours does
                    except asyncio.CancelledError:
                        session.halt()
                        pump.cancel()
                        abandoned = not await self._team_view.wind_down(
                            pump, self._interrupt_grace, session.run_id
                        )
                        raise
                    if item is _END:
                        break
                    if earlier and isinstance(item, TaskResult):
                        item = TaskResult(messages=[*earlier, *item.messages], stop_reason=item.stop_reason)
                    yield item
                finished_cleanly = True
            finally:
                if not finished_cleanly and not abandoned:
                    session.halt()
                    if not pump.done():  # our caller stopped iterating: GraphFlow's stream ends too
                        pump.cancel()
                        await asyncio.wait({pump})
                    await inner.aclose()
        except RuntimeError as exc:
            failed = True
            fatal = session.control.fatal
            error = exc if fatal is None else fatal
            if isinstance(fatal, NodeFailedError) and fatal is not exc:
                raise fatal from fatal.__cause__  # the failed attempt's exception, not GraphFlow's text
            if fatal is not None and fatal is not exc:
                raise fatal from exc
            raise
        finally:
            renewer.cancel()
            refused = None
            try:
                refused = await session.settle_at_end()
            finally:
                try:
                    await to_the_end(session.detach(finished_cleanly, failed, error))
                finally:
                    if abandoned:
                        # The abandoned turns may still end in this process: no write of theirs may
                        # land on the run another process now drives (a token no lease ever has).
                        session.abandon()
                    await to_the_end(session.end_trace(error))
        if finished_cleanly and refused is not None:
            raise refused  # an answer refused for the lost lease ends the round, as when awaited

    def _round_messages(
        self, round_: Sequence[tuple[Mapping[str, Any], bool]], output_task_messages: bool
    ) -> list[BaseAgentEvent | BaseChatMessage]:
        """Message objects of a stored round's messages (dump, whether it was user input): what an
        interrupted round had produced before this team object resumed it, or what an ended one
        produced."""
        factory = self._message_factory
        return [factory.create(body) for body, is_task in round_ if output_task_messages or not is_task]

    def _release_backoffs(self) -> None:
        """Driven by a pool worker (:class:`~graphflow_durable.Worker` calls this): a retry's
        back-off of a second or more leaves the run ``interrupted``, its lease released, for any
        worker to resume once it is due, instead of sleeping it out holding the run."""
        self._session.releases_backoffs = True

    def _drive_alone(self) -> None:
        """Driven by a pool worker that drives nothing else (docs/retries.md, "Crash loops in a pool")."""
        self._session.driven_alone = True

    # -- the stored run, outside a run: each method is one call into the store ----------------

    @property
    def run_id(self) -> str:
        """The id of the run this team drives (generated when not given)."""
        return self._session.run_id

    @property
    def store(self) -> Store:
        """The store this team commits to (opened on first use)."""
        return self._session.store

    def run_info(self) -> RunRecord | None:
        """The stored run's record (status, head, lease..., its pending requests for human input in
        ``pending``, each in-flight node's attempts, failures and crashes in ``turns``; a run failed
        because a budget ran out names the node, attempts, cause and last error in
        ``result["node_failed"]``; while a node backs off after a failed attempt, when its next
        attempt may be dispatched in ``next_attempt_at``, epoch seconds), or ``None`` before the
        first run."""
        store = self.store
        run = store.get_run(self.run_id)
        if run is None:
            return None
        pending = tuple(store.pending_requests(self.run_id))
        at = store.progress(self.run_id)
        return _replace(run, pending=pending, turns=at.turns, next_attempt_at=at.next_attempt_at)

    async def respond(
        self, answer: str, *, node: str | None = None, request_id: str | None = None
    ) -> InputRequest:
        """Answer the run's pending request for human input (``node`` or ``request_id`` names it when
        several are pending); the next :meth:`run` (or a worker of a pool) resumes the run, and the
        asking node's turn gets ``answer`` as if the person had typed it. See :meth:`Store.respond`.

        Raises:
            NotWaitingError: (a ``UsageError``) nothing pending to answer, several and none named,
                or the run is cancelled (resumed, it asks again).
        """
        return await asyncio.to_thread(
            self.store.respond, self.run_id, answer, node=node, request_id=request_id
        )

    # -- history, time travel and fork ---------------------------------------------------------

    def history(self, *, round: int | None = None, node: str | None = None) -> list[StepInfo]:
        """The stored run's steps in order (see :meth:`Store.history`), only round ``round`` and/or
        node ``node`` if given.

        Raises:
            RunNotFoundError: the run is not in the store (before the first run).
        """
        return self.store.history(self.run_id, round=round, node=node)

    def transcript(
        self, *, round: int | None = None, node: str | None = None
    ) -> list[BaseAgentEvent | BaseChatMessage]:
        """The stored run's thread as AutoGen message objects, in order; only round ``round`` and/or
        the answers of node ``node`` if given (see :meth:`Store.transcript`).

        Raises:
            RunNotFoundError: the run is not in the store (before the first run).
        """
        create = self._message_factory.create
        return [create(m.body) for m in self.store.transcript(self.run_id, round=round, node=node)]

    def attach_stream(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]:
        """Watch the stored run from any process, read-only: its messages after ``after_seq`` (all
        when ``None``) as AutoGen message objects, then each new commit's as it lands, then the
        round's :class:`TaskResult` once the run is no longer driven (see :func:`attach_stream`).
        Takes no lease: any number of watchers, while this team or another process drives the run.
        Messages are made by this team's message factory (its ``custom_message_types`` too).
        ``await Console(team.attach_stream())`` prints them as ``run_stream()``'s.
        """
        return attach_stream(self.store, self.run_id, after_seq, message_factory=self._message_factory)

    def fork(
        self, at: int, *, run_id: str | None = None, replace: tuple[int, BaseChatMessage] | None = None
    ) -> RunRecord:
        """Start a new run from this run's step ``at`` (see :meth:`Store.fork`); the stored run is
        only read. Drive the new run with a team built like this one with ``run_id=`` its id:
        ``run()`` with no task continues it from that step. ``replace=(seq, message)``: message
        ``seq`` (a node's text answer) is ``message`` instead, and what followed it runs again.

        Raises:
            RunNotFoundError, UsageError, RunLockedError, ConflictError: as :meth:`Store.fork`.
        """
        edit = None if replace is None else (replace[0], replace[1].dump())
        return self.store.fork(self.run_id, at, new_run_id=run_id, replace=edit)

    # -- state, reset, component ----------------------------------------------------------------

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """Load a saved team state; the next :meth:`run` continues it durably under :attr:`run_id`.

        The argument is deep-copied. A state saved by plain ``GraphFlow`` (no ``graphflow_durable``
        section) is validated and repaired first -- lost in-flight speakers, an empty ready queue
        with work left, lost loop bookkeeping -- and one WARNING line summarises what was changed
        (each change at DEBUG). A state saved after a stop (termination condition, ``max_turns``)
        is a stopped round: :meth:`run` with no task continues it, as GraphFlow does.

        As with GraphFlow, the state may be loaded into a team that has already run: when the run
        exists in the store, the loaded state becomes its new starting point at once (its earlier
        history stays in the store, as after :meth:`reset`).

        A nested team (see ``run_id``) loaded outside its outer turn -- its agent's state restored
        to the outer node's last committed turn, as ``SocietyOfMindAgent.load_state`` does -- takes
        the state in memory only: the outer turn's own inner run, when the store has it, is newer,
        and the next outer turn resumes it inside; a new one starts from a reset team, as every
        outer turn's run does.

        Raises:
            StateFormatError: the state has the wrong shape.
            UnrepairableStateError: a legacy state whose thread the graph cannot explain.
            GraphMismatchError: the stored run was started with a different graph.
            RunLockedError: another live process drives the stored run.
            RuntimeError: the team is running.
        """
        session = self._session
        loaded = durable_state(
            state,
            graph=self._graph,
            fingerprint=session.fingerprint,
            manager_name=self._group_chat_manager_name,
            run_id=session.run_id,
        )
        if self._is_running:
            raise RuntimeError("The team cannot be loaded while it is running.")
        session.bind_to_outer_turn(self.name)  # inside an outer turn: the state is for that turn's run
        # A run() after a load returns what it produces, as GraphFlow's does; a nested team's state
        # loaded outside its outer turn leaves the next turn's run to that turn's first call.
        self._driven = await session.load(loaded)

    async def reset(self) -> None:
        """Reset the team as GraphFlow does, and start the stored run afresh (its history is kept).

        A nested team driving an outer turn's run (see ``run_id``) resets in memory only: its
        stored run belongs to that turn, and the next outer turn drives a run of its own.
        """
        await GraphFlow.reset(self)
        if self._session.nested:
            self._driven = False
        await self._session.restart()

    async def save_state(self, *, at: int | None = None) -> Mapping[str, Any]:
        """A JSON-serialisable deep copy of the team's state, in the durable format.

        Taken at any moment, even mid-run, it is a consistent cut: a fresh team resumes it with
        :meth:`load_state` and :meth:`run`. See docs/state-format.md.

        With ``at``, the state of the stored run as it stood once its step ``at`` was committed (see
        :meth:`history`), read from the store: the same consistent cut, at a past step (its nodes in
        flight then run again when it is loaded and run).

        Raises:
            RunNotFoundError: ``at`` given and the run is not in the store.
            UsageError: ``at`` is not one of the run's steps (1 to its head).
        """
        session = self._session
        if at is not None:
            return await session.state_of(self.store.cut(session.run_id, at))
        if session.pending_import is None and self.store.get_run(session.run_id) is not None:
            # The store's head is the consistent cut. In memory, mid-run, an in-flight agent may be
            # mid-turn (its state already holding this turn's input, its buffer already cleared),
            # an answer may have reached some participants' buffers before the manager committed
            # it, and the manager extends its thread before its commit: none of that is a cut.
            return await session.state_at_head()
        return copy.deepcopy(dict(await super().save_state()))

    def _to_config(self) -> DurableGraphFlowConfig:
        refuse_callables(self._graph)
        session = self._session
        return DurableGraphFlowConfig(
            **super()._to_config().model_dump(),
            store=config_store_url(session.store_arg, self.name),
            run_id=session.run_id if session.run_id_given else None,
            allow_graph_change=session.allow_graph_change,
            lease_seconds=session.lease_seconds,
            interrupt_grace_seconds=self._interrupt_grace,
            human_input=human_input_config(self._gate.default, self._gate.per_node),
            retry=policies_config(self._session.turns.retry),
            timeout=policies_config(self._session.turns.timeout),
            max_crash_attempts=session.max_crash_attempts,
            record_calls=self._record_calls,
            rate_limits=[x.to_json() for x in self._rate_limits],
        )

    @classmethod
    def _from_config(cls, config: GraphFlowConfig) -> DurableGraphFlow:
        participants, graph, options = flow_arguments(config)
        return cls(participants, graph, **options)


# -- what a call does on the run it attached, and after an interrupt ------------------------------


#: The metadata key of a message :func:`attach_stream` yields: its seq in the run's thread (a string,
#: as AutoGen's metadata is ``Dict[str, str]``); pass it back as ``after_seq`` to re-attach after it.
SEQ_KEY = "graphflow_durable.seq"


async def attach_stream(
    store: Store, run_id: str, after_seq: int | None = None, *, message_factory: MessageFactory | None = None
) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | TaskResult, None]:
    """Watch a run from any process that has its store, without its team: what ``run_stream()``
    yields for the committed part of the run.

    Yields the run's messages with a seq greater than ``after_seq`` (all, the task included, when
    ``None``) in order, as AutoGen message objects (loaded by ``message_factory``, default AutoGen's
    own :class:`MessageFactory`: give the team's when it has ``custom_message_types``), each with its
    seq in ``metadata["graphflow_durable.seq"]`` (a string); then each new commit's messages as it
    lands while the run is driven (:meth:`Store.follow`); then the round's :class:`TaskResult`: the
    messages of the run's last round (with their seqs) and its stored stop reason. It ends so when the
    round stops or finishes, and when the run parks waiting for a person (the stop reason says so);
    a run that ended interrupted, failed or cancelled without a stop reason gives its status as
    the reason. A run nobody drives yields what is stored and its result at once.

    Read-only: no lease, any number of watchers, any process; a watcher never slows the driver
    beyond its reads. Re-attach after a lost connection with the last seq seen.

    Raises:
        UsageError: ``after_seq`` is not ``None`` or a whole number >= 0.
        RunNotFoundError: no such run, or it was deleted (maybe made again under its id) while watched.
    """
    create = (message_factory or MessageFactory()).create
    follow = store.follow(run_id, after_seq)
    try:
        async for stored in follow:
            yield _with_seq(create(stored.body), stored.seq)
    finally:
        await follow.aclose()
    run = follow.run
    assert run is not None  # the iteration ended: it read the run's row
    messages = (
        [] if run.head_seq < 1 else last_round_of(await asyncio.to_thread(store.cut, run_id, run.head_seq))
    )
    yield TaskResult(
        messages=[_with_seq(create(m.body), m.seq) for m in messages], stop_reason=_stop_reason(run)
    )


def _with_seq(message: BaseAgentEvent | BaseChatMessage, seq: int) -> BaseAgentEvent | BaseChatMessage:
    message.metadata = {**message.metadata, SEQ_KEY: str(seq)}
    return message


def _stop_reason(run: RunRecord) -> str | None:
    """Why the run's round is no longer driven: the stored stop reason of a round that stopped,
    finished or parked (or of a node's spent budget), else the run's status."""
    result = run.result if isinstance(run.result, Mapping) else {}
    if run.status in ("stopped", "finished", "waiting") or NodeFailure.of(run) is not None:
        reason = result.get("stop_reason")
        return None if reason is None else str(reason)
    return run.status


async def _opening(
    session: RunSession,
    run: RunRecord | None,
    messages: list[BaseChatMessage] | None,
    first_call: bool,
    create: Callable[[Mapping[str, Any]], Any],
) -> tuple[TaskResult | None, list[BaseChatMessage] | None]:
    """What a call does on the run it attached (``run``: ``None`` when the call created it), given
    the call's task ``messages`` and whether it is this team object's first call on the run.

    Returns the stored result to return without running anything (or ``None``), and the task to
    run with: ``None`` when the task is already the run's (the interrupted round began with it) or
    was the answer to a waiting turn's request.
    """
    if run is None:
        return None, messages
    failure = NodeFailure.of(run)
    if failure is not None:  # a budget ran out: nothing runs until `runs retry` gives a fresh one
        said = run.result.get("stop_reason") if isinstance(run.result, Mapping) else None
        raise failure.exception(session.run_id, said if isinstance(said, str) else None)
    if run.status == "waiting":
        own = messages is not None and run.task == task_key(messages)  # a re-run script's task
        if await on_waiting_run(session.store, run, None if own else messages):
            return session.stored_result(run, create), messages
        return None, None  # the task was the answer: the waiting turn resumes with it
    if run.status in ENDED_STATUSES:
        same_task = messages is not None and first_call and run.task == task_key(messages)
        if same_task:
            logger.info(
                "run %s is %s and its last round began with this task: returning the stored "
                "result without running anything (give a new task to start another round, or "
                "call reset() to start over)",
                session.run_id,
                run.status,
            )
        if same_task or (messages is None and run.status == "finished"):
            return session.stored_result(run, create), messages
        return None, messages
    if messages is not None and run.task == task_key(messages):
        logger.info("run %s: same task as the interrupted round; resuming it", session.run_id)
        return None, None
    return None, messages


#: What :func:`_pump` puts after the stream's last item.
_END = object()


class _Raised:
    """What :func:`_pump` puts when the stream raised: the reader raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _pump(stream: AsyncGenerator[Any, None], items: asyncio.Queue[Any]) -> None:
    """Put every item of ``stream`` in ``items``, then :data:`_END`, or what it raised
    (:class:`_Raised`: an error, or the cancellation a cancelled token raises in GraphFlow's
    stream). A cancellation of this task (the reader halted the run) ends it there too."""
    try:
        async for item in stream:
            items.put_nowait(item)
    except BaseException as exc:
        items.put_nowait(_Raised(exc))  # the reader raises it
        if not isinstance(exc, Exception):
            raise
        return
    items.put_nowait(_END)
