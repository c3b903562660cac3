"""Recorded model and tool calls: a turn that runs again replays the calls it already made.

:func:`recorded` wraps a ``ChatCompletionClient`` or a ``Workbench`` in a wrapper of the same kind
(an AutoGen Component: a team holding it still dumps and loads). Inside a durable turn, each call
the wrapper makes is committed to the run's store as soon as it returns (``store.calls``, fenced by
the driver's lease token), before its result reaches the agent; when the turn runs again (resumed
after a crash, or retried), a call with the same identity and request returns its recorded result
instead of calling out. ``DurableGraphFlow(..., record_calls=True)`` wraps every participant's
client and workbench itself. Outside a durable turn a wrapper calls straight through.

- A call's identity within its turn (``ExecutionContext.idempotency_key``): ``("model", ordinal)``,
  the ordinal counted from 0 on each attempt; ``("tool", call_id)`` (stable once the model result
  that named it is replayed), and, among the attempt's calls with the same call id, name and
  arguments (one id given to several calls), the position in the order they are made. A tool
  called without a ``call_id`` is never recorded.
- A request's fingerprint: the digest of the canonical JSON of the messages, tool schemas, tool
  choice, output schema, extra create args and model name (a model call); of the tool's name and
  arguments, and that position from the second call on (a tool call). A recorded call of equal
  identity and fingerprint is replayed: a ``CreateResult`` with ``cached=True`` and its recorded
  usage, a stream's recorded chunks with the same boundaries and then its result, a tool's
  ``ToolResult`` (errors included); a ``replayed`` row is written for it.
- A model call with a different fingerprint is a divergence: that model record and every later one
  of the turn are discarded (kept for audit), the call goes live, one INFO line says "diverged",
  and no model call is replayed any more in that attempt. Tool records are not discarded: a tool
  call whose id, name and arguments match a record is replayed even after a divergence. A tool
  call that goes live while a record says it acted already under its id (discarded, or with other
  arguments) logs a WARNING naming the tool. A call that raises is not recorded (the next attempt
  makes it again). ``recorded(workbench, rerun={"get_time"})``: those tools always run (recorded
  live).
- A driver that lost its lease records nothing: the write raises ``LeaseLostError`` and the run
  ends with it; a database fault ends the run interrupted (a call made: its record written first
  when the turn runs again in this process). Not replayed: what a tool does that is not itself a recorded call, calls made
  through a client or workbench that is not wrapped, a streaming tool's intermediate events.

The container of a durable team sets the link (:func:`recording`) while a node's agent runs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from contextvars import Token
from typing import Any, Literal, Protocol, overload

from autogen_core import CancellationToken, Component, ComponentModel
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    RequestUsage,
)
from autogen_core.tools import (
    StaticStreamWorkbench,
    TextResultContent,
    Tool,
    ToolResult,
    ToolSchema,
    Workbench,
)
from pydantic import BaseModel
from typing_extensions import Self

from graphflow_durable import context as _context
from graphflow_durable._model import codec
from graphflow_durable._toolerrors import Noting, watch
from graphflow_durable._turncalls import (
    CallLink,
    TurnCalls,
    current_turn,
    digest,
    raise_kept,
    start_recording,
    stop_recording,
)
from graphflow_durable._wrapping import WrappingClient
from graphflow_durable.context import ToolCallContext
from graphflow_durable.errors import (
    NotSerializableError,
    UsageError,
)
from graphflow_durable.store import CallRecord

__all__ = [
    "CallLink",
    "RecordedChatCompletionClient",
    "RecordedStreamWorkbench",
    "RecordedWorkbench",
    "raise_kept",
    "recorded",
    "start_recording",
    "stop_recording",
]  # CallLink and the three functions: the container's, from _turncalls, kept here for callers

logger = logging.getLogger("graphflow_durable.flow")


class _Streaming(Protocol):
    """A streaming workbench (autogen-core's ``StreamWorkbench``, which it does not export)."""

    def call_tool_stream(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> AsyncGenerator[Any, None]: ...


def _streaming(workbench: Workbench) -> _Streaming | None:
    stream = getattr(workbench, "call_tool_stream", None)
    return workbench if callable(stream) else None  # type: ignore[return-value]


def _tool_schema(tool: Tool | ToolSchema) -> Any:
    return tool if isinstance(tool, Mapping) else tool.schema


def _model_name(client: ChatCompletionClient) -> str:
    """The model a client calls: its ``model`` create argument (OpenAI, Azure, Anthropic, Ollama
    clients hold it there), else its model family, else its class name; a wrapper's (one with an
    ``inner`` client: ``rate_limited``) is its wrapped client's."""
    while isinstance(getattr(client, "inner", None), ChatCompletionClient):
        client = client.inner  # type: ignore[attr-defined]
    create_args = getattr(client, "_create_args", None)
    if isinstance(create_args, Mapping) and isinstance(create_args.get("model"), str):
        return str(create_args["model"])
    family = client.model_info.get("family")
    return str(family) if family and family != "unknown" else type(client).__name__


def _result_text(result: CreateResult, chunks: Sequence[str] | None) -> str:
    body: dict[str, Any] = {"result": result.model_dump(mode="json")}
    if chunks is not None:
        body["chunks"] = list(chunks)
    return codec.dumps(body, where="model result")


def _replayed_result(record: CallRecord) -> tuple[CreateResult, list[str]]:
    body = codec.loads(record.result or "{}")
    result = CreateResult.model_validate(body["result"]).model_copy(update={"cached": True})
    return result, list(body.get("chunks", []))


def _recorded_usage(record: CallRecord) -> RequestUsage:
    return RequestUsage(
        prompt_tokens=record.prompt_tokens or 0, completion_tokens=record.completion_tokens or 0
    )


# -- the model client ---------------------------------------------------------------------------


class _ModelCall:
    """One model call through the wrapper: the wrapped client's keyword arguments, its turn
    (``None``: nothing recorded), identity, fingerprint, and the recorded result and chunks it
    replays, if any."""

    def __init__(
        self, arguments: dict[str, Any], turn: TurnCalls | None, name: str, ident: str, fingerprint: str
    ) -> None:
        self.arguments = arguments
        self.turn, self.name, self.ident, self.fingerprint = turn, name, ident, fingerprint
        self.replayed: tuple[CreateResult, list[str]] | None = None

    async def made(self, result: CreateResult, chunks: Sequence[str] | None) -> None:
        """The call was made: commit its record (a stream's with its chunks) before it goes on."""
        if self.turn is not None:
            text = _result_text(result, chunks)
            await self.turn.write(
                "model", self.name, self.ident, self.fingerprint, result=text, usage=result.usage
            )


class RecordedChatCompletionClientConfig(BaseModel):
    """The component config of :class:`RecordedChatCompletionClient`: the wrapped client's."""

    client: ComponentModel


class RecordedChatCompletionClient(WrappingClient, Component[RecordedChatCompletionClientConfig]):
    """A ``ChatCompletionClient`` whose calls inside a durable turn are recorded and replayed (see
    the module's text). Everything else (model info, token counts, usage, close) is the wrapped
    client's. Make one with :func:`recorded`."""

    component_type = "model"
    component_provider_override = "graphflow_durable.recorded.RecordedChatCompletionClient"
    component_config_schema = RecordedChatCompletionClientConfig

    def __init__(self, client: ChatCompletionClient) -> None:
        self._inner = client

    @property
    def inner(self) -> ChatCompletionClient:
        """The wrapped client."""
        return self._inner

    async def _call(
        self,
        messages: Sequence[LLMMessage],
        tools: Sequence[Tool | ToolSchema],
        tool_choice: Tool | Literal["auto", "required", "none"],
        json_output: bool | type[BaseModel] | None,
        extra_create_args: Mapping[str, Any],
        cancellation_token: CancellationToken | None,
    ) -> _ModelCall:
        """The call about to be made: outside a durable turn, one that records nothing; inside, its
        identity (the attempt's next ordinal) and fingerprint, and its recorded result if it replays
        one (its ``replayed`` row then written)."""
        arguments: dict[str, Any] = {
            "tools": tools,
            "tool_choice": tool_choice,
            "json_output": json_output,
            "extra_create_args": extra_create_args,
            "cancellation_token": cancellation_token,
        }
        turn = current_turn()
        if turn is None:
            return _ModelCall(arguments, None, "", "", "")
        turn.check()
        name = _model_name(self._inner)
        ident = str(turn.next_ordinal())
        if isinstance(json_output, type):
            output: Any = {"name": json_output.__name__, "schema": json_output.model_json_schema()}
        else:
            output = json_output
        request = {
            "model": name,
            "messages": list(messages),
            "tools": [_tool_schema(t) for t in tools],
            "tool_choice": tool_choice if isinstance(tool_choice, str) else _tool_schema(tool_choice),
            "json_output": output,
            "extra_create_args": dict(extra_create_args),
        }
        fingerprint = digest(request)
        call = _ModelCall(arguments, turn, name, ident, fingerprint)
        record = await turn.replayable("model", ident, fingerprint)
        if record is not None:
            call.replayed = _replayed_result(record)
            await turn.write("model", name, ident, fingerprint, result=None, usage=_recorded_usage(record))
        return call

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        """The wrapped client's ``create``; inside a durable turn, recorded or replayed."""
        call = await self._call(
            messages, tools, tool_choice, json_output, extra_create_args, cancellation_token
        )
        if call.replayed is not None:
            return call.replayed[0]
        result = await self._inner.create(messages, **call.arguments)
        await call.made(result, None)
        return result

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        cancellation_token: CancellationToken | None = None,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
    ) -> AsyncGenerator[str | CreateResult, None]:
        """The wrapped client's ``create_stream``; inside a durable turn, recorded (its chunks with
        their boundaries) or replayed (the recorded chunks, then the result)."""
        call = await self._call(
            messages, tools, tool_choice, json_output, extra_create_args, cancellation_token
        )
        if call.replayed is not None:
            result, recorded_chunks = call.replayed
            for chunk in recorded_chunks:
                yield chunk
            yield result
            return
        chunks: list[str] = []
        async for item in self._inner.create_stream(messages, **call.arguments):
            if isinstance(item, CreateResult):
                await call.made(item, chunks)
            else:
                chunks.append(item)
            yield item

    async def close(self) -> None:
        await self._inner.close()

    def _to_config(self) -> RecordedChatCompletionClientConfig:
        return RecordedChatCompletionClientConfig(client=self._inner.dump_component())

    @classmethod
    def _from_config(cls, config: RecordedChatCompletionClientConfig) -> Self:
        return cls(ChatCompletionClient.load_component(config.client))


# -- the workbenches ----------------------------------------------------------------------------


class RecordedWorkbenchConfig(BaseModel):
    """The component config of the recorded workbenches: the wrapped workbench's, and the tools
    that always run."""

    workbench: ComponentModel
    rerun: list[str] = []


def _tool_result(record: CallRecord) -> ToolResult:
    return ToolResult.model_validate(codec.loads(record.result or "{}"))


def _calling(
    turn: TurnCalls | None, name: str, call_id: str | None, fingerprint: str
) -> Token[ToolCallContext | None] | None:
    """Make the tool call about to run :func:`~graphflow_durable.context.current_tool_call` (a
    token for ``_context._tool_call.reset``), or ``None`` when it is not recorded."""
    if turn is None or call_id is None:
        return None
    key = f"{turn.key}/{call_id}/{fingerprint}"
    return _context._tool_call.set(ToolCallContext(turn.ctx, name, call_id, key))


def _not_run(name: str, failure: Exception) -> ToolResult:
    text = f"not run: this attempt of the turn failed ({type(failure).__name__})"
    return ToolResult(name=name, result=[TextResultContent(content=text)], is_error=True)


class _ToolCall(Noting):
    """One live tool call of a recorded workbench, its tool's exceptions noted under a retry policy."""

    def __init__(self, turn: TurnCalls | None, name: str, call_id: str | None, fingerprint: str) -> None:
        super().__init__(turn is None or turn.fails_turn is None)
        self.turn, self.name, self.call_id, self.fingerprint = turn, name, call_id, fingerprint

    async def done(self, result: ToolResult) -> None:
        """The tool returned ``result``: commit its record, unless the tool raised an exception the
        retry policy retries (kept: the attempt fails; the next one runs the call again)."""
        turn, call_id = self.turn, self.call_id
        if turn is None or call_id is None:
            return
        fails = turn.fails_turn or (lambda _: False)
        failed = next((e for e in self.errors or () if fails(e)), None)
        if failed is not None:
            turn.keep(failed)
            return
        await turn.kept(self._record(turn, call_id, result))

    async def _record(self, turn: TurnCalls, call_id: str, result: ToolResult) -> None:
        text = codec.dumps(result.model_dump(mode="json"), where="tool result")  # NotSerializableError
        await turn.write("tool", self.name, call_id, self.fingerprint, result=text, usage=None)


class RecordedWorkbench(Workbench, Component[RecordedWorkbenchConfig]):
    """A ``Workbench`` whose tool calls inside a durable turn are recorded and replayed (see the
    module's text), except the tools named in ``rerun``, which always run. Everything else is the
    wrapped workbench's. Make one with :func:`recorded`."""

    component_type = "workbench"
    component_provider_override = "graphflow_durable.recorded.RecordedWorkbench"
    component_config_schema = RecordedWorkbenchConfig

    def __init__(self, workbench: Workbench, rerun: Collection[str] = ()) -> None:
        self._inner = workbench
        self._rerun = frozenset(rerun)
        watch(workbench)

    @property
    def inner(self) -> Workbench:
        """The wrapped workbench."""
        return self._inner

    @property
    def rerun(self) -> frozenset[str]:
        """The tools that always run (recorded live each time)."""
        return self._rerun

    async def _replay(
        self, name: str, arguments: Mapping[str, Any] | None, call_id: str | None
    ) -> tuple[TurnCalls | None, str, ToolResult | None]:
        """The turn that records this call (``None``: it is not recorded), its fingerprint, and the
        recorded result it replays (its ``replayed`` row written), if any."""
        turn = current_turn()
        if turn is None or call_id is None:
            return None, "", None
        try:
            fingerprint = turn.tool_fingerprint(call_id, name, arguments)
        except NotSerializableError as exc:  # as a call without a call_id: made, never recorded
            ctx = turn.ctx
            logger.warning(
                "run %s: %s's tool call %s runs unrecorded: %s", ctx.run_id, ctx.node, call_id, exc
            )
            return None, "", None
        if turn.failure is None and name not in self._rerun:
            record = await turn.kept(turn.replayable_tool(call_id, fingerprint))
            if record is not None:
                await turn.kept(turn.write("tool", name, call_id, fingerprint, result=None, usage=None))
                return turn, fingerprint, _tool_result(record)
            if turn.failure is None:
                turn.acting_again(name, call_id, fingerprint)
        if turn.failure is not None:  # not run: the turn ends at its next call
            return turn, fingerprint, _not_run(name, turn.failure)
        return turn, fingerprint, None

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """The wrapped workbench's ``call_tool``; inside a durable turn, recorded or replayed."""
        turn, fingerprint, replayed = await self._replay(name, arguments, call_id)
        if replayed is not None:
            return replayed
        calling = _calling(turn, name, call_id, fingerprint)
        try:
            with _ToolCall(turn, name, call_id, fingerprint) as call:
                result = await self._inner.call_tool(name, arguments, cancellation_token, call_id)
        finally:
            if calling is not None:
                _context._tool_call.reset(calling)
        await call.done(result)
        return result

    async def list_tools(self) -> list[ToolSchema]:
        return await self._inner.list_tools()

    async def start(self) -> None:
        await self._inner.start()

    async def stop(self) -> None:
        await self._inner.stop()

    async def reset(self) -> None:
        await self._inner.reset()

    async def save_state(self) -> Mapping[str, Any]:
        return await self._inner.save_state()

    async def load_state(self, state: Mapping[str, Any]) -> None:
        await self._inner.load_state(state)

    def _to_config(self) -> RecordedWorkbenchConfig:
        return RecordedWorkbenchConfig(workbench=self._inner.dump_component(), rerun=sorted(self._rerun))

    @classmethod
    def _from_config(cls, config: RecordedWorkbenchConfig) -> Self:
        return cls(Workbench.load_component(config.workbench), config.rerun)


class RecordedStreamWorkbench(RecordedWorkbench, StaticStreamWorkbench):  # type: ignore[misc]  # its own config
    """The recorded wrapper of a streaming workbench (the ``StaticStreamWorkbench`` that
    ``AssistantAgent`` builds from ``tools=[...]``): itself a ``StaticStreamWorkbench``, because
    ``AssistantAgent`` takes its streaming tool path only for that class. A replayed call yields its
    recorded ``ToolResult`` only (a streaming tool's intermediate events are not recorded)."""

    component_provider_override = "graphflow_durable.recorded.RecordedStreamWorkbench"
    component_config_schema = RecordedWorkbenchConfig  # type: ignore[assignment]  # its own, nesting the inner

    def __init__(self, workbench: Workbench, rerun: Collection[str] = ()) -> None:
        stream = _streaming(workbench)
        if stream is None:
            raise UsageError(
                f"RecordedStreamWorkbench wraps a streaming workbench, not {type(workbench).__name__}; "
                "use recorded(workbench)",
                option="workbench",
            )
        RecordedWorkbench.__init__(self, workbench, rerun)
        self._stream_inner = stream
        # StaticWorkbench's own fields: nothing here reads them, but they exist for code that does.
        self._tools = []
        self._tool_overrides = {}
        self._override_name_to_original = {}

    async def call_tool_stream(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> AsyncGenerator[Any | ToolResult, None]:
        """The wrapped workbench's ``call_tool_stream``; inside a durable turn, its result recorded,
        or the recorded result yielded alone."""
        turn, fingerprint, replayed = await self._replay(name, arguments, call_id)
        if replayed is not None:
            yield replayed
            return
        call = _ToolCall(turn, name, call_id, fingerprint)
        stream = self._stream_inner.call_tool_stream(name, arguments, cancellation_token, call_id)
        try:
            while True:
                calling = _calling(turn, name, call_id, fingerprint)  # set only while the tool runs
                try:
                    with call:  # the tool's exceptions are noted while the workbench runs it, not after
                        item = await anext(stream)
                except StopAsyncIteration:
                    return
                finally:
                    if calling is not None:
                        _context._tool_call.reset(calling)
                if isinstance(item, ToolResult):
                    await call.done(item)
                yield item
        finally:
            await stream.aclose()

    @classmethod
    def _from_config(cls, config: RecordedWorkbenchConfig) -> Self:  # type: ignore[override]
        return cls(Workbench.load_component(config.workbench), config.rerun)


# -- recorded() ---------------------------------------------------------------------------------


@overload
def recorded(x: ChatCompletionClient) -> RecordedChatCompletionClient: ...


@overload
def recorded(
    x: StaticStreamWorkbench, *, rerun: Collection[str] | None = None
) -> RecordedStreamWorkbench: ...


@overload
def recorded(x: Workbench, *, rerun: Collection[str] | None = None) -> RecordedWorkbench: ...


def recorded(
    x: ChatCompletionClient | Workbench, *, rerun: Collection[str] | None = None
) -> RecordedChatCompletionClient | RecordedWorkbench:
    """``x``'s calls recorded inside durable turns, replayed when the turn runs again.

    A ``ChatCompletionClient`` gives a :class:`RecordedChatCompletionClient`; a streaming workbench
    (``StaticStreamWorkbench``, what ``AssistantAgent(tools=[...])`` builds) a
    :class:`RecordedStreamWorkbench`, itself a ``StaticStreamWorkbench``; another ``Workbench`` a
    :class:`RecordedWorkbench`. A wrapper is returned as it is (never wrapped twice), unless
    ``rerun`` names other tools. Outside a durable turn the wrapper calls straight through.

    Args:
        x: the model client or workbench.
        rerun: a workbench's tools that always run (e.g. ``{"get_time"}``), recorded live each time.

    Raises:
        UsageError: ``x`` is neither, or ``rerun`` is given for a model client.
    """
    if isinstance(x, ChatCompletionClient):
        if rerun is not None:
            raise UsageError(
                "recorded(): rerun= names tools of a workbench; a model client takes no rerun", option="rerun"
            )
        return x if isinstance(x, RecordedChatCompletionClient) else RecordedChatCompletionClient(x)
    if not isinstance(x, Workbench):
        raise UsageError(
            f"recorded() takes a ChatCompletionClient or a Workbench, not {type(x).__name__}", option="x"
        )
    if isinstance(rerun, str):
        raise UsageError(
            f"recorded(): rerun= is a set of tool names, not the string {rerun!r}", option="rerun"
        )
    if isinstance(x, RecordedWorkbench):
        if rerun is None or frozenset(rerun) == x.rerun:
            return x
        x = x.inner
    if _streaming(x) is not None:
        return RecordedStreamWorkbench(x, rerun or ())
    return RecordedWorkbench(x, rerun or ())
