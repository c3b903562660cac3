"""A scripted, deterministic model client and side-effect tools: examples and tests, no API key.

``ScriptedModel`` stands in for a real ``ChatCompletionClient`` in an ``AssistantAgent`` turn. Its
answer is a function of the request only (never of how often it was called), so an agent resumed in
a new process, or retried, is answered exactly as the first time:

- the position in the turn is the number of tool results after the conversation's last user
  message; the script's entry at that position is the answer: a tool to call (``(name, args)``),
  or the final text, which quotes the tool results it was shown;
- usage is counted from the request's and the answer's lengths;
- a stream yields the answer in word chunks, then the ``CreateResult``.

Every live call appends ``"<pid> model <agent> <position>"`` to the ``log`` file, if given: a
replayed (recorded) call never reaches the client, so the log counts what the model was paid for.
``ledger_tools`` makes tools whose side effect appends ``"<pid> <tool> <args>"`` to a ledger file.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from autogen_core import CancellationToken, Component, FunctionCall
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelCapabilities,
    ModelFamily,
    ModelInfo,
    RequestUsage,
    UserMessage,
)
from autogen_core.tools import FunctionTool, Tool, ToolSchema
from pydantic import BaseModel

__all__ = ["CLERK_SCRIPT", "ScriptedModel", "ScriptedModelConfig", "append_line", "ledger_tools"]

#: One step of a script: a tool call ``(tool name, arguments)`` or the final text.
Step = tuple[str, dict[str, Any]] | str


class ScriptedModelConfig(BaseModel):
    agent: str
    script: list[Any]
    log: str | None = None


def append_line(path: str | Path | None, *fields: object) -> None:
    """Append ``"<pid> <fields...>"`` to ``path`` durably: the line survives a SIGKILL after it."""
    if path is None:
        return
    with open(path, "a") as f:
        f.write(" ".join(map(str, (os.getpid(), *fields))) + "\n")
        f.flush()
        os.fsync(f.fileno())


class ScriptedModel(ChatCompletionClient, Component[ScriptedModelConfig]):
    """Answers an ``AssistantAgent``'s calls from ``script``, by the request (see the module doc)."""

    component_type = "model"
    component_config_schema = ScriptedModelConfig

    def __init__(self, agent: str, script: Sequence[Step], *, log: str | Path | None = None) -> None:
        self.agent = agent
        self.script = [s if isinstance(s, str) else (s[0], dict(s[1])) for s in script]
        self.log = None if log is None else str(log)
        self.live_calls = 0
        self._create_args = {"model": "scripted-model"}  # where real clients keep their model's name
        self._usage = RequestUsage(prompt_tokens=0, completion_tokens=0)

    # -- the answer --------------------------------------------------------------------------------

    def answer(self, messages: Sequence[LLMMessage]) -> CreateResult:
        """The answer to ``messages``: a function of the request only."""
        results = self.tool_results(messages)
        position = min(len(results), len(self.script) - 1)
        step = self.script[position]
        prompt = sum(len(str(m.content)) for m in messages) // 4 + 1
        if isinstance(step, str):
            text = f"{step} ({'; '.join(results)})" if results else step
            usage = RequestUsage(prompt_tokens=prompt, completion_tokens=len(text) // 4 + 1)
            return CreateResult(finish_reason="stop", content=text, usage=usage, cached=False)
        name, arguments = step
        call = FunctionCall(id=f"{self.agent}-{position}-{name}", name=name, arguments=json.dumps(arguments))
        usage = RequestUsage(prompt_tokens=prompt, completion_tokens=len(call.arguments) // 4 + 1)
        return CreateResult(finish_reason="function_calls", content=[call], usage=usage, cached=False)

    @staticmethod
    def tool_results(messages: Sequence[LLMMessage]) -> list[str]:
        """The tool results after the last user message: where the turn stands."""
        results: list[str] = []
        for message in messages:
            if isinstance(message, UserMessage):
                results = []
            elif isinstance(message, FunctionExecutionResultMessage):
                results += [r.content for r in message.content]
        return results

    def _live(self, messages: Sequence[LLMMessage]) -> CreateResult:
        self.live_calls += 1
        result = self.answer(messages)
        append_line(self.log, "model", self.agent, len(self.tool_results(messages)))
        self._usage = RequestUsage(
            prompt_tokens=self._usage.prompt_tokens + result.usage.prompt_tokens,
            completion_tokens=self._usage.completion_tokens + result.usage.completion_tokens,
        )
        return result

    # -- ChatCompletionClient ------------------------------------------------------------------------

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
        await asyncio.sleep(0)
        return self._live(messages)

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> AsyncGenerator[str | CreateResult, None]:
        result = self._live(messages)
        said = result.content if isinstance(result.content, str) else f"calling {result.content[0].name}"
        for i, word in enumerate(said.split(" ")):
            await asyncio.sleep(0)
            yield word if i == 0 else f" {word}"
        yield result

    async def close(self) -> None:
        pass

    def actual_usage(self) -> RequestUsage:
        return self._usage

    def total_usage(self) -> RequestUsage:
        return self._usage

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return sum(len(str(m.content)) for m in messages) // 4 + 1

    def remaining_tokens(
        self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []
    ) -> int:
        return 100_000 - self.count_tokens(messages)

    @property
    def capabilities(self) -> ModelCapabilities:  # type: ignore[override]
        return ModelCapabilities(vision=False, function_calling=True, json_output=False)  # type: ignore[typeddict-item]

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            vision=False,
            function_calling=True,
            json_output=False,
            family=ModelFamily.UNKNOWN,
            structured_output=False,
        )

    def _to_config(self) -> ScriptedModelConfig:
        return ScriptedModelConfig(agent=self.agent, script=self.script, log=self.log)

    @classmethod
    def _from_config(cls, config: ScriptedModelConfig) -> ScriptedModel:
        return cls(config.agent, config.script, log=config.log)


#: What a tool may await after its side effect is on the ledger (a test's kill, a slow bank...).
During = Callable[[str], Awaitable[None]]


def ledger_tools(
    ledger: str | Path | None, *, before: During | None = None, during: During | None = None
) -> list[FunctionTool]:
    """``lookup_order`` and ``issue_refund``: each appends ``"<pid> <tool> <args>"`` to ``ledger``
    (its side effect). ``before(name)`` is awaited before the side effect, ``during(name)`` after
    it, before the tool returns."""

    async def act(name: str, *args: object) -> None:
        if before is not None:
            await before(name)
        append_line(ledger, name, *args)
        if during is not None:
            await during(name)

    async def lookup_order(order_id: str) -> str:
        """Look an order up."""
        await act("lookup_order", order_id)
        return f"order {order_id}: 2 items, paid 40.00"

    async def issue_refund(order_id: str, amount: float) -> str:
        """Refund an order (a side effect that must happen once)."""
        await act("issue_refund", order_id, amount)
        return f"refunded {amount:.2f} on {order_id}"

    return [
        FunctionTool(lookup_order, description="Look an order up."),
        FunctionTool(issue_refund, description="Refund an order."),
    ]


#: The clerk's script: look the order up, refund it, then say so (three model calls, two tools).
CLERK_SCRIPT: list[Step] = [
    ("lookup_order", {"order_id": "A17"}),
    ("issue_refund", {"order_id": "A17", "amount": 40.0}),
    "Refund done",
]
