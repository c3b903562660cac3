"""The durable participant container: runs a node's turn inside its execution context and keeps
the messages that arrived during the turn (deferred) behind it; and what crosses between the
durable manager and the containers during a turn.

The manager dispatches a node's turn and records its :class:`~graphflow_durable.ExecutionContext` in
:class:`Turns`; the node's container runs the agent inside :meth:`Turns.running`, which makes that
context (and the run's store, for a nested durable team) visible to the agent's code.

The container runs each attempt of an agent's turn itself, as GraphFlow's container does, inside
AutoGen's ``invoke_agent`` span (on the team's tracer provider, given the turn's node, step,
attempt and run): the agent's stream through ``retry.within_limits`` (on the turn's own child
token under a time limit).
Under a node's retry or timeout policy (:class:`Turns` holds them) a failed attempt is reported to
the manager (:class:`GroupChatAttemptFailed`, its exception kept in :class:`Turns`) instead of
ending the run; with no policy, it ends the run as in GraphFlow. A nested team's turn is GraphFlow's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from functools import partial
from typing import Any

from autogen_agentchat.base import ChatAgent, Response, Team
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory
from autogen_agentchat.teams._group_chat._chat_agent_container import ChatAgentContainer
from autogen_agentchat.teams._group_chat._events import (
    GroupChatAgentResponse,
    GroupChatError,
    GroupChatRequestPublish,
    GroupChatReset,
    GroupChatTeamResponse,
    SerializableException,
)
from autogen_core import (
    CancellationToken,
    DefaultTopicId,
    MessageContext,
    event,
    rpc,
)
from opentelemetry.trace import Tracer
from pydantic import BaseModel

from graphflow_durable import context as _context
from graphflow_durable._runtime.gate import GroupChatInputPending, InputPending
from graphflow_durable._runtime.telemetry import agent_span, record_output
from graphflow_durable._turncalls import CallLink, raise_kept, start_recording, stop_recording
from graphflow_durable.context import ExecutionContext
from graphflow_durable.errors import NodeTimeoutError
from graphflow_durable.retry import RetryPolicy, TimeoutPolicy, is_retryable, within_limits
from graphflow_durable.store import Store

__all__ = ["DurableChatAgentContainer", "GroupChatAttemptFailed", "Turns", "answer_delta", "outer_run_store"]

_outer_store: ContextVar[Store | None] = ContextVar("graphflow_durable_outer_store", default=None)
# What Turns.enter set, for Turns.leave to undo: the execution context, the outer store, the calls.
_Entered = tuple[Token[ExecutionContext | None], Token[Store | None], Token[Any]]


class GroupChatAttemptFailed(BaseModel):
    """From a participant container to the manager: an attempt of ``name``'s turn raised (or timed
    out) under a retry or timeout policy; the exception itself is in :meth:`Turns.take_error`."""

    name: str
    attempt: int
    error_type: str
    error: str
    elapsed: float


class Turns:
    """The execution contexts of a team's turns in flight, and the nodes' retry and timeout
    policies: the manager writes, containers read (and hand a failed attempt's exception back)."""

    def __init__(
        self,
        link: CallLink,
        may_start: Callable[[str], Awaitable[bool]],
        fatal: Callable[[], BaseException | None] = lambda: None,
    ) -> None:
        self._link = link
        self._may_start = may_start
        self.fatal = fatal  # the error the run ends with whatever its turns do (a lost lease...)
        self._contexts: dict[str, ExecutionContext] = {}
        self._errors: dict[str, BaseException] = {}
        self.retry: dict[str, RetryPolicy | None] = {}
        self.timeout: dict[str, TimeoutPolicy | None] = {}
        self.tracer: Tracer | None = None  # of the turns' invoke_agent spans (the team's provider)

    def policies(
        self, retry: Mapping[str, RetryPolicy | None], timeout: Mapping[str, TimeoutPolicy | None]
    ) -> None:
        """Each node's retry and timeout policy (``retry_policies`` / ``timeout_policies``)."""
        self.retry, self.timeout = dict(retry), dict(timeout)

    def failed_with(self, node: str, exc: BaseException) -> None:
        """An attempt of ``node``'s turn raised ``exc`` (kept, so that the run's error chains it)."""
        self._errors[node] = exc

    def take_error(self, node: str) -> BaseException | None:
        """The exception of ``node``'s last failed attempt, forgotten here."""
        return self._errors.pop(node, None)

    async def stored_state(self, run_id: str, node: str) -> Mapping[str, Any] | None:
        """``node``'s agent state as stored at the run's head (read in a thread): while its turn
        is in flight, its state at the step that dispatched the turn (or the run's starting state)."""
        log = await asyncio.to_thread(self._link.store.load, run_id)
        return log.agent_states.get(node)

    def may_start(self, node: str) -> Awaitable[bool]:
        """Whether ``node``'s dispatched turn may start now: the lease is still held (by the
        monotonic clock, else by one renewal); when it is not, the run was halted. (The lease's
        own coroutine, not one wrapping it: one coroutine fewer per turn.)"""
        return self._may_start(node)

    def dispatched(self, context: ExecutionContext) -> None:
        """The manager dispatched ``context.node``'s turn."""
        self._contexts[context.node] = context

    def answered(self, node: str) -> None:
        """``node``'s turn is recorded."""
        self._contexts.pop(node, None)

    def clear(self) -> None:
        """No turn is in flight any more (reset, load_state)."""
        self._contexts.clear()

    def enter(self, node: str) -> _Entered:
        """As ``node``'s agent starts running: its execution context, the run's store for nested
        teams, and the run's link for recorded model and tool calls (each entry is one attempt of
        the turn), until :meth:`leave` is given what this returned. Two calls, not a generator
        context manager: that is three more calls and two objects on every turn."""
        policy = self.retry.get(node)
        return (
            _context._current.set(self._contexts.get(node)),
            _outer_store.set(self._link.store),
            start_recording(self._link, None if policy is None else partial(is_retryable, policy=policy)),
        )

    @staticmethod
    def leave(entered: _Entered) -> None:
        """As the agent's attempt ends (however it ends): undo what :meth:`enter` set."""
        context, store, calls = entered
        stop_recording(calls)
        _outer_store.reset(store)
        _context._current.reset(context)


def outer_run_store() -> Store | None:
    """The store of the durable run whose agent turn is running in this task, if any."""
    return _outer_store.get()


def answer_delta(
    message: GroupChatAgentResponse | GroupChatTeamResponse,
) -> tuple[list[BaseAgentEvent | BaseChatMessage], list[bool]]:
    """A participant's answer as the messages it adds to the thread, in order, and which of them
    its container broadcast to the other participants (an agent: its chat message, the last; a
    nested team: each of its chat messages)."""
    if isinstance(message, GroupChatAgentResponse):
        delta = [*(message.response.inner_messages or []), message.response.chat_message]
        return delta, [i == len(delta) - 1 for i in range(len(delta))]
    delta = list(message.result.messages)
    return delta, [isinstance(m, BaseChatMessage) for m in delta]


class DurableChatAgentContainer(ChatAgentContainer):
    """A participant container that exposes the execution context and honours deferred input.

    ``deferred`` is this container's own: the messages published after its node was dispatched,
    which it hears after the node's turn (docs/state-format.md, "Buffer rule").
    """

    def __init__(
        self,
        parent_topic_type: str,
        output_topic_type: str,
        agent: ChatAgent | Team,
        message_factory: MessageFactory,
        turns: Turns,
    ) -> None:
        super().__init__(parent_topic_type, output_topic_type, agent, message_factory)
        self._turns = turns
        self._deferred: list[BaseChatMessage] = []

    @event
    async def handle_request(self, message: GroupChatRequestPublish, ctx: MessageContext) -> None:  # type: ignore[override]
        """Run the agent's turn with its execution context set; then hear what was deferred.

        Unless the lease is no longer surely held when the turn is about to start (the process was
        frozen since the manager's check): then the run is halted and the agent is not called.
        """
        turns = self._turns
        if not await turns.may_start(self._agent.name):
            return  # the node stays in flight: the run's next driver runs this turn
        entered = turns.enter(self._agent.name)
        try:
            try:
                if isinstance(self._agent, Team):
                    await ChatAgentContainer.handle_request(self, message, ctx)
                elif not await self._attempt(self._agent, ctx):
                    return  # the manager records the failed attempt; the input stays for the next
            except InputPending as pending:  # the turn waits for a person: its input stays as it is
                request = pending.request
                await self.publish_message(
                    GroupChatInputPending(
                        name=self._agent.name, request_id=request.request_id, prompt=request.prompt
                    ),
                    topic_id=DefaultTopicId(type=self._parent_topic_type),
                    cancellation_token=ctx.cancellation_token,
                )
                return
        finally:
            turns.leave(entered)
        self._message_buffer[:0] = self._deferred
        self._deferred = []

    async def _attempt(self, agent: ChatAgent, ctx: MessageContext) -> bool:
        """One attempt of the agent's turn under its node's policies (ChatAgentContainer's turn, with
        the time limits, if any, on its own token): whether it answered. An exception the retry logic takes
        (any under a retry policy, a timeout under a timeout policy) goes to the manager as
        :class:`GroupChatAttemptFailed`; any other takes GraphFlow's path (the run fails)."""
        name = agent.name
        execution = _context.current_execution()
        attempt = execution.attempt if execution is not None else 1
        limits = self._turns.timeout.get(name)
        token = ctx.cancellation_token  # GraphFlow's, unless a time limit may cancel the turn:
        if limits is not None:  # its own then, as cancelling this one stops the sibling turns
            token = CancellationToken()
            ctx.cancellation_token.add_callback(token.cancel)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            # The span GraphFlow's container opens (AutoGen's attributes), with the turn's ids.
            with agent_span(self._turns.tracer, name, agent.description, str(self.id), execution) as span:
                response: Response | None = None
                stream: AsyncIterator[BaseAgentEvent | BaseChatMessage | Response] = agent.on_messages_stream(
                    self._message_buffer, token
                )
                if limits is not None:
                    # Wrapped only under a policy: without one within_limits only passes the items
                    # on, one more async generator resumed per item of every turn.
                    stream = within_limits(
                        stream, limits, node=name, attempt=attempt, cancellation_token=token
                    )
                async for item in stream:
                    if isinstance(item, Response):
                        await self._log_message(item.chat_message)
                        response = item
                    else:
                        await self._log_message(item)
                if response is None:
                    raise RuntimeError(
                        "The agent did not produce a final response. Check the agent's on_messages_stream method."
                    )
                raise_kept()  # a tool call's failure that no later call of the turn raised
                if span is not None:  # the span records: its text only when the user opted in
                    record_output(span, response.chat_message)
        except InputPending:
            raise
        except Exception as exc:
            # The run ends with its fatal error (a lost lease, a database fault), not with a failed
            # attempt; without a policy, or an exception it does not take, as in GraphFlow.
            policies = self._turns.retry.get(name) is not None or isinstance(exc, NodeTimeoutError)
            if not policies or self._turns.fatal() is not None:
                await self.publish_message(
                    GroupChatError(error=SerializableException.from_exception(exc)),
                    topic_id=DefaultTopicId(type=self._parent_topic_type),
                    cancellation_token=ctx.cancellation_token,
                )
                raise  # as GraphFlow's container does
            self._turns.failed_with(name, exc)
            await self.publish_message(
                GroupChatAttemptFailed(
                    name=name,
                    attempt=attempt,
                    error_type=type(exc).__name__,
                    error=str(exc),
                    elapsed=loop.time() - started,
                ),
                topic_id=DefaultTopicId(type=self._parent_topic_type),
                cancellation_token=ctx.cancellation_token,
            )
            return False
        self._message_buffer.clear()
        await self.publish_message(
            GroupChatAgentResponse(response=response, name=name),
            topic_id=DefaultTopicId(type=self._parent_topic_type),
            cancellation_token=ctx.cancellation_token,
        )
        return True

    @event
    async def handle_input_pending(self, message: GroupChatInputPending, ctx: MessageContext) -> None:
        """Another node waits for a person: that is the manager's business."""

    @event
    async def handle_attempt_failed(self, message: GroupChatAttemptFailed, ctx: MessageContext) -> None:
        """Another node's attempt failed: that is the manager's business."""

    @event
    async def handle_group_chat_error(self, message: GroupChatError, ctx: MessageContext) -> None:
        """Another node's turn failed: the manager ends the run with it. (GraphFlow's container has no
        handler for it and logs an ERROR traceback per participant besides the failing one's.)"""

    @rpc
    async def handle_reset(self, message: GroupChatReset, ctx: MessageContext) -> None:  # type: ignore[override]
        """Reset as GraphFlow's container does, deferred input included."""
        self._deferred = []
        await ChatAgentContainer.handle_reset(self, message, ctx)

    async def save_state(self) -> Mapping[str, Any]:
        state = dict(await super().save_state())
        if self._deferred:
            state["deferred_buffer"] = [m.dump() for m in self._deferred]
        return state

    async def load_state(self, state: Mapping[str, Any]) -> None:
        await super().load_state(state)
        self._set_deferred([self._message_factory.create(m) for m in state.get("deferred_buffer", [])])

    async def restore(
        self,
        buffer: Sequence[BaseAgentEvent | BaseChatMessage],
        deferred: Sequence[BaseAgentEvent | BaseChatMessage],
        agent_state: Mapping[str, Any] | None,
    ) -> None:
        """Set the buffers from message objects (shared, not copied) and load the agent's state."""
        self._message_buffer = [m for m in buffer if isinstance(m, BaseChatMessage)]
        self._set_deferred(deferred)
        if agent_state is not None:
            await self._agent.load_state(agent_state)

    def _set_deferred(self, deferred: Sequence[BaseAgentEvent | BaseChatMessage]) -> None:
        self._deferred = [m for m in deferred if isinstance(m, BaseChatMessage)]
