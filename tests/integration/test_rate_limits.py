"""Model-provider rate limits shared through the store (``store.limits``, ``rate_limited``,
``DurableGraphFlow(rate_limits=...)``), on SQLite and PostgreSQL: a call's turn is one statement,
concurrent callers never get turns closer than the limit's interval, a call over the budget waits
instead of failing, tokens are corrected from the reported usage, a replayed call spends nothing,
a provider's 429 pauses the key, and a wait longer than the lease keeps the run's lease."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import CreateResult, RequestUsage, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graphflow_durable import (
    DurableGraphFlow,
    RateLimit,
    RateLimitedChatCompletionClient,
    RecordedChatCompletionClient,
    RetryPolicy,
    Store,
    StoreError,
    UsageError,
    rate_limited,
    recorded,
)
from graphflow_durable.cli.runs import main as cli_main
from graphflow_durable.retry import provider_pause

from .test_recorded_calls import Ran, assistant, rows, team_of

MINUTE = 61.0  # the schedules' minute: 60 s and a second of slack


@pytest.fixture
def limits_store(store_url: str) -> Iterator[Store]:
    with Store(store_url) as store:
        yield store


def too_many(exc: Exception | None = None, after: str = "2") -> httpx.HTTPStatusError:
    """A provider's 429 as httpx raises it, with ``Retry-After: after``."""
    request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
    response = httpx.Response(429, headers={"retry-after": after}, request=request)
    return httpx.HTTPStatusError("Too Many Requests", request=request, response=response)


class Counting(ReplayChatCompletionClient):
    """AutoGen's scripted client, with the time of each call that reached it (and a 429 first,
    when asked)."""

    def __init__(
        self, answers: Sequence[str], *, fail_first: Exception | None = None, tokens: int = 0
    ) -> None:
        super().__init__(list(answers))
        self.times: list[float] = []
        self.fail_first = fail_first
        self.tokens = tokens

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        self.times.append(time.time())
        if self.fail_first is not None:
            failure, self.fail_first = self.fail_first, None
            raise failure
        result = await super().create(messages, **kwargs)
        if self.tokens:
            result = result.model_copy(
                update={"usage": RequestUsage(prompt_tokens=self.tokens, completion_tokens=0)}
            )
        return result


# -- the value ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"key": "", "requests_per_minute": 10},
        {"key": "  ", "requests_per_minute": 10},
        {"key": "k", "requests_per_minute": 0},
        {"key": "k", "requests_per_minute": -5},
        {"key": "k", "tokens_per_minute": float("inf")},
        {"key": "k", "requests_per_minute": True},
        {"key": "k", "requests_per_minute": "10"},
        {"key": "k"},
    ],
)
def test_rate_limit_refuses_an_empty_key_a_limit_not_positive_or_no_limit(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        RateLimit(**kwargs)


def test_rate_limited_refuses_two_limits_of_one_key_and_what_is_not_a_limit() -> None:
    client = ReplayChatCompletionClient(["x"])
    with pytest.raises(UsageError, match="key twice"):
        rate_limited(client, [RateLimit("k", 10), RateLimit("k", tokens_per_minute=5)])
    with pytest.raises(UsageError, match="RateLimit or a list"):
        rate_limited(client, "k")  # type: ignore[arg-type]


# -- the budget in the store --------------------------------------------------------------------------


def test_a_turn_with_budget_left_is_one_statement_and_starts_now(limits_store: Store) -> None:
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    engine = limits_store._e.write
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        now = time.time()
        start = limits_store.limits.reserve("k", spacing=1.0, requests_per_minute=60, now=now)
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert start == now
    assert len([s for s in statements if "graphflow_rate_limits" in s]) == 1, statements
    assert [s for s in statements if "graphflow_rate_limits" not in s and "BEGIN" not in s.upper()] == []


def test_threads_hammering_one_key_never_get_turns_closer_than_the_interval(store_url: str) -> None:
    spacing = 0.01
    starts: list[float] = []
    lock = threading.Lock()

    with Store(store_url) as store:

        def hammer() -> None:
            for _ in range(25):
                start = store.limits.reserve("shared", spacing=spacing, requests_per_minute=MINUTE / spacing)
                with lock:
                    starts.append(start)

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (state,) = store.limits.list()
    starts.sort()
    assert len(starts) == 200
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= spacing - 1e-6, "two callers got turns closer than the interval"
    assert state.window_requests == 200


def test_a_pause_holds_every_turn_until_it_ends_and_a_shorter_one_does_not_shorten_it(
    limits_store: Store,
) -> None:
    now = time.time()
    limits_store.limits.pause("k", now + 10, now=now)
    limits_store.limits.pause("k", now + 3, now=now)  # a shorter pause keeps the longer one
    assert limits_store.limits.paused_until("k") == pytest.approx(now + 10)
    assert limits_store.limits.reserve("k", spacing=0.5, now=now) == pytest.approx(now + 10)
    assert limits_store.limits.reserve("k", spacing=0.5, now=now) == pytest.approx(now + 10.5)


# -- the wrapper ------------------------------------------------------------------------------------


async def test_calls_over_the_budget_wait_their_turn_and_none_fails(limits_store: Store) -> None:
    model = Counting(["a", "b", "c"])
    client = rate_limited(model, RateLimit("slow", requests_per_minute=MINUTE / 0.4), store=limits_store)
    results = await asyncio.gather(
        *(client.create([UserMessage(content="hi", source="u")]) for _ in range(3))
    )
    assert sorted(r.content for r in results) == ["a", "b", "c"]  # type: ignore[type-var]
    gaps = [b - a for a, b in itertools.pairwise(sorted(model.times))]
    # Turns are 0.4 s apart; a call starts a little after its turn (the statement's own time, which
    # the first call, not waiting, spends after its turn): the calls' own gaps may be that shorter.
    assert min(gaps) >= 0.4 - 0.15, model.times
    assert model.times[-1] - model.times[0] >= 0.8 - 0.15


async def test_tokens_are_estimated_before_the_call_and_corrected_by_its_reported_usage(
    limits_store: Store,
) -> None:
    model = Counting(["a", "b"], tokens=600)
    limit = RateLimit("tokens", tokens_per_minute=MINUTE * 1000)  # 1000 tokens a second
    client = rate_limited(model, limit, store=limits_store)
    prompt = [UserMessage(content="x" * 400, source="u")]  # estimated 100 tokens
    await client.create(prompt)
    (state,) = limits_store.limits.list()
    assert state.window_tokens == 600, "charged the reported 600, not the estimated 100"
    start = model.times[0]
    assert state.token_at == pytest.approx(start + 0.6, abs=0.05), "600 tokens are 0.6 s of budget"
    await client.create(prompt)  # waits for the 600 tokens' 0.6 s, not the estimate's 0.1 s
    assert model.times[1] - model.times[0] >= 0.45


async def test_a_429_with_retry_after_pauses_the_key_and_the_call_is_made_after_it(
    limits_store: Store,
) -> None:
    model = Counting(["ok"], fail_first=too_many(after="1"))
    client = rate_limited(model, RateLimit("p", requests_per_minute=6000), store=limits_store)
    result = await client.create([UserMessage(content="hi", source="u")])
    assert result.content == "ok"
    assert len(model.times) == 2 and model.times[1] - model.times[0] >= 0.95
    assert limits_store.limits.paused_until("p") >= model.times[0] + 0.95


async def test_a_fourth_429_in_a_row_pauses_the_key_and_is_raised_for_the_retry_policy(
    limits_store: Store,
) -> None:
    class AlwaysBusy(Counting):
        async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
            self.times.append(time.time())
            raise too_many(after="0.1")

    model = AlwaysBusy(["never"])
    client = rate_limited(model, RateLimit("busy", requests_per_minute=60000), store=limits_store)
    with pytest.raises(httpx.HTTPStatusError):
        await client.create([UserMessage(content="hi", source="u")])
    assert len(model.times) == 4, "made once and again 3 times"
    assert limits_store.limits.paused_until("busy") >= model.times[-1]


@pytest.mark.parametrize(
    "error",
    [
        too_many(after="2"),
        type("ClientResponseError", (Exception,), {"status": 429, "headers": {"Retry-After": "2"}})(),
        type("RateLimitError", (Exception,), {"status_code": 429, "retry_after": 2.0})(),
    ],
    ids=["httpx", "own-headers", "retry_after-attribute"],
)
def test_a_429_is_read_as_a_pause_from_the_response_the_exception_or_an_attribute(error: Exception) -> None:
    assert provider_pause(error, now=0.0) == 2.0
    assert provider_pause(ValueError("Error code: 400"), now=0.0) is None


async def test_a_429_without_retry_after_is_raised_for_the_retry_policy(limits_store: Store) -> None:
    request = httpx.Request("POST", "https://api.example.com/")
    bare = httpx.HTTPStatusError("429", request=request, response=httpx.Response(429, request=request))
    client = rate_limited(Counting(["ok"], fail_first=bare), RateLimit("p", 6000), store=limits_store)
    with pytest.raises(httpx.HTTPStatusError):
        await client.create([UserMessage(content="hi", source="u")])
    assert limits_store.limits.paused_until("p") == 0.0


async def test_a_call_outside_a_durable_run_without_a_store_is_refused() -> None:
    client = rate_limited(ReplayChatCompletionClient(["x"]), RateLimit("k", 60))
    with pytest.raises(UsageError, match="pass store="):
        await client.create([UserMessage(content="hi", source="u")])


def test_the_wrapper_dumps_and_loads_as_a_component(store_url: str) -> None:
    client = rate_limited(ReplayChatCompletionClient(["x"]), RateLimit("k", 60, 1000), store=store_url)
    loaded = RateLimitedChatCompletionClient.load_component(client.dump_component())
    assert isinstance(loaded, RateLimitedChatCompletionClient)
    assert loaded.limits == (RateLimit("k", 60, 1000),)


# -- in a durable team ------------------------------------------------------------------------------


async def test_a_replayed_call_spends_nothing_only_live_calls_take_turns(store_url: str) -> None:
    calls: list[int] = []
    agent = assistant(calls, Ran(), crash_on=2, error=ConnectionError)  # retryable, once
    team = team_of(
        agent,
        store_url,
        retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False),
        rate_limits=[RateLimit("model", requests_per_minute=60000)],
    )
    client = agent._model_client
    assert isinstance(client, RecordedChatCompletionClient)
    assert isinstance(client.inner, RateLimitedChatCompletionClient), "recorded(rate_limited(...))"
    await team.run(task="go")
    replayed = [r for r in rows(team) if r[1] == "model" and r[3] == "replayed"]
    assert len(replayed) == 2
    (state,) = team.store.limits.list()
    # Attempt 1: calls 0, 1 and 2 (which raised); attempt 2: 0 and 1 replayed, 2 made again.
    assert state.window_requests == 4, "a replayed call must not take a turn"


def test_the_other_order_spends_a_turn_for_every_call_replays_included() -> None:
    inner = ReplayChatCompletionClient(["x"])
    outer = rate_limited(recorded(inner), RateLimit("k", 60))
    assert isinstance(outer.inner, RecordedChatCompletionClient)  # documented, not refused


async def test_without_rate_limits_the_clients_are_not_wrapped_and_no_budget_is_kept(store_url: str) -> None:
    calls: list[int] = []
    model_agent = assistant(calls, Ran())
    original = model_agent._model_client
    team = team_of(model_agent, store_url)
    assert model_agent._model_client.inner is original  # type: ignore[attr-defined]
    await team.run(task="go")
    assert team.store.limits.list() == []


async def test_a_wait_longer_than_the_lease_keeps_the_runs_lease_renewed(store_url: str) -> None:
    calls: list[int] = []
    agent = assistant(calls, Ran())
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    team = team_of(
        agent,
        store_url,
        lease_seconds=0.6,
        rate_limits=RateLimit("slow", requests_per_minute=MINUTE / 1.5),  # a call every 1.5 s
        meter_provider=MeterProvider(metric_readers=[reader]),
        tracer_provider=tracer,
    )
    leases: list[tuple[float, float | None, int]] = []

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.3)
            run = await asyncio.to_thread(team.store.get_run, team.run_id)
            if run is not None and run.status == "running":
                leases.append((time.time(), run.lease_expires_at, run.fencing_token))

    watcher = asyncio.create_task(watch())
    try:
        started = time.monotonic()
        await team.run(task="go")
    finally:
        watcher.cancel()
    assert time.monotonic() - started >= 2 * 1.5 - 0.1, "three model calls, 1.5 s apart"
    assert calls == [0, 1, 2]
    assert team.store.get_run(team.run_id).status == "finished"  # type: ignore[union-attr]
    assert len({token for _, _, token in leases}) == 1, "the lease was never lost nor taken over"
    assert leases and all(expires is not None and expires > seen for seen, expires, _ in leases)
    data = reader.get_metrics_data()
    points = {
        m.name: m.data.data_points
        for rm in data.resource_metrics  # type: ignore[union-attr]
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (waits,) = points["graphflow_durable.rate_limit.waits"]
    assert waits.value == 2 and dict(waits.attributes or {}) == {"key": "slow"}  # type: ignore[attr-defined]
    (waited,) = points["graphflow_durable.rate_limit.wait"]
    assert waited.sum >= 2.5  # type: ignore[attr-defined]
    events = {(span.name, event.name) for span in spans.get_finished_spans() for event in span.events}
    assert ("invoke_agent A", "graphflow_durable.rate_limit.wait") in events, events
    assert any(
        name.startswith("invoke_workflow") and e == "graphflow_durable.rate_limit_wait" for name, e in events
    )


def test_limits_list_prints_each_keys_budget_use_and_pause(
    store_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with Store(store_url) as store:
        now = time.time()
        for _ in range(3):
            store.limits.reserve(
                "openai", spacing=0.1, tokens=50, requests_per_minute=600, tokens_per_minute=9000
            )
        store.limits.pause("anthropic", now + 30)
    assert cli_main(["limits", "list", "--store", store_url, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [x["key"] for x in lines] == ["anthropic", "openai"]
    anthropic, openai = lines
    assert anthropic["paused_until"] == pytest.approx(now + 30, abs=1)
    assert (openai["requests_per_minute"], openai["tokens_per_minute"]) == (600, 9000)
    assert (openai["requests_in_window"], openai["tokens_in_window"]) == (3, 150)
    assert openai["paused_until"] is None
    assert (openai["requests_left"], openai["tokens_left"]) == (597, 8850)
    assert anthropic["requests_left"] is None
    assert cli_main(["limits", "list", "--store", store_url]) == 0
    text = capsys.readouterr().out
    assert "openai" in text and "anthropic" in text and "paused" in text


class NamedModel(Counting):
    """A client that holds its model name where the OpenAI clients do (``_create_args``)."""

    def __init__(self) -> None:
        super().__init__(["fine"])
        self._create_args = {"model": "gpt-4o-mini"}


async def test_a_rate_limited_clients_calls_are_recorded_under_the_wrapped_models_name(
    store_url: str,
) -> None:
    model = NamedModel()
    agent = AssistantAgent("A", model_client=model)
    team = team_of(agent, store_url, rate_limits=RateLimit("k", requests_per_minute=60000))
    await team.run(task="go")
    (record,) = team.store.calls.list(team.run_id)
    assert record.name == "gpt-4o-mini", "the fingerprint is the same with or without a rate limit"


async def test_a_team_with_rate_limits_dumps_and_loads_them_without_wrapping_twice(store_url: str) -> None:
    agent = AssistantAgent("A", model_client=ReplayChatCompletionClient(["x"]))
    team = team_of(agent, store_url, rate_limits=[RateLimit("k", requests_per_minute=600)])
    loaded = DurableGraphFlow.load_component(team.dump_component())
    assert loaded._rate_limits == (RateLimit("k", requests_per_minute=600),)
    (participant,) = loaded._participants
    client = participant._model_client  # type: ignore[attr-defined]
    assert isinstance(client, RecordedChatCompletionClient)
    assert isinstance(client.inner, RateLimitedChatCompletionClient)
    assert not isinstance(client.inner.inner, (RateLimitedChatCompletionClient, RecordedChatCompletionClient))


async def test_a_token_correction_the_store_cannot_write_is_logged_and_the_result_goes_on(
    limits_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    client = rate_limited(
        Counting(["kept"], tokens=500), RateLimit("t", tokens_per_minute=1e6), store=limits_store
    )

    def down(*_: Any, **__: Any) -> None:
        raise StoreError("database unreachable (test)")

    limits_store.limits.correct = down  # type: ignore[method-assign]
    result = await client.create([UserMessage(content="hi", source="u")])
    assert result.content == "kept"
    assert "tokens not corrected" in caplog.text


async def test_a_turn_the_store_cannot_give_leaves_the_durable_run_interrupted_not_failed(
    store_url: str,
) -> None:
    agent = assistant([], Ran())
    team = team_of(agent, store_url, rate_limits=RateLimit("k", requests_per_minute=60000))
    error = StoreError("database unreachable (test)")

    def down(*_: Any, **__: Any) -> float:
        raise error

    team.store.limits.reserve = down  # type: ignore[method-assign]
    try:
        with pytest.raises(StoreError) as raised:
            await asyncio.wait_for(team.run(task="go"), 30)
    finally:
        del team.store.limits.reserve
    assert raised.value is error
    assert team.run_info().status == "interrupted"
    await team.run()  # resumed: the store answers again
    assert team.run_info().status == "finished"


async def test_a_stream_waits_its_turn_and_yields_the_wrapped_clients_chunks_and_result(
    limits_store: Store,
) -> None:
    model = ReplayChatCompletionClient(["first answer", "second answer"])
    client = rate_limited(model, RateLimit("s", requests_per_minute=MINUTE / 0.5), store=limits_store)
    began: list[float] = []
    streamed: list[list[str | CreateResult]] = []
    for _ in range(2):
        items = []
        async for item in client.create_stream([UserMessage(content="hi", source="u")]):
            if not items:
                began.append(time.time())
            items.append(item)
        streamed.append(items)
    assert [x[-1].content for x in streamed] == ["first answer", "second answer"]  # type: ignore[union-attr]
    assert "".join(str(c) for c in streamed[0][:-1]).replace(" ", "") == "firstanswer"
    assert began[1] - began[0] >= 0.5 - 0.15
    (state,) = limits_store.limits.list()
    assert state.window_requests == 2


def test_record_calls_leaves_a_rate_limited_client_that_records_inside_as_it_is(store_url: str) -> None:
    limited = rate_limited(recorded(ReplayChatCompletionClient(["x"])), RateLimit("k", 60))
    agent = AssistantAgent("A", model_client=limited)
    team_of(agent, store_url)  # record_calls=True
    assert agent._model_client is limited, "recording twice would give each call two ordinals"
