"""Per-node retry and timeout policies: the values, which errors are worth a retry, how long to
wait before the next attempt, and the guard that enforces a turn's time limits.

Building blocks: the runtime wires them into a node's turn. Nothing here does I/O or touches the
store; the clock and the random source are parameters, so every rule is testable on its own.

- :class:`RetryPolicy` and :class:`TimeoutPolicy`: frozen values, JSON both ways.
- :func:`retry_policies`, :func:`timeout_policies` and :func:`policies_config`: ``retry=`` /
  ``timeout=`` per node, in the shape ``human_input=`` has (a value, or a mapping
  ``{node: value, "*": default}``; the one parser is ``_model.human.node_settings``).
- :func:`is_retryable`: the classifier. :func:`delay`: the back-off (and a provider's
  ``Retry-After``, :func:`retry_after`). :func:`within_limits`: the timeout guard around an agent's
  ``on_messages_stream``. :class:`NodeRetryEvent`: what ``run_stream`` shows for a retry.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import math
import random
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

from autogen_agentchat.messages import BaseAgentEvent, MessageFactory
from autogen_core import CancellationToken

from graphflow_durable._model.human import node_settings
from graphflow_durable.errors import GraphflowDurableError, NodeTimeoutError, UsageError

__all__ = [
    "NodeRetryEvent",
    "RetryPolicy",
    "TimeoutPolicy",
    "delay",
    "is_retryable",
    "policies_config",
    "register_events",
    "provider_pause",
    "retry_after",
    "retry_policies",
    "timeout_policies",
    "within_limits",
]

I = TypeVar("I")  # noqa: E741 -- the item type of a stream


# -- the policies ---------------------------------------------------------------------------------


def _seconds(value: Any, name: str, owner: str, *, zero: bool = False) -> float:
    """A finite number of seconds above 0 (or at least 0), else a UsageError naming the field."""
    option = "retry" if owner == "RetryPolicy" else "timeout"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        ok = False
    else:
        ok = value >= 0 if zero else value > 0
    if not ok:
        bound = "of at least 0" if zero else "above 0"
        raise UsageError(f"{owner} {name} must be a number of seconds {bound}, not {value!r}", option=option)
    return float(value)


def _dotted(value: Any, name: str) -> str:
    """An exception class or a dotted name, as the dotted name (builtins without ``builtins.``)."""
    if isinstance(value, type) and issubclass(value, BaseException):
        return (
            value.__qualname__
            if value.__module__ == "builtins"
            else f"{value.__module__}.{value.__qualname__}"
        )
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_<][\w<>]*(\.[A-Za-z_<][\w<>]*)*", value):
        return value.removeprefix("builtins.")
    raise UsageError(
        f"RetryPolicy {name} takes exception classes or dotted names ('openai.RateLimitError'), not {value!r}",
        option="retry",
    )


def _names(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, (str, type)):
        value = (value,)
    if not isinstance(value, Iterable):
        raise UsageError(
            f"RetryPolicy {name} must be a list of exception classes or dotted names, not {value!r}",
            option="retry",
        )
    return tuple(dict.fromkeys(_dotted(v, name) for v in value))


def _json_fields(cls: type, data: Any, option: str) -> Mapping[str, Any]:
    """A policy's JSON object, checked: an object whose keys are fields of ``cls``."""
    if not isinstance(data, Mapping):
        raise UsageError(f"a {cls.__name__} in JSON is an object, not {data!r}", option=option)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(
            f"{cls.__name__} has no field {', '.join(map(repr, unknown))} (fields: {', '.join(sorted(known))})",
            option=option,
        )
    return data


@dataclass(frozen=True)
class RetryPolicy:
    """How often a node's turn is attempted when it raises, and how long to wait in between.

    Args:
        max_attempts: attempts in all, the first included (``1``: never retried).
        initial_interval: seconds before the second attempt.
        backoff_coefficient: each further wait is this many times the previous one.
        max_interval: the longest wait, in seconds.
        jitter: spread the waits (equal jitter: between half and all of the computed wait).
        retry_on: exception classes or dotted names retried beyond the default classifier's.
        non_retryable: exception classes or dotted names never retried (they win over ``retry_on``).
            A name without a module (``"RateLimitError"``) matches a class of that name in any
            module. Both are stored as dotted names, so the policy is JSON.

    Raises:
        UsageError: a field out of range, naming the field and what it takes.
    """

    max_attempts: int
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 60.0
    jitter: bool = True
    retry_on: tuple[str, ...] = ()
    non_retryable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise UsageError(
                "RetryPolicy max_attempts must be a whole number of at least 1 (the first attempt "
                f"included; 1 never retries), not {self.max_attempts!r}",
                option="retry",
            )
        values = {
            "initial_interval": _seconds(self.initial_interval, "initial_interval", "RetryPolicy", zero=True),
            "max_interval": _seconds(self.max_interval, "max_interval", "RetryPolicy", zero=True),
            "retry_on": _names(self.retry_on, "retry_on"),
            "non_retryable": _names(self.non_retryable, "non_retryable"),
        }
        coefficient = self.backoff_coefficient
        if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or not coefficient >= 1:
            raise UsageError(
                f"RetryPolicy backoff_coefficient must be a number of at least 1 (1: a constant wait), "
                f"not {coefficient!r}",
                option="retry",
            )
        if not math.isfinite(coefficient):
            raise UsageError(
                f"RetryPolicy backoff_coefficient must be finite, not {coefficient!r}", option="retry"
            )
        if not isinstance(self.jitter, bool):
            raise UsageError(f"RetryPolicy jitter must be True or False, not {self.jitter!r}", option="retry")
        values["backoff_coefficient"] = float(coefficient)
        for name, value in values.items():
            object.__setattr__(self, name, value)  # normalised once; the value stays frozen

    def to_json(self) -> dict[str, Any]:
        """The policy as a JSON object (every field; names as lists)."""
        return {**asdict(self), "retry_on": list(self.retry_on), "non_retryable": list(self.non_retryable)}

    @classmethod
    def from_json(cls, data: Any) -> RetryPolicy:
        """The policy :meth:`to_json` wrote (missing fields take their defaults).

        Raises:
            UsageError: not an object, an unknown field, or a bad value.
        """
        return cls(**_json_fields(cls, data, "retry"))


@dataclass(frozen=True)
class TimeoutPolicy:
    """How long a node's turn may take.

    Args:
        run_timeout: seconds the whole turn may take (``None``: no limit).
        idle_timeout: seconds the agent may go without yielding an event from
            ``on_messages_stream`` (a streamed chunk, a tool call...; ``None``: no limit).
            On expiry the turn is cancelled and :class:`~graphflow_durable.NodeTimeoutError` raised.

    Raises:
        UsageError: a limit that is not a positive number of seconds.
    """

    run_timeout: float | None = None
    idle_timeout: float | None = None

    def __post_init__(self) -> None:
        for name in ("run_timeout", "idle_timeout"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _seconds(value, name, "TimeoutPolicy"))

    def to_json(self) -> dict[str, Any]:
        """The policy as a JSON object."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> TimeoutPolicy:
        """The policy :meth:`to_json` wrote.

        Raises:
            UsageError: not an object, an unknown field, or a bad value.
        """
        return cls(**_json_fields(cls, data, "timeout"))


# -- per-node settings ----------------------------------------------------------------------------


def retry_policies(value: Any, nodes: Iterable[str]) -> dict[str, RetryPolicy | None]:
    """Each node's retry policy (``None``: none) from a ``retry=`` argument or its JSON form.

    A :class:`RetryPolicy`, an ``int`` (``RetryPolicy(max_attempts=int)``), ``None``, or a mapping
    ``{node: one of those, "*": default}``.

    Raises:
        UsageError: a bad value or an unknown node, in one line.
    """
    return _per_node(value, nodes, RetryPolicy, "max_attempts", "a RetryPolicy, a number of attempts or None")


def timeout_policies(value: Any, nodes: Iterable[str]) -> dict[str, TimeoutPolicy | None]:
    """Each node's timeout policy (``None``: none) from a ``timeout=`` argument or its JSON form.

    A :class:`TimeoutPolicy`, seconds (``TimeoutPolicy(run_timeout=seconds)``), ``None``, or a
    mapping ``{node: one of those, "*": default}``.

    Raises:
        UsageError: a bad value or an unknown node, in one line.
    """
    return _per_node(
        value, nodes, TimeoutPolicy, "run_timeout", "a TimeoutPolicy, seconds (the run_timeout) or None"
    )


P = TypeVar("P", RetryPolicy, TimeoutPolicy)


def _per_node(
    value: Any, nodes: Iterable[str], cls: type[P], shorthand: str, takes: str
) -> dict[str, P | None]:
    """Each node's policy: ``cls``, its JSON object, a number for its ``shorthand`` field, or None."""
    option = "retry" if cls is RetryPolicy else "timeout"
    numbers = int if cls is RetryPolicy else (int, float)

    def parse(one: Any, where: str) -> P | None:
        if one is None or isinstance(one, cls):
            return one
        if isinstance(one, numbers) and not isinstance(one, bool):
            return cls.from_json({shorthand: one})
        if isinstance(one, Mapping):
            return cls.from_json(one)
        raise UsageError(f"{option}{where} must be {takes}, not {type(one).__name__}", option=option)

    names = list(nodes)
    known = [f.name for f in fields(cls)]
    default, per_node = node_settings(value, names, option=option, parse=parse, fields=known, fallback=None)
    return {name: per_node.get(name, default) for name in names}


def policies_config(policies: Mapping[str, RetryPolicy | TimeoutPolicy | None]) -> Any:
    """The JSON form (for the component config) of :func:`retry_policies`' or
    :func:`timeout_policies`' result, which they read back to the same mapping: ``None`` when no
    node has a policy, one policy's object when every node has the same, else every node's."""
    values = list(policies.values())
    if len(set(values)) <= 1:
        return None if not values or values[0] is None else values[0].to_json()
    return {name: None if p is None else p.to_json() for name, p in policies.items()}


# -- the classifier -------------------------------------------------------------------------------

#: Class names (anywhere in an exception's class hierarchy) of transient failures: model SDKs'
#: rate-limit / overload / 5xx / connection errors (openai, anthropic, mistral, google, aiohttp...),
#: found by name so that no SDK is a dependency.
# fmt: off
_TRANSIENT_NAMES = frozenset({
    "RateLimitError", "APIConnectionError", "APITimeoutError", "InternalServerError",
    "ServiceUnavailableError", "ServiceUnavailable", "OverloadedError", "ServerError",
    "TooManyRequests", "ResourceExhausted", "DeadlineExceeded", "ClientConnectionError",
    "ServerDisconnectedError", "ConnectionError", "TimeoutError",
    "gaierror",  # name resolution failed: DNS often comes back
})
#: Class names of failures a retry repeats: the SDKs' 4xx errors and refusals, and what a retry
#: cannot change (pydantic's ValidationError is a ValueError).
_PERMANENT_NAMES = frozenset({
    "AuthenticationError", "PermissionDeniedError", "BadRequestError", "NotFoundError",
    "UnprocessableEntityError", "ContentFilterFinishReasonError", "LengthFinishReasonError",
    "ValueError", "TypeError", "pydantic_core._pydantic_core.ValidationError",
})
#: OSError numbers of a network that failed on the way (not a file that is missing).
_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "ETIMEDOUT", "EHOSTUNREACH",
                 "EHOSTDOWN", "ENETUNREACH", "ENETDOWN", "ENETRESET", "EPIPE")
    if hasattr(errno, name)
)
#: httpx's (and httpcore's) transport errors; the subclasses by name too, for an error known only
#: by its text (a GraphFlow RuntimeError names the raised class alone).
_HTTPX_TRANSPORT = frozenset(f"{package}.{name}" for package in ("httpx", "httpcore") for name in (
    "TransportError", "TimeoutException", "ConnectTimeout", "ReadTimeout", "WriteTimeout",
    "PoolTimeout", "NetworkError", "ConnectError", "ReadError", "WriteError", "RemoteProtocolError",
))
# fmt: on
#: How GraphFlow reports an agent's exception to its caller: ``RuntimeError(str(error))`` where the
#: error is AutoGen's ``SerializableException`` (type name, message, formatted traceback).
_GRAPHFLOW_ERROR = re.compile(
    r"(?P<type>[A-Za-z_]\w*): (?P<message>.*?)\nTraceback:\n(?P<traceback>.*)", re.S
)
#: A line of a formatted traceback that names an exception (``openai.RateLimitError: Error code: 429``).
_TRACEBACK_HEAD = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$", re.M)
_STATUS_IN_TEXT = re.compile(r"\b(?:Error code|status(?: code)?):? (?P<status>[1-5]\d\d)\b", re.I)


@dataclass(frozen=True)
class _Described:
    """An exception known only by its text (GraphFlow passed it on as a RuntimeError's message)."""

    names: tuple[str, ...]  # dotted and short names, its classes' when they are builtins
    message: str


def _class_names(cls: type) -> Iterator[str]:
    for klass in cls.__mro__:
        yield klass.__qualname__
        yield f"{klass.__module__}.{klass.__qualname__}"


def _described(exc: BaseException) -> list[_Described]:
    """The exceptions a GraphFlow ``RuntimeError`` describes, outermost first; [] for any other."""
    if type(exc) is not RuntimeError or not exc.args or not isinstance(exc.args[0], str):
        return []
    match = _GRAPHFLOW_ERROR.fullmatch(exc.args[0])
    if match is None:
        return []
    heads = [(m["name"], m["message"] or "") for m in _TRACEBACK_HEAD.finditer(match["traceback"])]
    # format_exception prints a chain innermost first and names the raised class last, dotted.
    described = []
    for name, message in reversed(heads or [(match["type"], match["message"])]):
        short = name.rsplit(".", 1)[-1]
        known = getattr(builtins, short, None) if "." not in name else None
        if isinstance(known, type) and issubclass(known, BaseException):
            names = tuple(_class_names(known))
        else:
            names = (short, name)
        described.append(_Described(names=names, message=message))
    return described


def _chain(exc: BaseException) -> list[BaseException | _Described]:
    """The exception, then what caused it (``__cause__``, else an unsuppressed ``__context__``),
    each GraphFlow ``RuntimeError`` followed by the exceptions its text describes; no cycles."""
    chain: list[BaseException | _Described] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        chain.append(current)
        chain.extend(_described(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def _names_of(item: BaseException | _Described) -> set[str]:
    return set(item.names) if isinstance(item, _Described) else set(_class_names(type(item)))


def _status(item: BaseException | _Described) -> int | None:
    """The HTTP status an exception carries (``status_code``, ``status``, ``response.status_code``),
    or states in its text (``Error code: 429``, as the OpenAI and Anthropic SDKs write)."""
    if isinstance(item, _Described):
        found = _STATUS_IN_TEXT.search(item.message)
        return int(found["status"]) if found else None
    for holder in (item, getattr(item, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def _verdict(item: BaseException | _Described) -> bool | None:
    """True: transient; False: a retry repeats it; None: this exception does not say (look at its cause)."""
    names = _names_of(item)
    if not isinstance(item, _Described):
        if not isinstance(item, Exception):
            return False  # a cancellation, Ctrl+C, SystemExit: an interruption, never an attempt
        if isinstance(item, NodeTimeoutError):
            return True
        if isinstance(item, GraphflowDurableError):
            return False
    status = _status(item)
    if status is not None:
        return status == 429 or status >= 500
    if names & _PERMANENT_NAMES:
        return False
    if names & _HTTPX_TRANSPORT:
        return True
    if names & _TRANSIENT_NAMES:
        return True
    if isinstance(item, OSError) and item.errno in _NETWORK_ERRNOS:
        return True
    return None


def _matches(names: set[str], patterns: tuple[str, ...]) -> bool:
    return any(p in names for p in patterns)


def is_retryable(exc: BaseException, policy: RetryPolicy | None = None) -> bool:
    """Whether a failed attempt is worth another one.

    The policy's ``non_retryable`` then ``retry_on`` names decide first, matched against every
    exception of the chain (the exception, its ``__cause__`` / ``__context__``...). Otherwise the
    first exception of the chain with a verdict decides: a :class:`NodeTimeoutError`, a
    ``TimeoutError``, ``ConnectionError`` or network ``OSError``, an httpx transport error, an HTTP
    status 429 or 5xx, an SDK's rate-limit / overload / connection error (by class name) are
    retried; ``ValueError``, ``TypeError``, pydantic validation errors, other 4xx statuses, an SDK's
    authentication / bad-request errors and this package's own errors are not. An exception with
    no verdict (a plain ``RuntimeError`` wrapping nothing known) is not retried.

    GraphFlow hands an agent's exception to its caller as ``RuntimeError("Type: message\\nTraceback:
    ...")`` without chaining it: such an error is judged by the classes its text names.
    """
    chain = _chain(exc)
    if policy is not None:
        names = set().union(*(_names_of(item) for item in chain))
        if _matches(names, policy.non_retryable):
            return False
        if _matches(names, policy.retry_on):
            return True
    for item in chain:
        verdict = _verdict(item)
        if verdict is not None:
            return verdict
    return False


# -- the back-off ---------------------------------------------------------------------------------


def _header(headers: Any, name: str) -> Any:
    """A header from httpx / requests / aiohttp headers (case-insensitive) or a plain dict."""
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter(name)
    if value is None and isinstance(headers, Mapping):
        value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == name), None)
    return value


def _after(value: Any, now: float) -> float | None:
    """Seconds from a Retry-After value: a number of seconds or an HTTP date."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return max(0.0, float(value)) if math.isfinite(value) else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def retry_after(exc: BaseException, *, now: float | None = None) -> float | None:
    """The wait a provider asked for, in seconds, from an exception of the chain: a ``retry_after``
    attribute, or its ``response.headers``' (else its own ``headers``') ``retry-after-ms`` /
    ``retry-after`` (seconds or an HTTP date, against ``now``, epoch seconds, default the clock);
    ``None`` when none says."""
    clock = time.time() if now is None else now
    for item in _chain(exc):
        if isinstance(item, _Described):
            continue
        found = _after(getattr(item, "retry_after", None), clock)
        if found is not None:
            return found
        headers = getattr(getattr(item, "response", None), "headers", None)
        if headers is None:
            headers = getattr(item, "headers", None)  # aiohttp's ClientResponseError holds them itself
        if headers is None:
            continue
        millis = _after(_header(headers, "retry-after-ms"), clock)
        if millis is not None:
            return millis / 1000
        found = _after(_header(headers, "retry-after"), clock)
        if found is not None:
            return found
    return None


def provider_pause(exc: BaseException, *, now: float | None = None) -> float | None:
    """A provider's rate-limit answer (HTTP status 429 in the exception's chain) that says how long
    to wait (:func:`retry_after`): those seconds; ``None`` for any other exception."""
    if not any(_status(item) == 429 for item in _chain(exc)):
        return None
    return retry_after(exc, now=now)


def delay(
    policy: RetryPolicy,
    attempt: int,
    exc: BaseException | None = None,
    rng: random.Random | None = None,
    *,
    now: float | None = None,
) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1 = the first) before the next one.

    ``initial_interval * backoff_coefficient ** (attempt - 1)``, at most ``max_interval``; with
    ``jitter``, equal jitter: a uniform draw between half and all of it (never much less than the
    back-off asked for, as a rate limit needs, while concurrent retries spread out). A
    ``Retry-After`` the provider sent with ``exc`` (:func:`retry_after`) wins, as it is: not capped,
    not jittered.

    Raises:
        UsageError: ``attempt`` below 1.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise UsageError(
            f"delay takes the attempt that failed (1 or more), not {attempt!r}", option="attempt"
        )
    if exc is not None:
        asked = retry_after(exc, now=now)
        if asked is not None:
            return asked
    try:
        wait = min(policy.max_interval, policy.initial_interval * policy.backoff_coefficient ** (attempt - 1))
    except OverflowError:
        wait = policy.max_interval
    if policy.jitter:
        wait = wait / 2 + (rng or random).uniform(0, wait / 2)
    return wait


# -- the timeout guard ----------------------------------------------------------------------------


async def within_limits(
    stream: AsyncIterator[I],
    policy: TimeoutPolicy | None,
    *,
    node: str,
    attempt: int,
    cancellation_token: CancellationToken,
    grace: float = 1.0,
) -> AsyncIterator[I]:
    """The items of ``stream`` (an agent's ``on_messages_stream``), within the policy's limits.

    ``idle_timeout`` is counted from the last item (each one resets it); ``run_timeout`` from the
    start. On expiry the turn's ``cancellation_token`` is cancelled, the pending step of the agent
    is cancelled (awaited up to ``grace`` seconds, for its clean-up) and
    :class:`~graphflow_durable.NodeTimeoutError` raised. No policy (or no limits): the items as they
    come, at no cost.

    Give it the turn's own token, a child of the one the runtime delivered the request with: that
    one is shared by the whole batch (AutoGen passes the manager's token to every participant), and
    cancelling it would stop the sibling turns too.
    """
    if policy is None or (policy.run_timeout is None and policy.idle_timeout is None):
        async for item in stream:
            yield item
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    last = start
    pending: asyncio.Future[I] | None = None
    try:
        while True:
            limits = []
            if policy.idle_timeout is not None:
                limits.append((last + policy.idle_timeout, "idle_timeout", policy.idle_timeout))
            if policy.run_timeout is not None:
                limits.append((start + policy.run_timeout, "run_timeout", policy.run_timeout))
            deadline, kind, limit = min(limits)
            pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                cancellation_token.cancel()
                pending.cancel()
                await asyncio.wait({pending}, timeout=grace)
                if pending.done() and not pending.cancelled():
                    pending.exception()  # retrieved: the timeout is what the caller sees
                raise NodeTimeoutError(
                    _timeout_message(node, attempt, kind, limit),
                    node=node,
                    limit=limit,
                    kind=kind,
                    attempt=attempt,
                )
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            last = loop.time()
            yield item
    finally:
        if pending is not None and not pending.done():  # our caller was cancelled mid-wait
            pending.cancel()


def _timeout_message(node: str, attempt: int, kind: str, limit: float) -> str:
    if kind == "idle_timeout":
        what = f"yielded no event for {limit:g} s (idle_timeout)"
    else:
        what = f"ran past its {limit:g} s limit (run_timeout)"
    return (
        f"node {node!r} attempt {attempt} {what}; its turn was cancelled. If the agent needs longer, "
        f"raise the node's TimeoutPolicy({kind}=...)"
    )


# -- the event ------------------------------------------------------------------------------------


class NodeRetryEvent(BaseAgentEvent):
    """A node's attempt failed and will be retried (``run_stream`` yields it; ``source`` is the node).

    Attributes:
        node: the node.
        attempt: the attempt that failed (1 = the first).
        error: the error, as ``"Type: message"``.
        retry_in: seconds until the next attempt.
    """

    node: str
    attempt: int
    error: str
    retry_in: float
    type: Literal["NodeRetryEvent"] = "NodeRetryEvent"

    def to_text(self) -> str:
        return f"{self.node}: attempt {self.attempt} failed ({self.error}); retrying in {self.retry_in:.1f} s"


def register_events(factory: MessageFactory) -> None:
    """Let ``factory`` (a team's) load a dumped :class:`NodeRetryEvent` back; a no-op when it can
    already (the team was given it in ``custom_message_types``)."""
    if not factory.is_registered(NodeRetryEvent):
        factory.register(NodeRetryEvent)
