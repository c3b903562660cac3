"""OpenTelemetry: one ``invoke_workflow`` span per attach, AutoGen's ``invoke_agent`` spans of the
run in its trace with the turn's node/step/attempt, commit events, the ``graphflow_durable.*``
metrics, no message text, and nothing at all under ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``."""

from __future__ import annotations

import gc
import json
import re
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.conditions import TextMentionTermination
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from agents import Scripted, chain, close_stores, durable, failing, hanging, statements
from graphflow_durable import DurableGraphFlow, RetryPolicy, Store, TimeoutPolicy, Worker
from graphflow_durable._runtime.telemetry import Telemetry

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import team as pool_team

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # AutoGen's invoke_agent spans come from the global provider: the test's, set once per process.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
    close_stores()


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def _pipe(
    url: str, run_id: str, reader: InMemoryMetricReader, tracer_provider: trace.TracerProvider
) -> DurableGraphFlow:
    """A two-agent chain named ``pipe``, traced by ``tracer_provider``, metered into ``reader``."""
    a, b = Scripted("a"), Scripted("b")
    return durable(
        [a, b],
        chain(a, b),
        url,
        run_id,
        name="pipe",
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )


def _values(span: ReadableSpan) -> list[str]:
    """Every string the span carries: attribute values and event attribute values."""
    found = [str(v) for v in (span.attributes or {}).values()]
    for event in span.events:
        found += [str(v) for v in (event.attributes or {}).values()]
    return found


async def test_a_run_is_one_workflow_span_with_its_agent_spans_commit_events_and_metrics(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    a, b = Scripted("a"), Scripted("b")
    team = durable(
        [a, b],
        chain(a, b),
        sqlite_url,
        "traced",
        name="pipeline",
        tracer_provider=_PROVIDER,
        meter_provider=meters,
    )
    result = await team.run(task="the secret task text")

    workflow = [s for s in spans.get_finished_spans() if s.name == "invoke_workflow pipeline"]
    assert len(workflow) == 1
    span = workflow[0]
    assert span.kind is SpanKind.INTERNAL
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert attributes["gen_ai.workflow.name"] == "pipeline"
    assert attributes["gen_ai.conversation.id"] == "traced"
    assert attributes["graphflow_durable.run_id"] == "traced"
    assert attributes["graphflow_durable.resumed"] is False
    assert "graphflow_durable.resumed_from_step" not in attributes
    assert attributes["graphflow_durable.status"] == "finished"
    commits = [e for e in span.events if e.name == "graphflow_durable.commit"]
    assert len(commits) >= 2
    assert {"seq", "rows", "bytes", "duration_s"} <= set(commits[0].attributes or {})

    agents = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent ")]
    by_node = {dict(s.attributes or {}).get("graphflow_durable.node"): s for s in agents}
    assert set(by_node) >= {"a", "b"}
    dispatching = {node: step.seq for step in team.history() for node in step.dispatched}
    for node in ("a", "b"):
        agent_attributes = dict(by_node[node].attributes or {})
        assert by_node[node].context.trace_id == span.context.trace_id
        assert agent_attributes["graphflow_durable.attempt"] == 1
        assert agent_attributes["graphflow_durable.step"] == dispatching[node]
        assert agent_attributes["gen_ai.conversation.id"] == "traced"

    # No message text on the package's spans (the task's and the agents' replies).
    texts = ["the secret task text", *(m.content for m in result.messages if isinstance(m.content, str))]
    for value in _values(span):
        assert not any(t in value for t in texts)

    metrics = _metrics(reader)
    assert sum(p.value for p in metrics["graphflow_durable.transitions"]) == len(commits)
    assert sum(p.count for p in metrics["graphflow_durable.commit.duration"]) == len(commits)
    assert [dict(p.attributes) for p in metrics["graphflow_durable.runs"]] == [{"status": "finished"}]


async def test_a_meter_provider_alone_records_the_metrics_a_traced_run_records(
    store_url: str, spans: InMemorySpanExporter
) -> None:
    async def run(run_id: str, tracer_provider: trace.TracerProvider) -> dict[str, list[Any]]:
        reader = InMemoryMetricReader()
        await _pipe(store_url, run_id, reader, tracer_provider).run(task="go")
        return _metrics(reader)

    traced = await run("traced", _PROVIDER)
    spans.clear()
    metered = await run("metered", NoOpTracerProvider())
    assert [s for s in spans.get_finished_spans() if s.name.startswith("invoke_workflow")] == []
    for name in ("graphflow_durable.transitions", "graphflow_durable.runs"):
        assert [(dict(p.attributes), p.value) for p in metered[name]] == [
            (dict(p.attributes), p.value) for p in traced[name]
        ], name
    assert sum(p.value for p in metered["graphflow_durable.transitions"]) >= 2
    assert sum(p.count for p in metered["graphflow_durable.commit.duration"]) == sum(
        p.value for p in metered["graphflow_durable.transitions"]
    )
    assert [dict(p.attributes) for p in metered["graphflow_durable.runs"]] == [{"status": "finished"}]


async def test_an_attach_reads_no_trace_context_nor_end_status_when_nothing_would_record_them(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    async def reads(
        run_id: str, tracer_provider: trace.TracerProvider, meter_provider: Any
    ) -> tuple[int, int, int]:
        """Over two attaches (a new run, then the same run resumed after its termination): the reads
        of the run's stored trace context, of its whole row, and of its round (steps counted)."""
        a, b = Scripted("a"), Scripted("b")
        with Store(sqlite_url) as store, statements(store) as seen:
            team = durable(
                [a, b],
                chain(a, b),
                store,
                run_id,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
            )
            await team.run(task="go")
            await team.run(task="again")
        selects = [" ".join(sql.split()) for sql in seen if sql.startswith("SELECT")]
        return (
            sum(re.match(r"SELECT \w+\.trace_context FROM", sql) is not None for sql in selects),
            sum(
                sql.startswith("SELECT graphflow_runs.run_id, graphflow_runs.graph_fingerprint,")
                for sql in selects
            ),
            sum(sql.startswith("SELECT count(*) AS count_1 FROM graphflow_steps") for sql in selects),
        )

    recorded = await reads("recorded", _PROVIDER, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    quiet = await reads("quiet", NoOpTracerProvider(), NoOpMeterProvider())
    trace_reads, row_reads, round_reads = quiet
    assert recorded == (2, row_reads + 2, 2), (
        recorded,
        quiet,
    )  # per attach: its trace context, its row at its end, its round
    assert trace_reads == round_reads == 0 and row_reads > 0, quiet


async def test_commits_call_no_telemetry_when_nothing_records_and_do_when_a_meter_does(
    sqlite_url: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[int] = []
    committed = Telemetry.committed

    def counting(self: Telemetry, seq: int, *args: Any) -> None:
        told.append(seq)
        committed(self, seq, *args)

    monkeypatch.setattr(Telemetry, "committed", counting)

    async def commits_told(run_id: str, meter_provider: Any) -> int:
        told.clear()
        a, b = Scripted("a"), Scripted("b")
        with Store(sqlite_url) as store:
            team = durable(
                [a, b],
                chain(a, b),
                store,
                run_id,
                tracer_provider=NoOpTracerProvider(),
                meter_provider=meter_provider,
            )
            await team.run(task="go")
        return len(told)

    assert await commits_told("quiet", NoOpMeterProvider()) == 0
    assert await commits_told("metered", MeterProvider(metric_readers=[InMemoryMetricReader()])) >= 2


async def test_a_failed_run_ends_its_workflow_span_in_error_with_the_errors_type_only(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    a, b = Scripted("a"), Scripted("b", before=failing(1))
    team = durable([a, b], chain(a, b), sqlite_url, "broken", name="pipe", tracer_provider=_PROVIDER)
    with pytest.raises(Exception) as raised:
        await team.run(task="go")
    (workflow,) = [s for s in spans.get_finished_spans() if s.name == "invoke_workflow pipe"]
    attributes = dict(workflow.attributes or {})
    assert attributes["graphflow_durable.status"] == "failed"
    assert workflow.status.status_code is StatusCode.ERROR
    assert attributes["error.type"] == workflow.status.description == type(raised.value).__name__
    assert not any("connection reset" in v for v in _values(workflow))


async def test_a_second_attach_joins_the_runs_trace_with_a_link_to_the_first(
    store_url: str, spans: InMemorySpanExporter
) -> None:
    a, b = Scripted("a", says=["STOP"]), Scripted("b")
    team = durable([a, b], chain(a, b), store_url, "twice", TextMentionTermination("STOP"), name="pipe")
    caller = _PROVIDER.get_tracer("test")
    with caller.start_as_current_span("caller") as outer:
        await team.run(task="go")
    second = durable([Scripted("a"), Scripted("b")], chain(a, b), store_url, "twice", name="pipe")
    await second.run()
    first_span, second_span = [s for s in spans.get_finished_spans() if s.name == "invoke_workflow pipe"]
    assert first_span.parent is not None and first_span.parent.span_id == outer.get_span_context().span_id
    assert second_span.context.trace_id == outer.get_span_context().trace_id
    assert second_span.parent is not None and second_span.parent.span_id == outer.get_span_context().span_id
    assert [link.context.span_id for link in second_span.links] == [first_span.context.span_id]


async def test_tracing_disabled_by_autogens_switch_records_nothing(
    sqlite_url: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")
    reader = InMemoryMetricReader()
    await _pipe(sqlite_url, "dark", reader, _PROVIDER).run(task="go")
    ours = [
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("invoke_workflow")
        or any(k.startswith("graphflow_durable.") for k in s.attributes or {})
    ]
    assert ours == []
    assert _metrics(reader) == {}


async def test_a_retried_turn_counts_its_retry_and_the_calls_and_tokens_its_replay_saved(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    from integration.test_recorded_calls import Ran, assistant, team_of

    reader = InMemoryMetricReader()
    agent = assistant([], Ran(), crash_on=2, error=ConnectionError)  # fails once, after two calls
    team = team_of(
        agent,
        sqlite_url,
        retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False),
        tracer_provider=_PROVIDER,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    try:
        await team.run(task="go")
    finally:
        team.store.close()
    metrics = _metrics(reader)
    assert sum(p.value for p in metrics["graphflow_durable.retries"]) == 1
    assert sum(p.value for p in metrics["graphflow_durable.calls.replayed"]) == 4  # two model, two tool
    assert sum(p.value for p in metrics["graphflow_durable.tokens.saved"]) > 0
    (workflow,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_workflow ")]
    names = [e.name for e in workflow.events]
    assert names.count("graphflow_durable.retry") == 1
    assert names.count("graphflow_durable.call_replayed") == 4
    assert dict(workflow.attributes or {})["graphflow_durable.round"] == 1


def test_the_providers_are_not_part_of_the_component_config(sqlite_url: str) -> None:
    a, b = Scripted("a"), Scripted("b")
    team = durable(
        [a, b], chain(a, b), sqlite_url, "config", tracer_provider=_PROVIDER, meter_provider=MeterProvider()
    )
    config = team.dump_component().config
    assert not any("provider" in key for key in config)
    close_stores()


async def test_a_submitted_runs_drive_joins_the_trace_of_the_submit_call(
    store_url: str, spans: InMemorySpanExporter
) -> None:
    a, b = Scripted("a"), Scripted("b")
    team = durable([a, b], chain(a, b), store_url, "submitted", name="pipe")
    with _PROVIDER.get_tracer("test").start_as_current_span("submit") as submit:
        team.store.queue.submit("submitted", task="go", team=None)
    await team.run(task="go")  # as a worker's drive of the claimed run (outside the submit's span)
    (workflow,) = [s for s in spans.get_finished_spans() if s.name == "invoke_workflow pipe"]
    assert workflow.context.trace_id == submit.get_span_context().trace_id
    assert workflow.parent is not None and workflow.parent.span_id == submit.get_span_context().span_id


async def test_agent_spans_go_to_the_teams_own_tracer_provider_tagged_under_the_workflow_span(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    a, b = Scripted("a"), Scripted("b")
    team = durable([a, b], chain(a, b), sqlite_url, "own", name="pipe", tracer_provider=provider)
    await team.run(task="go")
    (workflow,) = [s for s in own.get_finished_spans() if s.name == "invoke_workflow pipe"]
    agents = [s for s in own.get_finished_spans() if s.name.startswith("invoke_agent ")]
    assert sorted(dict(s.attributes or {})["graphflow_durable.node"] for s in agents) == ["a", "b"]
    for agent in agents:
        assert agent.parent is not None and agent.context.trace_id == workflow.context.trace_id
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent ")]


async def test_a_park_and_the_answer_given_later_are_events_in_the_runs_one_trace(
    store_url: str, spans: InMemorySpanExporter
) -> None:
    from integration.test_flow_human_input import one

    first = one(store_url, "parked", human_input="wait", tracer_provider=_PROVIDER)
    waiting = await first.run(task="go")
    assert waiting.stop_reason is not None and waiting.stop_reason.startswith("waiting for input")
    first.store.respond("parked", "the secret answer text")
    second = one(store_url, "parked", human_input="wait", tracer_provider=_PROVIDER)
    await second.run()
    parked, answered = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_workflow ")]
    (park,) = [e for e in parked.events if e.name == "graphflow_durable.park"]
    assert dict(park.attributes or {})["request_ids"] == ("H/3",)
    assert dict(parked.attributes or {})["graphflow_durable.status"] == "waiting"
    (answer,) = [e for e in answered.events if e.name == "graphflow_durable.answer"]
    attributes = dict(answer.attributes or {})
    assert attributes["node"] == "H" and attributes["answered_by"] == "respond"
    assert attributes["request_id"] == "H/3" and attributes["waited_s"] >= 0
    assert answered.context.trace_id == parked.context.trace_id
    assert not any("secret answer" in v for v in _values(answered) + _values(parked))
    close_stores()


async def test_a_timed_out_attempt_is_a_timeout_event_then_a_retry_event(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    agents = [Scripted(n, before=hanging(1) if n == "b" else None) for n in "ab"]
    retry = RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False)
    team = durable(
        agents,
        chain(*agents),
        sqlite_url,
        "slow",
        name="pipe",
        retry=retry,
        timeout=TimeoutPolicy(idle_timeout=0.3),
    )
    await team.run(task="go")
    (workflow,) = [s for s in spans.get_finished_spans() if s.name == "invoke_workflow pipe"]
    events = [
        (e.name, dict(e.attributes or {})) for e in workflow.events if e.name != "graphflow_durable.commit"
    ]
    assert events == [
        ("graphflow_durable.timeout", {"node": "b", "attempt": 1}),
        ("graphflow_durable.retry", {"node": "b", "attempt": 1, "error.type": "NodeTimeoutError"}),
    ]


async def test_a_pool_reports_its_queue_depth_and_the_latency_of_each_claim(store: Store) -> None:
    for i in range(3):
        store.queue.submit(f"r{i}", task=f"task {i}", team="t")
    store.queue.submit("other", task="x", team="not-mine")
    reader = InMemoryMetricReader()
    worker = Worker(
        store, {"t": pool_team}, poll_interval=0.01, meter_provider=MeterProvider(metric_readers=[reader])
    )
    assert [(p.value, dict(p.attributes)) for p in _metrics(reader)["graphflow_durable.queue.depth"]] == [
        (3, {"worker": worker.owner})
    ]
    await worker.run_until_idle()
    metrics = _metrics(reader)
    assert [p.value for p in metrics["graphflow_durable.queue.depth"]] == [0]
    (latency,) = metrics["graphflow_durable.queue.claim.latency"]
    assert latency.count == 3 and latency.min >= 0


async def test_a_pool_records_no_metrics_with_tracing_disabled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")
    store.queue.submit("r", task="task", team="t")
    reader = InMemoryMetricReader()
    worker = Worker(
        store, {"t": pool_team}, poll_interval=0.01, meter_provider=MeterProvider(metric_readers=[reader])
    )
    await worker.run_until_idle()
    assert _metrics(reader) == {}


async def _texts_on_spans(url: str, run_id: str) -> tuple[list[ReadableSpan], list[str]]:
    """Run a -> b with its own exporter: every span, and the task's and the agents' texts."""
    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    a, b = Scripted("a"), Scripted("b")
    team = durable([a, b], chain(a, b), url, run_id, name="pipe", tracer_provider=provider)
    result = await team.run(task="the secret task text")
    replies = [m.to_text() for m in result.messages if m.source in ("a", "b")]
    assert len(replies) == 2
    return list(own.get_finished_spans()), ["the secret task text", *replies]


async def test_no_span_or_event_carries_message_text_by_default(
    sqlite_url: str, spans: InMemorySpanExporter
) -> None:
    recorded, texts = await _texts_on_spans(sqlite_url, "quiet")
    assert {s.name for s in recorded} >= {"invoke_workflow pipe", "invoke_agent a", "invoke_agent b"}
    # The package's spans and the ones it tags; AutoGen's runtime spans ("autogen process ...", on
    # the global provider) carry message payloads: AutoGen's business (its switch turns them off).
    for span in [*recorded, *spans.get_finished_spans()]:
        if span.name.startswith(("invoke_workflow ", "invoke_agent ")):
            assert not [v for v in _values(span) if any(t in v for t in texts)], span.name


async def test_message_content_is_on_the_spans_when_the_genai_opt_in_is_set(
    sqlite_url: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    recorded, (task, a_said, b_said) = await _texts_on_spans(sqlite_url, "loud")
    by_name = {s.name: dict(s.attributes or {}) for s in recorded}
    assert json.loads(str(by_name["invoke_workflow pipe"]["gen_ai.input.messages"])) == [
        {"role": "user", "name": "user", "parts": [{"type": "text", "content": task}]}
    ]
    (a_output,) = json.loads(str(by_name["invoke_agent a"]["gen_ai.output.messages"]))
    assert a_output["parts"] == [{"type": "text", "content": a_said}] and a_output["name"] == "a"
    assert b_said in str(by_name["invoke_agent b"]["gen_ai.output.messages"])


def test_a_meter_provider_does_not_keep_a_dropped_worker_alive(sqlite_url: str) -> None:
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    worker = Worker(sqlite_url, {"t": pool_team}, meter_provider=meters)
    worker.store.close()
    dropped = weakref.ref(worker)
    del worker
    gc.collect()
    assert dropped() is None


async def test_a_pool_reports_each_queues_queued_and_active_runs_and_its_throttled_claims(
    store: Store,
) -> None:
    store.queue.configure("support", concurrency=1)
    for i in range(3):
        store.queue.submit(f"case-{i}", task=f"case {i}", team="t", queue="support")
    taken = store.queue.claim("another-worker", lease_seconds=60)  # holds the queue's one slot
    assert taken is not None
    reader = InMemoryMetricReader()
    worker = Worker(
        store, {"t": pool_team}, poll_interval=0.01, meter_provider=MeterProvider(metric_readers=[reader])
    )
    await worker.run_until_idle()  # nothing to take: the queue is at its cap
    metrics = _metrics(reader)
    assert [(p.value, dict(p.attributes)) for p in metrics["graphflow_durable.queue.queued"]] == [
        (2, {"queue": "support"})
    ]
    assert [p.value for p in metrics["graphflow_durable.queue.active"]] == [1]
    (throttled,) = metrics["graphflow_durable.queue.throttled"]
    assert throttled.value >= 1
    assert dict(throttled.attributes) == {"worker": worker.owner, "queue": "support", "reason": "concurrency"}
