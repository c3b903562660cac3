"""Retry and timeout policies per node: the values and their JSON, retry=/timeout= per node, which
errors are retried, the back-off and a provider's Retry-After, the timeout guard around real
agents, NodeRetryEvent and the two errors."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import random
import socket
from collections.abc import AsyncGenerator, Sequence
from email.utils import formatdate
from typing import Any

import pydantic
import pytest
from autogen_agentchat.base import Response
from autogen_agentchat.messages import (
    BaseAgentEvent,
    BaseChatMessage,
    MessageFactory,
    ModelClientStreamingChunkEvent,
    TextMessage,
)
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow
from autogen_core import CancellationToken

import graphflow_durable
from agents import Streaming, TextAgent
from graphflow_durable import (
    NodeFailedError,
    NodeRetryEvent,
    NodeTimeoutError,
    RetryPolicy,
    TimeoutPolicy,
    UsageError,
)
from graphflow_durable.errors import GraphflowDurableError, RunLockedError, StoreError
from graphflow_durable.retry import (
    delay,
    is_retryable,
    policies_config,
    register_events,
    retry_after,
    retry_policies,
    timeout_policies,
    within_limits,
)

NODES = ["planner", "writer", "reviewer"]

# -- the values and their JSON ----------------------------------------------------------------------


def test_a_retry_policy_round_trips_through_json_text_with_classes_stored_as_dotted_names() -> None:
    policy = RetryPolicy(
        max_attempts=4,
        initial_interval=0.5,
        backoff_coefficient=3,
        max_interval=30,
        jitter=False,
        retry_on=[KeyError, "openai.RateLimitError"],
        non_retryable=(pydantic.ValidationError,),
    )
    assert policy.retry_on == ("KeyError", "openai.RateLimitError")
    assert policy.non_retryable == ("pydantic_core._pydantic_core.ValidationError",)
    assert RetryPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy
    assert RetryPolicy.from_json({"max_attempts": 2}) == RetryPolicy(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 9  # type: ignore[misc]
    local = type("Local", (Exception,), {"__module__": "tests.here", "__qualname__": "f.<locals>.Local"})
    assert RetryPolicy.from_json(RetryPolicy(2, retry_on=[local]).to_json()).retry_on == (
        "tests.here.f.<locals>.Local",
    )


def test_a_timeout_policy_round_trips_through_json_text() -> None:
    for policy in (TimeoutPolicy(), TimeoutPolicy(run_timeout=900), TimeoutPolicy(idle_timeout=1.5)):
        assert TimeoutPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RetryPolicy(0), "max_attempts must be a whole number of at least 1"),
        (lambda: RetryPolicy(2.5), "max_attempts must be a whole number"),  # type: ignore[arg-type]
        (lambda: RetryPolicy(True), "max_attempts must be a whole number"),
        (
            lambda: RetryPolicy(3, initial_interval=-1),
            "initial_interval must be a number of seconds of at least 0",
        ),
        (lambda: RetryPolicy(3, max_interval=float("inf")), "max_interval must be a number of seconds"),
        (
            lambda: RetryPolicy(3, backoff_coefficient=0.5),
            "backoff_coefficient must be a number of at least 1",
        ),
        (lambda: RetryPolicy(3, jitter="yes"), "jitter must be True or False"),  # type: ignore[arg-type]
        (lambda: RetryPolicy(3, retry_on=[42]), "retry_on takes exception classes or dotted names"),
        (lambda: RetryPolicy(3, non_retryable=["not a name"]), "non_retryable takes exception classes"),
        (lambda: RetryPolicy.from_json({"max_attempts": 3, "tries": 2}), "RetryPolicy has no field 'tries'"),
        (lambda: RetryPolicy.from_json([3]), "a RetryPolicy in JSON is an object"),
        (lambda: TimeoutPolicy(run_timeout=0), "run_timeout must be a number of seconds above 0"),
        (lambda: TimeoutPolicy(idle_timeout=float("nan")), "idle_timeout must be a number of seconds"),
        (lambda: TimeoutPolicy(idle_timeout="60"), "idle_timeout must be a number of seconds"),  # type: ignore[arg-type]
        (lambda: TimeoutPolicy.from_json({"limit": 3}), "TimeoutPolicy has no field 'limit'"),
    ],
)
def test_a_bad_policy_is_a_one_line_usage_error_naming_the_field(make: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        make()
    assert "\n" not in str(caught.value)
    assert caught.value.option in {"retry", "timeout"}


# -- per node ---------------------------------------------------------------------------------------


def test_retry_per_node_takes_policies_ints_none_and_a_star_default() -> None:
    policies = retry_policies({"*": RetryPolicy(max_attempts=3), "writer": 5, "reviewer": None}, NODES)
    assert policies == {"planner": RetryPolicy(3), "writer": RetryPolicy(5), "reviewer": None}
    assert retry_policies(None, NODES) == dict.fromkeys(NODES)
    assert retry_policies(2, NODES) == dict.fromkeys(NODES, RetryPolicy(2))
    assert retry_policies({"writer": 2}, NODES) == {
        "planner": None,
        "writer": RetryPolicy(2),
        "reviewer": None,
    }


def test_timeout_per_node_takes_seconds_as_the_run_timeout() -> None:
    policies = timeout_policies(
        {"*": TimeoutPolicy(run_timeout=900, idle_timeout=120), "planner": 60.0}, NODES
    )
    assert policies["planner"] == TimeoutPolicy(run_timeout=60.0)
    assert policies["writer"] == policies["reviewer"] == TimeoutPolicy(run_timeout=900, idle_timeout=120)
    assert timeout_policies(30, NODES) == dict.fromkeys(NODES, TimeoutPolicy(run_timeout=30))


@pytest.mark.parametrize(
    "value",
    [
        None,
        3,
        RetryPolicy(2, retry_on=["KeyError"]),
        {"*": RetryPolicy(max_attempts=3), "writer": 5, "reviewer": None},
        {"writer": RetryPolicy(4, jitter=False)},
    ],
)
def test_the_retry_config_json_reads_back_to_the_same_policies(value: Any) -> None:
    policies = retry_policies(value, NODES)
    text = json.dumps(policies_config(policies))
    assert retry_policies(json.loads(text), NODES) == policies


@pytest.mark.parametrize("value", [None, 60.0, {"*": TimeoutPolicy(idle_timeout=5), "planner": 60.0}])
def test_the_timeout_config_json_reads_back_to_the_same_policies(value: Any) -> None:
    policies = timeout_policies(value, NODES)
    assert timeout_policies(json.loads(json.dumps(policies_config(policies))), NODES) == policies


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (retry_policies, {"editor": 3}, "retry names 'editor', which is not a participant"),
        (timeout_policies, {"*": 5, "editor": 3}, "timeout names 'editor', which is not a participant"),
        (
            retry_policies,
            {"writer": "often"},
            r"retry\['writer'\] must be a RetryPolicy, a number of attempts",
        ),
        (retry_policies, 2.5, "retry must be a RetryPolicy, a number of attempts or None, not float"),
        (timeout_policies, "60", "timeout must be a TimeoutPolicy, seconds"),
        (retry_policies, {"writer": 0}, "max_attempts must be a whole number of at least 1"),
    ],
)
def test_a_bad_per_node_setting_is_a_usage_error_naming_it(parse: Any, value: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        parse(value, NODES)
    assert "\n" not in str(caught.value)


def test_human_input_and_the_policies_share_one_parser_and_its_error() -> None:
    from graphflow_durable._model.human import human_inputs

    for call in (lambda: human_inputs({"Z": "wait"}, NODES), lambda: retry_policies({"Z": 2}, NODES)):
        with pytest.raises(
            UsageError, match="'Z', which is not a participant \\(participants: planner, writer"
        ):
            call()


# -- the classifier -----------------------------------------------------------------------------------


def sdk_error(
    name: str, module: str = "openai", *, bases: tuple[type, ...] = (Exception,), text: str = "", **attrs: Any
) -> Exception:
    """An exception shaped like a model SDK's: its class name and module, its attributes."""
    cls = type(name, bases, {"__module__": module})
    exc = cls(text or f"{name} from {module}")
    for key, value in attrs.items():
        setattr(exc, key, value)
    return exc


class Response429:
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


def chained(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except Exception as caught:
        return caught


def in_context(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 -- the implicit __context__ is what this builds
    except Exception as caught:
        return caught


RETRIED: list[tuple[str, BaseException]] = [
    ("a TimeoutError", TimeoutError("read timed out")),
    ("asyncio's TimeoutError", asyncio.TimeoutError()),
    ("a ConnectionResetError", ConnectionResetError(errno.ECONNRESET, "reset by peer")),
    ("a network OSError", OSError(errno.ENETUNREACH, "Network is unreachable")),
    ("a DNS failure", socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")),
    ("a node timeout", NodeTimeoutError("late", node="w", limit=1.0, kind="run_timeout", attempt=1)),
    ("openai's RateLimitError", sdk_error("RateLimitError", status_code=429)),
    ("a rate limit known by name only", sdk_error("RateLimitError", "anthropic")),
    ("an overloaded server", sdk_error("OverloadedError", "anthropic")),
    ("openai's connection error", sdk_error("APIConnectionError")),
    ("openai's timeout", sdk_error("APITimeoutError")),
    ("a 503 by status_code", sdk_error("APIStatusError", status_code=503)),
    ("a 500 by response.status_code", sdk_error("HTTPStatusError", "httpx", response=Response429(500))),
    ("a 429 by status", sdk_error("ClientResponseError", "aiohttp", status=429)),
    ("google's ResourceExhausted", sdk_error("ResourceExhausted", "google.api_core.exceptions")),
    (
        "httpx's ConnectError (by its base)",
        sdk_error("ConnectError", "httpx", bases=(sdk_error("TransportError", "httpx").__class__,)),
    ),
    ("a wrapper caused by a timeout", chained(RuntimeError("tool failed"), TimeoutError())),
    (
        "a wrapper whose context is a 502",
        in_context(RuntimeError("tool failed"), sdk_error("APIError", status_code=502)),
    ),
]

NOT_RETRIED: list[tuple[str, BaseException]] = [
    ("a ValueError", ValueError("bad")),
    ("a TypeError", TypeError("bad")),
    ("a KeyError (unknown: not retried by default)", KeyError("x")),
    ("a plain RuntimeError", RuntimeError("boom")),
    ("a missing file", FileNotFoundError(errno.ENOENT, "no such file")),
    ("a 400 by status_code", sdk_error("BadRequestError", status_code=400)),
    ("a 404 even with a transient name", sdk_error("APIConnectionError", status_code=404)),
    ("a 401 known by name", sdk_error("AuthenticationError")),
    ("a 422 by response.status_code", sdk_error("HTTPStatusError", "httpx", response=Response429(422))),
    ("this package's usage error", UsageError("wrong")),
    ("this package's store error", StoreError("db down")),
    ("a lost run lock", RunLockedError("locked", run_id="r")),
    ("a failed node", NodeFailedError(node="w", attempts=3, error_type="X", error="y")),
    ("a cancellation", asyncio.CancelledError()),
    ("Ctrl+C", KeyboardInterrupt()),
    ("a ValueError caused by a timeout (the outer verdict wins)", chained(ValueError("bad"), TimeoutError())),
]


def pydantic_error() -> pydantic.ValidationError:
    class Shape(pydantic.BaseModel):
        x: int

    try:
        Shape(x="not a number")  # type: ignore[arg-type]
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("pydantic accepted a bad value")


def suppressed() -> Exception:
    try:
        try:
            raise TimeoutError
        except TimeoutError:
            raise RuntimeError("x") from None
    except RuntimeError as caught:
        return caught


NOT_RETRIED += [
    ("a pydantic validation error", pydantic_error()),
    ("a timeout raised from None", suppressed()),
]


@pytest.mark.parametrize(("what", "exc"), RETRIED, ids=[w for w, _ in RETRIED])
def test_the_default_classifier_retries_transient_failures(what: str, exc: BaseException) -> None:
    assert is_retryable(exc), what


@pytest.mark.parametrize(("what", "exc"), NOT_RETRIED, ids=[w for w, _ in NOT_RETRIED])
def test_the_default_classifier_never_retries_what_a_retry_repeats(what: str, exc: BaseException) -> None:
    assert not is_retryable(exc), what


def test_real_httpx_transport_errors_are_retried_and_4xx_statuses_are_not() -> None:
    httpx = pytest.importorskip("httpx")
    request = httpx.Request("GET", "https://example.invalid")
    assert is_retryable(httpx.ConnectError("refused", request=request))
    assert is_retryable(httpx.ReadTimeout("slow", request=request))
    for status, verdict in ((429, True), (503, True), (404, False)):
        response = httpx.Response(status, request=request)
        error = httpx.HTTPStatusError("status", request=request, response=response)
        assert is_retryable(error) is verdict


def test_retry_on_and_non_retryable_override_the_default_along_the_chain() -> None:
    retry_keys = RetryPolicy(3, retry_on=[KeyError])
    assert is_retryable(KeyError("x"), retry_keys)
    assert is_retryable(chained(RuntimeError("wrapped"), KeyError("x")), retry_keys)
    never_rate = RetryPolicy(3, retry_on=["KeyError"], non_retryable=["RateLimitError"])
    assert not is_retryable(sdk_error("RateLimitError", "anthropic"), never_rate)
    both = RetryPolicy(3, retry_on=["openai.RateLimitError"], non_retryable=["openai.RateLimitError"])
    assert not is_retryable(sdk_error("RateLimitError"), both)  # non_retryable wins
    other = RetryPolicy(3, non_retryable=["openai.RateLimitError"])
    assert is_retryable(sdk_error("RateLimitError", "other"), other)  # a dotted name matches its module only


async def failing_graphflow_error(exc: Exception) -> RuntimeError:
    """The exception plain GraphFlow's run() raises when its only agent raises ``exc``."""

    class Failing(TextAgent):
        async def on_messages(
            self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> Response:
            try:
                raise exc
            except Exception as inner:
                raise RuntimeError("the agent's tool failed") from inner

    agent = Failing("A", "fails")
    builder = DiGraphBuilder()
    builder.add_node(agent)
    team = GraphFlow([agent], builder.build())
    with pytest.raises(RuntimeError) as caught:
        await team.run(task="go")
    return caught.value


async def test_an_agent_error_graphflow_passes_on_as_text_is_judged_by_the_classes_it_names() -> None:
    # AutoGen 0.7.x: the container catches the agent's exception, publishes a SerializableException
    # (type name, message, formatted traceback) and GraphFlow's run() raises RuntimeError(str(it)),
    # not chained: the original exception object never reaches the caller.
    reset = await failing_graphflow_error(ConnectionResetError(errno.ECONNRESET, "reset by peer"))
    assert type(reset) is RuntimeError and reset.__cause__ is None
    assert str(reset).startswith("RuntimeError: the agent's tool failed\nTraceback:")
    assert is_retryable(reset)
    assert not is_retryable(await failing_graphflow_error(ValueError("bad input")))
    rate = await failing_graphflow_error(sdk_error("RateLimitError", "openai"))
    assert is_retryable(rate)
    assert not is_retryable(rate, RetryPolicy(3, non_retryable=["openai.RateLimitError"]))
    # the SDKs write the status into the message: "Error code: 503 - {...}"
    unavailable = await failing_graphflow_error(sdk_error("APIStatusError", text="Error code: 503 - {}"))
    assert is_retryable(unavailable)
    forbidden = await failing_graphflow_error(sdk_error("APIStatusError", text="Error code: 403 - {}"))
    assert not is_retryable(forbidden)


# -- the back-off ---------------------------------------------------------------------------------------


def test_the_back_off_grows_exponentially_up_to_the_max_interval_without_jitter() -> None:
    policy = RetryPolicy(10, initial_interval=1, backoff_coefficient=2, max_interval=10, jitter=False)
    assert [delay(policy, n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert delay(policy, 10_000) == 10  # no overflow on a huge attempt number
    assert delay(RetryPolicy(3, initial_interval=0, jitter=False), 2) == 0


def test_equal_jitter_stays_between_half_and_all_of_the_computed_delay() -> None:
    policy = RetryPolicy(10, initial_interval=2, backoff_coefficient=3, max_interval=60)
    rng = random.Random(7)
    for attempt in range(1, 8):
        computed = min(60, 2 * 3 ** (attempt - 1))
        draws = [delay(policy, attempt, rng=rng) for _ in range(200)]
        assert all(computed / 2 <= d <= computed for d in draws)
        assert max(draws) - min(draws) > computed / 4  # it does spread
    assert delay(policy, 3, rng=random.Random(1)) == delay(policy, 3, rng=random.Random(1))


def test_a_provider_retry_after_in_seconds_wins_over_the_computed_delay() -> None:
    policy = RetryPolicy(5, initial_interval=1, max_interval=2)
    exc = sdk_error("RateLimitError", status_code=429, response=Response429(429, {"Retry-After": "120"}))
    assert retry_after(exc) == 120
    assert delay(policy, 1, exc, random.Random(0)) == 120  # not capped, not jittered
    assert (
        retry_after(sdk_error("RateLimitError", response=Response429(429, {"retry-after-ms": "1500"}))) == 1.5
    )
    assert retry_after(sdk_error("RateLimitError", retry_after=7)) == 7
    wrapped = chained(RuntimeError("tool"), exc)
    assert retry_after(wrapped) == 120


def test_a_provider_retry_after_as_an_http_date_counts_from_now() -> None:
    now = 1_800_000_000.0
    exc = sdk_error(
        "RateLimitError", response=Response429(429, {"Retry-After": formatdate(now + 30, usegmt=True)})
    )
    assert retry_after(exc, now=now) == pytest.approx(30)
    assert delay(RetryPolicy(3), 1, exc, now=now) == pytest.approx(30)
    past = sdk_error(
        "RateLimitError", response=Response429(429, {"Retry-After": formatdate(now - 30, usegmt=True)})
    )
    assert retry_after(past, now=now) == 0


def test_an_unreadable_retry_after_is_ignored() -> None:
    policy = RetryPolicy(3, jitter=False)
    exc = sdk_error("RateLimitError", response=Response429(429, {"Retry-After": "soon"}))
    assert retry_after(exc) is None and delay(policy, 2, exc) == 2


def test_delay_refuses_an_attempt_below_one() -> None:
    with pytest.raises(UsageError, match="delay takes the attempt that failed"):
        delay(RetryPolicy(3), 0)


# -- the errors -------------------------------------------------------------------------------------------


def test_node_failed_error_says_which_node_how_many_attempts_the_last_error_and_how_to_retry() -> None:
    error = NodeFailedError(
        node="writer", attempts=3, error_type="RateLimitError", error="slow down", run_id="r42"
    )
    assert isinstance(error, RuntimeError) and isinstance(error, GraphflowDurableError)
    assert (error.node, error.attempts, error.error_type, error.error, error.run_id) == (
        "writer",
        3,
        "RateLimitError",
        "slow down",
        "r42",
    )
    assert str(error) == (
        "run r42: node 'writer' failed after 3 attempts; last error: RateLimitError: slow down. Once the "
        "cause is fixed, retry it with `graphflow-durable runs retry r42` (or Store.retry_run('r42'))"
    )
    assert "after 1 attempt;" in str(NodeFailedError(node="w", attempts=1, error_type="E", error=""))
    why = "E is not retryable under its retry policy (retry_on=[]); add it to retry_on to retry it"
    told = NodeFailedError(node="w", attempts=1, error_type="E", error="x", allowed=3, reason=why)
    assert f"node 'w' failed after 1 of 3 allowed attempts: {why}; last error: E: x. " in str(told)


def test_node_timeout_error_names_the_node_the_limit_and_the_attempt() -> None:
    error = NodeTimeoutError("late", node="planner", limit=60.0, kind="run_timeout", attempt=2)
    assert isinstance(error, TimeoutError) and isinstance(error, GraphflowDurableError)
    assert (error.node, error.limit, error.kind, error.attempt) == ("planner", 60.0, "run_timeout", 2)


def test_the_new_names_are_public_and_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text(encoding="utf-8")
    for name in ("NodeFailedError", "NodeTimeoutError", "NodeRetryEvent", "RetryPolicy", "TimeoutPolicy"):
        assert name in graphflow_durable.__all__
    for name in ("NodeFailedError", "NodeTimeoutError"):
        assert name in doc


# -- NodeRetryEvent -------------------------------------------------------------------------------------


def test_a_dumped_node_retry_event_loads_back_through_a_registered_factory() -> None:
    event = NodeRetryEvent(
        source="writer", node="writer", attempt=2, error="RateLimitError: slow", retry_in=4.0
    )
    assert isinstance(event, BaseAgentEvent)
    assert event.to_text() == "writer: attempt 2 failed (RateLimitError: slow); retrying in 4.0 s"
    dumped = json.loads(json.dumps(event.dump()))
    factory = MessageFactory()
    with pytest.raises(ValueError, match="Unknown message type"):
        factory.create(dumped)
    register_events(factory)
    register_events(factory)  # a second time is a no-op
    assert factory.create(dumped) == event


class Reporter(TextAgent):
    """Answers with a NodeRetryEvent among its inner messages, so the event is stored in the log."""

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        event = NodeRetryEvent(
            source=self.name, node=self.name, attempt=1, error="TimeoutError: slow", retry_in=2.0
        )
        return Response(chat_message=TextMessage(content="ok", source=self.name), inner_messages=[event])


@pytest.mark.parametrize(
    "custom", [None, [NodeRetryEvent]], ids=["registered by the team", "and by the caller"]
)
async def test_a_stored_node_retry_event_loads_back_into_a_fresh_durable_team(
    tmp_path: Any, custom: Any
) -> None:
    from agents import close_stores, durable

    def team() -> graphflow_durable.DurableGraphFlow:
        agent = Reporter("A", "reports")
        builder = DiGraphBuilder()
        builder.add_node(agent)
        return durable(
            [agent], builder.build(), f"sqlite:///{tmp_path}/runs.db", "events", custom_message_types=custom
        )

    try:
        first = await team().run(task="go")
        again = await team().run()  # a finished run: its stored thread, through the team's factory
    finally:
        close_stores()
    assert [type(m).__name__ for m in again.messages] == [type(m).__name__ for m in first.messages]
    assert next(m for m in again.messages if isinstance(m, NodeRetryEvent)).retry_in == 2.0


# -- the timeout guard, around real agents ---------------------------------------------------------


async def run_guarded(agent: Streaming, policy: TimeoutPolicy | None, token: CancellationToken) -> list[Any]:
    stream = agent.on_messages_stream([TextMessage(content="go", source="user")], token)
    return [
        item
        async for item in within_limits(stream, policy, node=agent.name, attempt=2, cancellation_token=token)
    ]


async def test_idle_timeout_stops_an_agent_that_hangs_without_yielding_and_cancels_its_token() -> None:
    agent = Streaming("hangs", every=0.01, chunks=None)
    token = CancellationToken()
    with pytest.raises(NodeTimeoutError) as caught:
        await run_guarded(agent, TimeoutPolicy(idle_timeout=0.2), token)
    error = caught.value
    assert (error.node, error.attempt, error.kind, error.limit) == ("hangs", 2, "idle_timeout", 0.2)
    assert str(error).startswith("node 'hangs' attempt 2 yielded no event for 0.2 s (idle_timeout)")
    assert token.is_cancelled() and agent.cancelled
    assert is_retryable(error)


async def test_an_agent_streaming_steadily_for_longer_than_idle_timeout_is_not_stopped() -> None:
    agent = Streaming("steady", every=0.05, chunks=40)  # 2 s in all, an event every 0.05 s
    token = CancellationToken()
    items = await run_guarded(agent, TimeoutPolicy(idle_timeout=1.0), token)
    assert len(items) == 41 and isinstance(items[-1], Response)
    assert not token.is_cancelled() and not agent.cancelled


async def test_run_timeout_stops_a_steadily_streaming_agent_anyway() -> None:
    agent = Streaming("endless", every=0.02, chunks=10_000)
    token = CancellationToken()
    with pytest.raises(
        NodeTimeoutError, match=r"node 'endless' attempt 2 ran past its 0.5 s limit \(run_timeout\)"
    ):
        await run_guarded(agent, TimeoutPolicy(run_timeout=0.5, idle_timeout=2.0), token)
    assert token.is_cancelled() and agent.cancelled


async def test_without_limits_the_guard_passes_the_stream_through() -> None:
    agent = Streaming("plain", every=0, chunks=3)
    for policy in (None, TimeoutPolicy()):
        items = await run_guarded(agent, policy, CancellationToken())
        assert [getattr(i, "content", None) for i in items[:3]] == ["0", "1", "2"]


async def test_a_caller_cancelled_while_waiting_cancels_the_agent_too() -> None:
    agent = Streaming("hangs", every=0.01, chunks=None)
    task = asyncio.ensure_future(run_guarded(agent, TimeoutPolicy(idle_timeout=30), CancellationToken()))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert agent.cancelled


async def test_idle_timeout_stops_an_assistant_agent_whose_tool_hangs_and_cancels_the_tool() -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import ToolCallRequestEvent
    from autogen_core import FunctionCall
    from autogen_core.models import CreateResult, ModelInfo, RequestUsage
    from autogen_ext.models.replay import ReplayChatCompletionClient

    cancelled: list[bool] = []

    async def fetch_report() -> str:
        """A tool whose server never answers."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    call = CreateResult(
        finish_reason="function_calls",
        content=[FunctionCall(id="1", name="fetch_report", arguments="{}")],
        usage=RequestUsage(prompt_tokens=1, completion_tokens=1),
        cached=False,
    )
    info = ModelInfo(
        vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
    )
    model = ReplayChatCompletionClient([call], model_info=info)
    agent = AssistantAgent("writer", model_client=model, tools=[fetch_report])
    token = CancellationToken()
    seen: list[Any] = []
    stream = agent.on_messages_stream([TextMessage(content="write", source="user")], token)
    with pytest.raises(NodeTimeoutError, match=r"node 'writer' attempt 1 yielded no event for 0\.3 s"):
        async for item in within_limits(
            stream, TimeoutPolicy(idle_timeout=0.3), node="writer", attempt=1, cancellation_token=token
        ):
            seen.append(item)
    assert [type(i) for i in seen] == [ToolCallRequestEvent]  # it got as far as calling the tool
    assert token.is_cancelled() and cancelled == [True]


async def test_an_agent_error_inside_the_guard_reaches_the_caller_as_itself() -> None:
    class Failing(Streaming):
        async def on_messages_stream(
            self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | Response, None]:
            yield ModelClientStreamingChunkEvent(content="partial", source=self.name)
            raise ConnectionResetError(errno.ECONNRESET, "reset by peer")

    token = CancellationToken()
    with pytest.raises(ConnectionResetError) as caught:
        await run_guarded(Failing("flaky", every=0, chunks=0), TimeoutPolicy(idle_timeout=5), token)
    assert is_retryable(caught.value) and not token.is_cancelled()
