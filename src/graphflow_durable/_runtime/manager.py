"""The durable GraphFlow manager.

It replaces GraphFlowManager's in-memory bookkeeping by the pure scheduler (``scheduler``) and
commits every transition through its run's write path (:class:`ManagerLink`: the session gives it) before
anything it decided becomes visible: one commit per agent completion, holding the messages, the
scheduler state after the decrements, enqueues and the next selection, and the agent's state
after its turn.

When a round stops (termination condition, ``max_turns``, the graph's natural end, every node in
flight waiting for a person) is decided by its held :class:`~graphflow_durable._runtime.stops.RoundStops`;
the manager commits the decision and signals it.

A failed attempt under a node's policy (``GroupChatAttemptFailed``) is committed as an
``attempt_failed`` step; the agent is put back at its stored state and the node dispatched again
after its back-off, or, with its attempts spent (or a non-retryable error), the run is committed
``failed`` with its ``node_failed`` marker and ends with :class:`~graphflow_durable.NodeFailedError`.

The back-off is durable: the time the node may run again (``Cursor.retry_at``) is committed with
the ``attempt_failed`` step. ``run()`` sleeps it out holding the lease; a team driven by a pool
worker (``ManagerLink.releases_backoffs``) whose back-off is :data:`RELEASE_BACKOFF` seconds or more
and that has nothing else running leaves the run ``interrupted`` in that same commit, its lease
released and its queue row due then (``ManagerLink.defer``), so that no worker sits on it. A driver
that resumes a run backing off waits out only what is left (or, in a pool, releases it again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from autogen_agentchat.base import ChatAgent, Team
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, StopMessage
from autogen_agentchat.teams._group_chat._events import (
    GroupChatAgentResponse,
    GroupChatRequestPublish,
    GroupChatStart,
    GroupChatTeamResponse,
    SerializableException,
)
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import (
    _DIGRAPH_STOP_MESSAGE,
    GraphFlowManager,
)
from autogen_core import CancellationToken, DefaultTopicId, MessageContext, event, rpc

from graphflow_durable import context as _context
from graphflow_durable._model.cursor import Cursor, without_one
from graphflow_durable._model.records import NodeFailure
from graphflow_durable._model.task import task_key
from graphflow_durable._runtime.commits import Commits
from graphflow_durable._runtime.container import GroupChatAttemptFailed, Turns, answer_delta
from graphflow_durable._runtime.gate import GroupChatInputPending
from graphflow_durable._runtime.stops import ALWAYS_RESUME_STOP, RoundStops, RunControl
from graphflow_durable._runtime.telemetry import Telemetry
from graphflow_durable._storage.lease import iso
from graphflow_durable.errors import NodeFailedError, NodeTimeoutError, StateFormatError
from graphflow_durable.retry import NodeRetryEvent, RetryPolicy, delay, is_retryable
from graphflow_durable.scheduler import GraphSpec, SchedulerState, complete, finish, initial, select
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunUpdate, Step, StepKind

__all__ = ["RELEASE_BACKOFF", "DurableGraphFlowManager", "ManagerLink"]

logger = logging.getLogger(__name__)

#: A pool worker releases a run for a back-off of this many seconds or more (a shorter one it sleeps
#: out: a release, a claim and a restore cost more than that).
RELEASE_BACKOFF = 1.0


class ManagerLink(Protocol):
    """What the manager needs of its stored run (the run session gives it): the write path to commit
    through, the run's control to stop by, a dispatch check, the turns to dispatch to, and the
    requests for human input to park on."""

    run_id: str
    spec: GraphSpec
    fingerprint: str
    turns: Turns
    control: RunControl
    max_crash_attempts: int
    releases_backoffs: bool
    """Driven by a pool worker: a back-off of :data:`RELEASE_BACKOFF` seconds or more releases the run."""
    driven_alone: bool
    """Claimed by a pool worker that drives nothing else meanwhile."""
    telemetry: Telemetry
    always_resume: bool
    """The always-resume test mode: after each answer's commit, the round stops before its next
    dispatch (:data:`ALWAYS_RESUME_STOP`) and the flow resumes it from the store."""

    @property
    def commits(self) -> Commits: ...

    async def may_dispatch(self) -> bool:
        """Whether the lease is still held (else the run is halted)."""

    async def answered(self, request_ids: Sequence[str]) -> list[str]:
        """Which of the run's requests for human input are answered."""

    async def parked(self, request_ids: Sequence[str]) -> None:
        """The round parked for human input."""

    def take_resume_budget(self) -> tuple[frozenset[str] | None, bool]:
        """Once per attach: the other runs whose turns died with the previous driver's process if
        it died with turns in flight (``None``: it did not), and whether the run was given a fresh
        budget (``runs retry``)."""

    async def defer(self, until: float) -> None:
        """While the lease is held: no pool worker claims the run before ``until`` (epoch seconds)."""

    async def isolate(self) -> None:
        """While the lease is held: a pool worker claims the run only to drive it alone."""


class DurableGraphFlowManager(GraphFlowManager):
    """A GraphFlowManager whose every transition is committed before it takes effect."""

    def __init__(
        self,
        *args: Any,
        participants: Mapping[str, ChatAgent | Team],
        link: ManagerLink,
        **kwargs: Any,
    ) -> None:
        """``args``/``kwargs``: GraphFlowManager's (what GraphFlow passes its manager factory, and
        the graph), handed on unchanged."""
        super().__init__(*args, **kwargs)
        self._link = link
        self._participants = participants
        self._spec = link.spec
        self._stop_reason: str | None = None
        self._cursor = Cursor.fresh(initial(self._spec))
        self._batch_delta: list[BaseAgentEvent | BaseChatMessage] = []
        # The round's stop decisions: termination checks, and the in-flight nodes waiting for a person.
        self._stops = RoundStops(self._termination_condition, self._max_turns, self._name, self._spec)
        self._sequential_message_types = [
            *self._sequential_message_types,
            GroupChatInputPending,
            GroupChatAttemptFailed,
        ]

    # -- state ---------------------------------------------------------------------------------

    @property
    def scheduler_state(self) -> SchedulerState:
        return self._cursor.sched

    @property
    def cursor(self) -> Cursor:
        return self._cursor

    def _thread_len(self) -> int:
        return len(self._message_thread)

    # -- the two entry points -------------------------------------------------------------------

    @rpc
    async def handle_start(self, message: GroupChatStart, ctx: MessageContext) -> None:  # type: ignore[override]
        """Start a round, add user input to an unfinished one, or resume an interrupted batch."""
        await self._or_fail(self._start(message, ctx))

    @event
    async def handle_agent_response(  # type: ignore[override]
        self, message: GroupChatAgentResponse | GroupChatTeamResponse, ctx: MessageContext
    ) -> None:
        """Record one node's answer, and the next selection when its batch is complete, in one commit."""
        await self._or_fail(self._on_response(message, ctx))

    @event
    async def handle_input_pending(self, message: GroupChatInputPending, ctx: MessageContext) -> None:
        """A node's turn waits for human input: park the run once nothing else is running."""
        if message.name in self._cursor.sched.in_flight:  # else a late signal of a turn no longer in flight
            self._stops.parked[message.name] = message
            await self._or_fail(self._park_if_blocked(ctx.cancellation_token))

    @event
    async def handle_attempt_failed(self, message: GroupChatAttemptFailed, ctx: MessageContext) -> None:
        """An attempt of a node's turn raised or timed out under a policy: retry it or fail the run."""
        await self._or_fail(self._on_attempt_failed(message, ctx.cancellation_token))

    async def _park_if_blocked(self, token: CancellationToken) -> None:
        """When every node in flight waits for a person: the nodes whose request was answered
        meanwhile (while this driver ran the others) run again now, with their answer; when none
        was, commit the wait (status ``waiting``, the lease released) and end the round with a stop
        reason naming them."""
        waiting = self._stops.waiting(self._cursor.sched.in_flight)
        if waiting is None:
            return
        reason, ids = waiting
        answered = await self._link.answered(ids)
        if answered:
            nodes = self._stops.unpark(answered)
            logger.info(
                "run %s: %s answered while the run was driven; re-running %s",
                self._link.run_id,
                ", ".join(nodes),
                ", ".join(nodes),
            )
            await self._redispatch(nodes, token)
            return
        self._stop_reason = reason
        # The requests parked on, beside the reason: an answer makes the run resumable once none of
        # them is pending (Store.respond), and run() resumes it once one is answered.
        update = RunUpdate(
            status="waiting", result={"stop_reason": reason, "waiting": ids}, release_lease=True
        )
        await self._link.commits.write(
            Step(StepKind.WAIT, None, self._cursor.to_json(self._spec), {"waiting": ids}), (), (), update
        )
        self._stops.parked.clear()
        await self._link.parked(ids)
        await self._signal_termination(StopMessage(content=reason, source=self._name))

    async def _redispatch(self, nodes: Sequence[str], token: CancellationToken) -> None:
        """Run in-flight ``nodes`` again (attempt + 1, same dispatch point and key): parked nodes
        whose requests were answered while this driver was attached, or a failed attempt's node."""
        self._cursor = self._cursor.redispatched(nodes)
        head = await self._commit(
            Step(StepKind.RESUME, None, self._cursor.to_json(self._spec), {"redispatched": list(nodes)}),
            (),
            (),
            None,
        )
        await self._dispatch(nodes, head, token)

    async def _on_attempt_failed(self, message: GroupChatAttemptFailed, token: CancellationToken) -> None:
        """Record the failed attempt (``cursor.failed``); then, when the node's retry policy allows
        another attempt and the error is retryable: put the agent back at its stored state (its
        input buffer is untouched by a failed turn), wait the back-off holding the lease (or, in a
        pool, release the run for it), and dispatch the node again. Otherwise fail the run with the
        node's ``node_failed`` marker."""
        name = message.name
        exc = self._link.turns.take_error(name)
        if name not in self._cursor.sched.in_flight:
            return  # a late signal of a turn that is no longer in flight
        policy = self._link.turns.retry.get(name)
        self._cursor = self._cursor.failed(name)
        used = self._cursor.failures[name]
        retry = (
            policy is not None
            and used < policy.max_attempts
            and exc is not None
            and is_retryable(exc, policy)
        )
        data: dict[str, Any] = {
            "node": name,
            "attempt": message.attempt,
            "error_type": message.error_type,
            "error": message.error,
            "elapsed": round(message.elapsed, 3),
        }
        self._link.telemetry.attempt_failed(name, message.attempt, message.error_type, retry)
        if policy is None or not retry:
            await self._exhausted(name, used, message, exc, data, policy)
            return
        wait = delay(policy, message.attempt, exc)
        # The wall clock: the time is durable (another process resumes the run by it) and is the
        # pool queue's not_before.
        retry_at = time.time() + wait
        self._cursor = self._cursor.backing_off(name, retry_at)
        # A pool worker does not sit on a run for its back-off: with nothing else of the run running,
        # the queue row is made due then and this commit leaves the run interrupted, lease released.
        release = (
            self._link.releases_backoffs
            and wait >= RELEASE_BACKOFF
            and set(self._cursor.sched.in_flight) == {name}
        )
        if release:
            await self._link.defer(retry_at)
        await self._commit(
            Step(
                StepKind.ATTEMPT_FAILED,
                name,
                self._cursor.to_json(self._spec),
                {**data, "retry_in": wait, "retry_at": retry_at},
            ),
            (),
            (),
            None,
            RunUpdate(status="interrupted", release_lease=True) if release else None,
        )
        logger.warning(
            "run %s: node %r attempt %d of %d failed (%s: %s); retrying in %.1f s",
            self._link.run_id,
            name,
            message.attempt,
            policy.max_attempts,
            message.error_type,
            message.error.splitlines()[0] if message.error else "",
            wait,
        )
        await self._output_message_queue.put(
            NodeRetryEvent(
                source=name,
                node=name,
                attempt=message.attempt,
                error=f"{message.error_type}: {message.error}",
                retry_in=wait,
            )
        )
        # The agent as stored at the turn's dispatch (its last answer's state, or the run's
        # starting state): nothing of the failed attempt stays in its memory.
        state = await self._link.turns.stored_state(self._link.run_id, name)
        if state is not None:
            await self._participants[name].load_state(state)
        if release:
            await self._released_for_backoff([name], retry_at)
            return
        if not await self._backed_off(retry_at):  # nothing more runs: the node stays in flight
            await self._dispatch([name], self._link.commits.head, token)
            return
        await self._redispatch([name], token)

    async def _backed_off(self, until: float) -> bool:
        """Sleep until ``until`` (epoch seconds) holding the lease (renewed meanwhile); ``False`` when
        the run was halted meanwhile (an interrupt, a lost lease): nothing is to be dispatched."""
        while not self._link.control.halted and (left := until - time.time()) > 0:
            await asyncio.sleep(min(left, 0.25))
        # A driver frozen through its back-off (a paused process) may have lost the run meanwhile,
        # its renewer not having run: confirm the lease before the re-dispatch commits anything.
        return not self._link.control.halted and await self._link.may_dispatch()

    async def _released_for_backoff(self, nodes: Sequence[str], until: float) -> None:
        """The run was left ``interrupted`` for ``nodes``' back-off, its lease released: end the
        round, saying until when (a pool worker claims it again then)."""
        reason = (
            f"{', '.join(nodes)} backing off until {iso(until)}: the run is released for the pool "
            "(any worker resumes it then)"
        )
        logger.info("run %s: %s", self._link.run_id, reason)
        self._stop_reason = reason
        self._link.control.halt(reason)
        await self._signal_termination(StopMessage(content=reason, source=self._name))

    async def _exhausted(
        self,
        name: str,
        used: int,
        message: GroupChatAttemptFailed,
        exc: BaseException | None,
        data: Mapping[str, Any],
        policy: RetryPolicy | None,
    ) -> None:
        """No further attempt: commit the failed attempt and the run ``failed`` with its marker,
        and end the round with :class:`NodeFailedError` (chaining the attempt's exception), which
        says why when attempts were left (the error is not retryable under the policy)."""
        reason = None
        if policy is not None and used < policy.max_attempts:
            reason = _not_retryable(message.error_type, exc, policy)
        error = NodeFailedError(
            node=name,
            attempts=used,
            error_type=message.error_type,
            error=message.error,
            run_id=self._link.run_id,
            allowed=None if policy is None else policy.max_attempts,
            reason=reason,
        )
        error.__cause__ = exc
        marker = NodeFailure(
            name,
            used,
            message.error_type,
            message.error,
            "timeout" if isinstance(exc, NodeTimeoutError) else "error",
        )
        self._stop_reason = str(error)
        update = RunUpdate(
            status="failed",
            result={"stop_reason": self._stop_reason, "node_failed": marker.to_json()},
            release_lease=True,
        )
        await self._link.commits.write(
            Step(StepKind.ATTEMPT_FAILED, name, self._cursor.to_json(self._spec), data), (), (), update
        )
        self._link.control.fail(error)
        await self._signal_termination_with_error(SerializableException.from_exception(error))

    async def _or_fail(self, work: Awaitable[None]) -> None:
        """Await a handler's work; an error it could not record ends the run with it (and goes on
        to the runtime, as GraphFlow's manager lets it)."""
        try:
            await work
        except Exception as exc:
            await self._fail(exc)
            raise

    async def _fail(self, exc: Exception) -> None:
        self._link.control.fail(exc)
        await self._signal_termination_with_error(SerializableException.from_exception(exc))

    async def _start(self, message: GroupChatStart, ctx: MessageContext) -> None:
        if self._termination_condition is not None and self._termination_condition.terminated:
            await self._signal_termination(
                StopMessage(content="The group chat has already terminated.", source=self._name)
            )
            return
        self._link.control.start_round()
        self._stops.parked.clear()
        task = list(message.messages or [])
        cursor = self._cursor
        kind = StepKind.RESUME
        if cursor.finished:
            cursor = cursor.new_round(self._thread_len())
            kind = StepKind.START
        if task:
            kind = StepKind.START if kind is StepKind.START else StepKind.INPUT
            await self.publish_message(
                GroupChatStart(messages=task), topic_id=DefaultTopicId(type=self._output_topic_type)
            )
            if message.output_task_messages:
                for msg in task:
                    await self._output_message_queue.put(msg)
            await self.publish_message(
                GroupChatStart(messages=task),
                topic_id=DefaultTopicId(type=self._group_topic_type),
                cancellation_token=ctx.cancellation_token,
            )
        first = self._thread_len()
        self._message_thread.extend(task)
        records = [MessageRecord(cursor.origin + first + i, m.dump(), True) for i, m in enumerate(task)]

        died, fresh = self._link.take_resume_budget()
        # A fresh budget's mark is cleared by the commit that applies it (result {}: the run runs).
        update = RunUpdate(
            status="running",
            task=task_key(task) if kind is StepKind.START else None,
            result={} if fresh else None,
        )
        stop = await self._stops.condition_stop(task) if task else None
        if stop is not None:
            self._cursor = cursor.ended(cursor.sched, stopped=True)
            await self._commit(Step(kind, None, self._cursor.to_json(self._spec)), records, (), stop, update)
            await self._signal_termination(stop)
            return

        resumed = bool(cursor.sched.in_flight)
        if cursor.end_due and not resumed:
            # An operator supplied the batch's last answer: its end is decided here, as _on_response
            # decides it after a batch's last answer (the condition sees the batch's messages).
            stop, sched, natural = await self._stops.batch_stop(cursor.sched, self._batch_delta)
            cursor = replace(cursor, sched=sched, end_due=False)
            if stop is not None:
                self._cursor = cursor.ended(sched, stopped=not natural)
                await self._commit(
                    Step(kind, None, self._cursor.to_json(self._spec)), records, (), stop, update
                )
                await self._signal_termination(stop)
                return
        if kind is StepKind.RESUME and not resumed and self._thread_len():
            logger.info(
                "run %s: resuming after step %d; nothing in flight, next: %s",
                self._link.run_id,
                self._link.commits.head,
                ", ".join(cursor.sched.ready) or "nothing (the graph is complete)",
            )
        if resumed:
            # Resumed inside a batch: the nodes that had not answered run again, before anything
            # that became ready meanwhile.
            speakers = cursor.sched.in_flight
            # The budget, counted before any dispatch and committed with it: the turns of a driver
            # that died count one crash each; a node that died max_crash_attempts times is not run.
            cursor = cursor.fresh_budget() if fresh else cursor
            # A node backing off had its failure recorded, and was not running: no crash of its.
            if died is not None:
                cursor = cursor.crashed([n for n in speakers if n not in cursor.retry_at], died)
            spent, unclear = cursor.spent(speakers, self._link.max_crash_attempts)
            if spent:
                await self._crash_loop(cursor, spent[0], records, update)
                return
            if unclear and self._link.releases_backoffs and not self._link.driven_alone:
                await self._release_to_run_alone(cursor, kind, unclear, records, update)
                return
            due = cursor.next_attempt_at(speakers)
            if due is not None and not await self._resume_after_backoff(cursor, kind, due, records, update):
                return
            # Nodes the always-resume mode halted before they started run their first attempt.
            unstarted, self._link.control.unstarted = self._link.control.unstarted, ()
            cursor = cursor.redispatched([n for n in speakers if n not in unstarted])
            logger.info(
                "run %s: resuming after step %d; re-running %s",
                self._link.run_id,
                self._link.commits.head,
                ", ".join(f"{n} (attempt {cursor.attempts[n]})" for n in dict.fromkeys(speakers)),
            )
        elif cursor.sched.ready:
            sched, speakers = select(self._spec, cursor.sched)
            cursor = cursor.dispatched(sched, speakers, self._thread_len(), self._link.commits.head + 1)
            self._batch_delta = []
        else:
            stop = StopMessage(content=_DIGRAPH_STOP_MESSAGE, source=self._name)
            self._cursor = cursor.ended(finish(self._spec, cursor.sched), stopped=False)
            await self._commit(Step(kind, None, self._cursor.to_json(self._spec)), records, (), stop, update)
            await self._signal_termination(stop)
            return
        self._cursor = cursor
        # A re-dispatch keeps the nodes' original dispatch point (their input); only a selection
        # records a new one.
        data = (
            {"redispatched": list(speakers)}
            if resumed
            else {"dispatched": list(speakers), "at": first + len(task)}
        )
        head = await self._commit(
            Step(kind, None, cursor.to_json(self._spec), data),
            records,
            (),
            None,
            update,
        )
        await self._dispatch(speakers, head, ctx.cancellation_token)

    async def _resume_after_backoff(
        self,
        cursor: Cursor,
        kind: StepKind,
        due: float,
        records: Sequence[MessageRecord],
        update: RunUpdate,
    ) -> bool:
        """The resumed nodes back off until ``due`` (the previous driver was interrupted, or released
        the run, during a back-off): wait out what is left of it holding the lease, and return
        whether to dispatch them now. A pool worker with :data:`RELEASE_BACKOFF` seconds or more
        left releases the run again instead (committing what this resume changed, the run left
        ``interrupted``); a halt during the wait dispatches nothing (nothing was committed)."""
        left = due - time.time()
        if left <= 0:
            return True
        nodes = [n for n in dict.fromkeys(cursor.sched.in_flight) if n in cursor.retry_at]
        if not (self._link.releases_backoffs and left >= RELEASE_BACKOFF):
            logger.info(
                "run %s: %s backing off until %s; waiting %.1f s",
                self._link.run_id,
                ", ".join(nodes),
                iso(due),
                left,
            )
            if await self._backed_off(due):
                return True
            if self._link.control.halt_reason is not None:  # nothing runs now: the round ends, saying why
                await self._signal_termination(
                    StopMessage(content=self._link.control.halt_reason, source=self._name)
                )
            return False
        self._cursor = cursor
        await self._link.defer(due)
        await self._commit(
            Step(kind, None, cursor.to_json(self._spec), {"backing_off": nodes, "until": due}),
            records,
            (),
            None,
            replace(update, status="interrupted", release_lease=True),
        )
        await self._released_for_backoff(nodes, due)
        return False

    async def _release_to_run_alone(
        self,
        cursor: Cursor,
        kind: StepKind,
        nodes: Sequence[str],
        records: Sequence[MessageRecord],
        update: RunUpdate,
    ) -> None:
        """``nodes``' turns died ``max_crash_attempts`` times, each time with another run's turn
        in flight in the same process (``crash_with``): either may have killed it. Commit what this
        resume counted, the run left ``interrupted`` for a pool worker that drives nothing else
        (its next crash is its own), and end the round saying so."""
        others = sorted({r for n in nodes for r in cursor.crash_with[n]})
        reason = (
            f"{', '.join(nodes)} died with their process {cursor.crashes[nodes[0]]} times, each time with "
            f"run {', '.join(others)} in flight too: the run is released for a pool worker to drive it alone"
        )
        logger.warning("run %s: %s", self._link.run_id, reason)
        self._cursor = cursor
        await self._link.isolate()
        await self._commit(
            Step(kind, None, cursor.to_json(self._spec), {"run_alone": list(nodes)}),
            records,
            (),
            None,
            replace(update, status="interrupted", release_lease=True),
        )
        self._stop_reason = reason
        self._link.control.halt(reason)
        await self._signal_termination(StopMessage(content=reason, source=self._name))

    async def _crash_loop(
        self, cursor: Cursor, node: str, records: Sequence[MessageRecord], update: RunUpdate
    ) -> None:
        """``node``'s turn died with its process ``max_crash_attempts`` times: commit the run
        ``failed`` with the ``node_failed`` marker (cause ``crash``) and the counts, and raise."""
        failure = NodeFailure.crash(node, cursor.crashes[node])
        error = failure.exception(self._link.run_id)
        self._cursor = cursor
        self._stop_reason = str(error)
        logger.error("%s", error)
        await self._link.commits.write(
            Step(StepKind.INTERRUPT, None, cursor.to_json(self._spec), {"node_failed": failure.to_json()}),
            records,
            (),
            RunUpdate(
                status="failed",
                task=update.task,
                result={"stop_reason": str(error), "node_failed": failure.to_json()},
                release_lease=True,
            ),
        )
        raise error

    async def _on_response(
        self, message: GroupChatAgentResponse | GroupChatTeamResponse, ctx: MessageContext
    ) -> None:
        name = message.name
        if name not in self._cursor.sched.in_flight:
            logger.warning(
                "run %s: ignoring a response from %r, which is not in flight (late or duplicate)",
                self._link.run_id,
                name,
            )
            return
        delta, published = answer_delta(message)
        first = len(self._message_thread)
        self._message_thread.extend(delta)
        self._batch_delta.extend(delta)
        records = [
            MessageRecord(self._cursor.origin + first + i, m.dump(), p)
            for i, (m, p) in enumerate(zip(delta, published, strict=True))
        ]
        last = next((m for m in reversed(delta) if isinstance(m, BaseChatMessage)), None)
        if last is None:
            sched = replace(self._cursor.sched, in_flight=without_one(self._cursor.sched.in_flight, name))
        else:
            sched = complete(self._spec, self._cursor.sched, name, last)
        states = [AgentStateRecord(name, await self._participants[name].save_state())]
        self._link.turns.answered(name)

        if sched.in_flight:
            # Nothing is dispatched on this answer: its commit is handed over without waiting, so
            # that the batch's other answers join it in one group; the batch's last answer waits
            # for them all before it dispatches (Commits.write).
            self._cursor = self._cursor.answered(name, sched)
            await self._commit(
                Step(StepKind.COMPLETE, name, self._cursor.to_json(self._spec)),
                records,
                states,
                None,
                wait=False,
            )
            if self._stops.parked:  # the others wait for a person: this was the last one running
                await self._park_if_blocked(ctx.cancellation_token)
            return

        # The batch is complete: decide the stop, or select the next batch, in this same commit.
        stop, sched, natural = await self._stops.batch_stop(sched, self._batch_delta)
        if stop is not None:
            self._cursor = self._cursor.answered(name, sched).ended(sched, stopped=not natural)
            await self._commit(
                Step(StepKind.COMPLETE, name, self._cursor.to_json(self._spec)), records, states, stop
            )
            await self._signal_termination(stop)
            return
        sched, speakers = select(self._spec, sched)
        at = len(self._message_thread)
        # No .answered(name, sched) first: .dispatched sets every per-turn map of the new batch.
        self._cursor = self._cursor.dispatched(sched, speakers, at, self._link.commits.head + 1)
        self._batch_delta = []
        head = await self._commit(
            Step(
                StepKind.COMPLETE,
                name,
                self._cursor.to_json(self._spec),
                {"dispatched": list(speakers), "at": at},
            ),
            records,
            states,
            None,
        )
        if self._link.always_resume:
            # The test mode that proves every piece of state durable: nothing dispatched from this
            # process's memory; the flow rebuilds the team from the store and the resume dispatches.
            self._link.control.halt(ALWAYS_RESUME_STOP)
            self._link.control.unstarted = tuple(speakers)
        await self._dispatch(speakers, head, ctx.cancellation_token)

    # -- commit and dispatch ------------------------------------------------------------------

    async def _commit(
        self,
        step: Step,
        messages: Sequence[MessageRecord],
        states: Sequence[AgentStateRecord],
        stop: StopMessage | None,
        update: RunUpdate | None = None,
        *,
        wait: bool = True,
    ) -> int:
        if stop is not None:
            task = update.task if update is not None else None
            update = RunUpdate(
                status="stopped" if self._cursor.stopped else "finished",
                task=task,
                result={"stop_reason": stop.content},
                release_lease=True,  # the round's last commit: nothing more is done under the lease
            )
            self._stop_reason = stop.content
        self._current_turn = self._cursor.sched.turn
        return await self._link.commits.write(step, messages, states, update, wait=wait)

    async def _dispatch(self, speakers: Sequence[str], head: int, token: CancellationToken) -> None:
        # A dispatch needs the lease: a monotonic-clock comparison, a renewal only when it is stale
        # (an interrupt may halt the run while that renewal is under way).
        if self._link.control.halted or not await self._link.may_dispatch() or self._link.control.halted:
            logger.info("run %s: halted, not dispatching %s", self._link.run_id, list(speakers))
            if self._link.control.halt_reason is not None:  # nothing runs now: the round ends, saying why
                await self._signal_termination(
                    StopMessage(content=self._link.control.halt_reason, source=self._name)
                )
            return
        await self._log_speaker_selection(list(speakers))
        for speaker in speakers:
            self._link.turns.dispatched(
                _context.ExecutionContext(
                    run_id=self._link.run_id,
                    node=speaker,
                    step=self._cursor.dispatch_step.get(speaker, head),
                    attempt=self._cursor.attempts.get(speaker, 1),
                    origin_key=self._cursor.keys.get(speaker),
                )
            )
            await self.publish_message(
                GroupChatRequestPublish(),
                topic_id=DefaultTopicId(type=self._participant_name_to_topic_type[speaker]),
                cancellation_token=token,
            )

    # -- GraphFlowManager's other hooks -----------------------------------------------------------

    async def select_speaker(self, thread: Sequence[BaseAgentEvent | BaseChatMessage]) -> list[str]:
        raise NotImplementedError("DurableGraphFlowManager selects inside its commits")

    async def reset(self) -> None:
        self._current_turn = 0
        self._message_thread.clear()
        if self._termination_condition is not None:
            await self._termination_condition.reset()
        self._cursor = Cursor.fresh(initial(self._spec))
        self._batch_delta = []
        self._stops.parked.clear()

    async def save_state(self) -> Mapping[str, Any]:
        """GraphFlow's keys (in-flight nodes first in ``ready``) plus the durable extension."""
        return {
            "message_thread": [m.dump() for m in self._message_thread],
            **self._cursor.sched.plain_view(),
            "graphflow_durable": self._cursor.extension(
                self._link.run_id,
                graph_fingerprint=self._link.fingerprint,
                stop_reason=self._stop_reason,
            ),
        }

    async def load_state(self, state: Mapping[str, Any]) -> None:
        """Load a state in the durable format (legacy states are repaired by the flow first)."""
        ext = state.get("graphflow_durable")
        if not isinstance(ext, Mapping):
            raise StateFormatError(
                "the manager state has no 'graphflow_durable' section; "
                "load it through DurableGraphFlow.load_state(), which repairs legacy states",
                run_id=self._link.run_id,
                pointer="/graphflow_durable",
            )
        thread = [self._message_factory.create(m) for m in state["message_thread"]]
        await self.restore(thread, Cursor.from_extension(ext))

    async def restore(self, thread: list[BaseAgentEvent | BaseChatMessage], cursor: Cursor) -> None:
        """Put the manager at ``cursor`` with ``thread`` (the objects are kept, not copied)."""
        self._message_thread = thread
        self._cursor = cursor
        self._current_turn = cursor.sched.turn
        self._batch_delta = list(thread[cursor.batch_start :])
        self._stops.parked.clear()
        # The termination condition sees the committed history of the current round again.
        seen = [] if cursor.finished else thread[cursor.round_start : cursor.batch_start]
        await self._stops.replay(seen, self._link.run_id)


def _not_retryable(error_type: str, exc: BaseException | None, policy: RetryPolicy) -> str:
    """Why an attempt's error is not retried under ``policy``, and what would retry it."""
    if exc is not None and policy.non_retryable and is_retryable(exc, replace(policy, non_retryable=())):
        listed = f"non_retryable={list(policy.non_retryable)!r}"
        return (
            f"{error_type} is not retryable under its retry policy ({listed}); remove it from non_retryable"
        )
    listed = f"retry_on={list(policy.retry_on)!r}"
    return f"{error_type} is not retryable under its retry policy ({listed}); add it to retry_on to retry it"
