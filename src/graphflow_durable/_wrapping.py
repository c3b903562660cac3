"""What a model client that wraps another answers as the wrapped one: the base of
:class:`~graphflow_durable.recorded.RecordedChatCompletionClient` and
:class:`~graphflow_durable.ratelimit.RateLimitedChatCompletionClient`, which differ only in how a
call is made (``create``, ``create_stream``, ``close`` and their component config)."""

from __future__ import annotations

from collections.abc import Sequence

from autogen_core.models import ChatCompletionClient, LLMMessage, ModelCapabilities, ModelInfo, RequestUsage
from autogen_core.tools import Tool, ToolSchema

__all__ = ["WrappingClient"]


class WrappingClient(ChatCompletionClient):
    """A model client around ``_inner`` whose model, usage and token counts are the wrapped one's:
    a replayed or a delayed call answers as the wrapped model would."""

    _inner: ChatCompletionClient

    @property
    def model_info(self) -> ModelInfo:
        return self._inner.model_info

    def actual_usage(self) -> RequestUsage:
        return self._inner.actual_usage()

    @property
    def capabilities(self) -> ModelCapabilities:
        """The wrapped client's (deprecated by AutoGen for :attr:`model_info`)."""
        return self._inner.capabilities

    def total_usage(self) -> RequestUsage:
        return self._inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return self._inner.count_tokens(messages, tools=tools)

    def remaining_tokens(
        self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []
    ) -> int:
        return self._inner.remaining_tokens(messages, tools=tools)
