"""Model-provider rate limits shared by every process: :class:`RateLimit` and :func:`rate_limited`.

``rate_limited(client, RateLimit("openai", requests_per_minute=500), store=...)`` wraps a
``ChatCompletionClient`` in one of the same kind (an AutoGen Component) whose calls take turns from
a budget kept in the store (``store.limits``: one row per key, every process of every host shares
it). ``DurableGraphFlow(..., rate_limits=[...])`` wraps the team's agents' model clients itself.

- Budget: calls of a key start at least ``61 / requests_per_minute`` seconds apart (a minute and
  one second of slack per minute: a call that starts up to a second after its turn still keeps
  any 60 seconds at ``requests_per_minute`` calls or fewer); no burst. Tokens likewise: each call
  takes its tokens' share of a minute (``61 / tokens_per_minute`` s a token) from the key's token
  schedule: an estimate before the call (the messages' characters / 4, plus the completion
  tokens of this wrapper's previous call), corrected by the usage the call reports when it ends.
- A call with budget left costs one statement (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``
  on both backends) and goes at once; with a token limit, one more when its reported tokens
  differ from the estimate. A call whose turn is later waits for it (``asyncio.sleep``; the run's
  lease keeps being renewed meanwhile), then checks the key's pause once; it never fails for the
  limit.
- A provider's 429 that says how long to wait (``Retry-After``, ``retry-after-ms``) pauses the key
  in the store until then: no call of that key starts in any process before. The call that got it
  waits and is made again, up to 3 times; a 429 without a wait, or the fourth in a row (which
  still pauses the key), is raised (the node's retry policy then decides). A stream is made again
  only if it yielded nothing yet.
- The store failing: taking a turn raises its :class:`StoreError` (inside a durable turn, a
  database fault ends the run interrupted, to resume, as a commit's does); a token correction or a
  pause that cannot be written is logged at WARNING (the call's result, or its 429, goes on).
- With :func:`~graphflow_durable.recorded`: wrap ``recorded(rate_limited(client, ...))`` (what
  ``DurableGraphFlow`` does when ``record_calls`` is on too), so that a replayed call never
  reaches the limiter and spends nothing. ``rate_limited(recorded(client), ...)`` spends a turn
  for every call, replays included.
- ``store``: a :class:`~graphflow_durable.Store` or a URL (opened on first use), or ``None``: the
  store of the durable run whose turn makes the call (a call outside one is refused).
- Telemetry: a call that waited adds the event ``graphflow_durable.rate_limit.wait`` (key,
  seconds) to the current span; the metrics ``graphflow_durable.rate_limit.waits`` (count) and
  ``graphflow_durable.rate_limit.wait`` (seconds, histogram), attribute ``key``, on the run's
  meter provider inside a durable turn, else the global one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from autogen_core import CancellationToken, Component, ComponentModel
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    RequestUsage,
)
from autogen_core.tools import Tool, ToolSchema
from opentelemetry import metrics, trace
from pydantic import BaseModel
from typing_extensions import Self

from graphflow_durable._turncalls import current_turn, database_fault
from graphflow_durable._wrapping import WrappingClient
from graphflow_durable.errors import StoreError, UsageError
from graphflow_durable.retry import provider_pause
from graphflow_durable.store import Store

__all__ = ["RateLimit", "RateLimitedChatCompletionClient", "rate_limited"]

logger = logging.getLogger(__name__)

#: A minute, as the schedules count it: 60 s and a second of slack (see the module's text).
_MINUTE = 61.0
#: How many times a call that got a 429 with a wait is made again before the 429 is raised.
_RETRIES_AFTER_429 = 3


def _positive(value: Any, name: str, key: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(f"RateLimit {key!r}: {name} must be a positive number, not {value!r}", option=name)
    return value


@dataclass(frozen=True)
class RateLimit:
    """A model provider's limit, shared by every process calling through a client limited by it:
    at most ``requests_per_minute`` calls and ``tokens_per_minute`` tokens a minute for ``key``
    (a name you choose: one per provider account and model, say). At least one of them.

    Raises:
        UsageError: an empty key, a limit that is not a positive number, or neither limit.
    """

    key: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.strip() or "\x00" in self.key:
            raise UsageError(f"RateLimit key must be a non-empty text, not {self.key!r}", option="key")
        _positive(self.requests_per_minute, "requests_per_minute", self.key)
        _positive(self.tokens_per_minute, "tokens_per_minute", self.key)
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise UsageError(
                f"RateLimit {self.key!r} limits nothing: give requests_per_minute, tokens_per_minute or both",
                option="requests_per_minute",
            )

    @property
    def spacing(self) -> float:
        """The seconds one call's request is worth (0: no request limit)."""
        return 0.0 if self.requests_per_minute is None else _MINUTE / self.requests_per_minute

    def token_seconds(self, tokens: int) -> float:
        """The seconds ``tokens`` are worth (0: no token limit)."""
        return 0.0 if self.tokens_per_minute is None else tokens * _MINUTE / self.tokens_per_minute

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
        }


def rate_limits_of(value: Any) -> tuple[RateLimit, ...]:
    """``value`` (a :class:`RateLimit` or a sequence of them) as a tuple; a :class:`UsageError`
    for anything else, or two limits of one key."""
    limits = (value,) if isinstance(value, RateLimit) else value
    if (
        isinstance(limits, (str, bytes))
        or not isinstance(limits, Sequence)
        or not all(isinstance(x, RateLimit) for x in limits)
    ):
        raise UsageError(
            f"rate_limits must be a RateLimit or a list of them, not {value!r}", option="rate_limits"
        )
    keys = [x.key for x in limits]
    if len(set(keys)) != len(keys):
        raise UsageError(f"rate_limits name a key twice: {keys}; give each key once", option="rate_limits")
    return tuple(limits)


def _estimate(messages: Sequence[LLMMessage]) -> int:
    """A call's prompt tokens, guessed before it is made: its messages' characters / 4."""
    return sum(len(str(getattr(m, "content", ""))) for m in messages) // 4


class _Meter:
    """The wait metrics on the global meter provider (calls outside a durable turn)."""

    instruments: tuple[Any, Any] | None = None

    @classmethod
    def waited(cls, key: str, seconds: float) -> None:
        try:
            if cls.instruments is None:
                meter = metrics.get_meter("graphflow_durable")
                cls.instruments = (
                    meter.create_counter(
                        "graphflow_durable.rate_limit.waits", description="Calls that waited for a rate limit"
                    ),
                    meter.create_histogram(
                        "graphflow_durable.rate_limit.wait",
                        unit="s",
                        description="Time calls waited for a rate limit",
                    ),
                )
            cls.instruments[0].add(1, {"key": key})
            cls.instruments[1].record(seconds, {"key": key})
        except Exception:  # telemetry never changes a call's outcome
            logger.debug("rate-limit wait metric not recorded", exc_info=True)


def _waited(key: str, seconds: float) -> None:
    """A call waited ``seconds`` for ``key``: a span event, the metrics."""
    try:
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("graphflow_durable.rate_limit.wait", {"key": key, "seconds": seconds})
            span.set_attribute("graphflow_durable.rate_limit.waited_s", seconds)
    except Exception:
        logger.debug("rate-limit wait event not recorded", exc_info=True)
    turn = current_turn()
    note = None if turn is None else getattr(turn.link, "rate_limit_waited", None)
    if note is not None:
        note(key, seconds)
    else:
        _Meter.waited(key, seconds)


class RateLimitedChatCompletionClientConfig(BaseModel):
    """The component config of :class:`RateLimitedChatCompletionClient`: the wrapped client's, its
    limits, and the store's URL (``None``: the run's store)."""

    client: ComponentModel
    limits: list[dict[str, Any]]
    store: str | None = None


class RateLimitedChatCompletionClient(WrappingClient, Component[RateLimitedChatCompletionClientConfig]):
    """A ``ChatCompletionClient`` whose calls take turns from rate limits kept in a store (see the
    module's text). Everything else (model info, token counts, usage, close) is the wrapped
    client's. Make one with :func:`rate_limited`."""

    component_type = "model"
    component_provider_override = "graphflow_durable.ratelimit.RateLimitedChatCompletionClient"
    component_config_schema = RateLimitedChatCompletionClientConfig

    def __init__(
        self, client: ChatCompletionClient, limits: Sequence[RateLimit], store: Store | str | None = None
    ) -> None:
        self._inner = client
        self._limits = rate_limits_of(list(limits))
        self._store = store
        self._opened: Store | None = None
        self._tokens = any(x.tokens_per_minute is not None for x in self._limits)
        self._last_completion = 0  # the previous call's completion tokens (the next estimate's)

    @property
    def inner(self) -> ChatCompletionClient:
        """The wrapped client."""
        return self._inner

    @property
    def limits(self) -> tuple[RateLimit, ...]:
        return self._limits

    def _store_now(self) -> Store:
        if isinstance(self._store, Store):
            return self._store
        if isinstance(self._store, str):
            if self._opened is None:
                self._opened = Store(self._store)
            return self._opened
        turn = current_turn()
        if turn is None:
            keys = ", ".join(x.key for x in self._limits)
            raise UsageError(
                f"a call rate-limited by {keys} was made outside a durable run and the wrapper has no "
                "store: pass store= to rate_limited()",
                option="store",
            )
        return turn.link.store

    async def _take(self, store: Store, tokens: int) -> None:
        """Wait for this call's turn of every limit (one statement each when it is now)."""
        for limit in self._limits:
            waited = 0.0
            while True:
                try:
                    start = await asyncio.to_thread(
                        store.limits.reserve,
                        limit.key,
                        spacing=limit.spacing,
                        tokens=tokens if limit.tokens_per_minute is not None else 0,
                        token_seconds=limit.token_seconds(tokens),
                        requests_per_minute=limit.requests_per_minute,
                        tokens_per_minute=limit.tokens_per_minute,
                    )
                except StoreError as exc:
                    # The database failing ends a durable run interrupted (resumed later), as a
                    # commit's fault does, not failed by whatever the agent makes of the error.
                    turn = current_turn()
                    if turn is not None and database_fault(exc):
                        turn.link.fail(exc)
                    raise
                wait = start - time.time()
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
                waited += wait
                # A pause set while this call waited (another process's 429): its turn is void.
                if await asyncio.to_thread(store.limits.paused_until, limit.key) <= time.time():
                    break
            if waited > 0:
                _waited(limit.key, waited)

    async def _settle(self, store: Store, estimate: int, usage: RequestUsage) -> None:
        """Correct the token schedules by the call's reported tokens."""
        self._last_completion = usage.completion_tokens
        delta = usage.prompt_tokens + usage.completion_tokens - estimate
        if not self._tokens or delta == 0:
            return
        for limit in self._limits:
            if limit.tokens_per_minute is None:
                continue
            try:
                await asyncio.to_thread(
                    store.limits.correct, limit.key, tokens=delta, token_seconds=limit.token_seconds(delta)
                )
            except StoreError as exc:  # the call was made: its result goes on, the budget is off
                logger.warning("rate limit %s: tokens not corrected by %d: %s", limit.key, delta, exc)

    async def _paused(self, store: Store, exc: Exception, attempt: int) -> bool:
        """Whether the call that raised ``exc`` is made again: a 429 with a wait pauses every key."""
        seconds = provider_pause(exc)
        if seconds is None:
            return False
        until = time.time() + seconds
        try:
            for limit in self._limits:  # every process waits, whether or not this call goes again
                await asyncio.to_thread(store.limits.pause, limit.key, until)
        except StoreError as pausing:  # the 429 is raised: the node's retry policy decides
            logger.warning("rate limits not paused after a 429: %s", pausing)
            return False
        again = attempt < _RETRIES_AFTER_429
        logger.info(
            "rate limits %s paused for %.3f s by the provider (%s); the call %s",
            ", ".join(x.key for x in self._limits),
            seconds,
            type(exc).__name__,
            "is made again after" if again else f"got {attempt + 1} in a row and is raised",
        )
        return again

    def _guess(self, messages: Sequence[LLMMessage]) -> int:
        return _estimate(messages) + self._last_completion if self._tokens else 0

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
        """The wrapped client's ``create``, once its turn of every limit has come."""
        store = self._store_now()
        estimate = self._guess(messages)
        attempt = 0
        while True:
            await self._take(store, estimate)
            try:
                result = await self._inner.create(
                    messages,
                    tools=tools,
                    tool_choice=tool_choice,
                    json_output=json_output,
                    extra_create_args=extra_create_args,
                    cancellation_token=cancellation_token,
                )
            except Exception as exc:
                if not await self._paused(store, exc, attempt):
                    raise
                attempt += 1
                continue
            await self._settle(store, estimate, result.usage)
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
        """The wrapped client's ``create_stream``, once its turn of every limit has come."""
        store = self._store_now()
        estimate = self._guess(messages)
        attempt = 0
        while True:
            await self._take(store, estimate)
            yielded = False
            try:
                async for item in self._inner.create_stream(
                    messages,
                    cancellation_token=cancellation_token,
                    tools=tools,
                    tool_choice=tool_choice,
                    json_output=json_output,
                    extra_create_args=extra_create_args,
                ):
                    if isinstance(item, CreateResult):
                        await self._settle(store, estimate, item.usage)
                    yielded = True
                    yield item
                return
            except Exception as exc:
                if yielded or not await self._paused(store, exc, attempt):
                    raise
                attempt += 1

    async def close(self) -> None:
        await self._inner.close()
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def _to_config(self) -> RateLimitedChatCompletionClientConfig:
        store = self._store if isinstance(self._store, str) else None  # a Store object: the run's on load
        return RateLimitedChatCompletionClientConfig(
            client=self._inner.dump_component(), limits=[x.to_json() for x in self._limits], store=store
        )

    @classmethod
    def _from_config(cls, config: RateLimitedChatCompletionClientConfig) -> Self:
        limits = [RateLimit(**x) for x in config.limits]
        return cls(ChatCompletionClient.load_component(config.client), limits, config.store)


def rate_limited(
    client: ChatCompletionClient,
    limit: RateLimit | Sequence[RateLimit],
    *,
    store: Store | str | None = None,
) -> RateLimitedChatCompletionClient:
    """``client``, its calls limited by ``limit`` (one :class:`RateLimit` or several: a call takes a
    turn of each) in ``store`` (see the module's text; ``None``: the durable run's store).

    Raises:
        UsageError: ``limit`` is not a RateLimit or a list of them, or names a key twice;
            ``client`` is not a ChatCompletionClient.
    """
    if not isinstance(client, ChatCompletionClient):
        raise UsageError(
            f"rate_limited() takes a ChatCompletionClient, not {type(client).__name__}", option="client"
        )
    return RateLimitedChatCompletionClient(client, rate_limits_of(limit), store)
