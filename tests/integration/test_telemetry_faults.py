"""Telemetry never changes a run's outcome, on a real OpenTelemetry SDK: a run's stored trace
context that holds no valid ``traceparent`` starts a new trace, a span processor or a metrics view
that raises is logged once and ignored, an attempt's exception text stays off the ``invoke_agent`` span unless
message content is opted in; and an attach that fails once the run's lease is its own gives the
lease up."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import ExemplarReservoir, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agents import Scripted, chain, close_stores, durable, failing
from graphflow_durable import RetryPolicy, Store, Worker
from graphflow_durable._runtime import telemetry
from graphflow_durable.errors import StoreCorruptError

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import team as pool_team


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    yield found
    close_stores()


def _provider(exporter: InMemorySpanExporter, *processors: SpanProcessor) -> TracerProvider:
    provider = TracerProvider()
    for processor in processors:
        provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _workflow(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "invoke_workflow pipe"]


def _set_trace_context(url: str, run_id: str, value: str) -> None:
    with Store(url) as store, store._e.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE graphflow_runs SET trace_context = :v WHERE run_id = :r"),
            {"v": value, "r": run_id},
        )


def _lease_owner(url: str, run_id: str) -> str | None:
    with Store(url) as store:
        run = store.get_run(run_id)
        assert run is not None
        return run.lease_owner


@pytest.mark.parametrize(
    "stored",
    [
        '{"root": 5}',
        '{"root": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"], "last": {"x": 1}}',
        '{"root": "not a traceparent", "last": 7}',
        "[1, 2]",
        "not json",
    ],
)
async def test_a_stored_trace_context_without_a_valid_traceparent_starts_a_new_trace(
    store_url: str, exporter: InMemorySpanExporter, stored: str
) -> None:
    provider = _provider(exporter)
    a, b = Scripted("a", says=["STOP"]), Scripted("b")
    first = durable(
        [a, b], chain(a, b), store_url, "bad-trace", name="pipe", tracer_provider=provider, max_turns=1
    )
    await first.run(task="go")
    _set_trace_context(store_url, "bad-trace", stored)

    again = durable(
        [Scripted("a"), Scripted("b")],
        chain(a, b),
        store_url,
        "bad-trace",
        name="pipe",
        tracer_provider=provider,
    )
    result = await again.run()

    assert result.stop_reason is not None
    run = again.store.get_run("bad-trace")
    assert run is not None and run.status == "finished" and run.lease_owner is None
    _, resumed = _workflow(exporter)
    assert resumed.parent is None and list(resumed.links) == []  # a new trace, as for no context
    assert dict(resumed.attributes or {})["graphflow_durable.status"] == "finished"
    # The new trace is the run's from now on: its own span is the stored root.
    saved = json.loads(again.store._driver.trace_context("bad-trace") or "{}")
    assert (
        saved["root"] == saved["last"] and saved["root"].split("-")[1] == f"{resumed.context.trace_id:032x}"
    )


async def test_an_attach_that_fails_after_taking_the_lease_gives_the_lease_up(
    store_url: str, exporter: InMemorySpanExporter
) -> None:
    a, b = Scripted("a"), Scripted("b")
    first = durable([a, b], chain(a, b), store_url, "damaged", name="pipe", max_turns=1)
    await first.run(task="go")
    with Store(store_url) as store, store._e.engine.begin() as conn:
        conn.execute(sa.text("UPDATE graphflow_agent_states SET body = '{\"turn\": 99}'"))

    # A new team object restores the agents' stored states once the lease is its own: they are damaged.
    again = durable([Scripted("a"), Scripted("b")], chain(a, b), store_url, "damaged", name="pipe")
    with pytest.raises(StoreCorruptError):
        await again.run()

    assert _lease_owner(store_url, "damaged") is None


class _Abort(BaseException):
    """Not an ``Exception`` (as ``KeyboardInterrupt`` is not): nothing contains it."""


class _Aborting(SpanProcessor):
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        raise _Abort("stop now")


async def test_an_attach_interrupted_as_its_workflow_span_starts_gives_the_lease_up(
    store_url: str, exporter: InMemorySpanExporter
) -> None:
    a, b = Scripted("a"), Scripted("b")
    first = durable([a, b], chain(a, b), store_url, "aborted", name="pipe", max_turns=1)
    await first.run(task="go")

    provider = _provider(exporter, _Aborting())
    again = durable(
        [Scripted("a"), Scripted("b")], chain(a, b), store_url, "aborted", tracer_provider=provider
    )
    with pytest.raises(_Abort):
        await again.run()

    assert _lease_owner(store_url, "aborted") is None
    resumed = durable([Scripted("a"), Scripted("b")], chain(a, b), store_url, "aborted", lease_seconds=600)
    result = await resumed.run()  # at once: no lease left to expire
    assert result.messages[-1].source == "b"


class _Raising(SpanProcessor):
    """A span processor whose ``on_start`` or ``on_end`` raises, as a broken exporter run inline."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.where == "on_start":
            raise RuntimeError("the span processor is broken")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "on_end":
            raise RuntimeError("the span processor is broken")


@pytest.mark.parametrize("where", ["on_start", "on_end"])
async def test_a_span_processor_that_raises_changes_nothing_in_the_run_and_is_logged_once(
    store_url: str,
    exporter: InMemorySpanExporter,
    where: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry, "_WARNED", set())
    provider = _provider(exporter, _Raising(where))
    caplog.set_level(logging.DEBUG, logger="graphflow_durable")
    for run_id in ("broken-1", "broken-2"):
        a, b = Scripted("a"), Scripted("b")
        team = durable([a, b], chain(a, b), store_url, run_id, name="pipe", tracer_provider=provider)
        result = await team.run(task="go")
        assert [m.source for m in result.messages] == ["user", "a", "b"]
        run = team.store.get_run(run_id)
        assert run is not None and run.status == "finished" and run.lease_owner is None

    ours = [r for r in caplog.records if r.name == "graphflow_durable._runtime.telemetry"]
    warnings = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    # One WARNING per kind of call (the workflow span, the agent spans), however many spans raised.
    assert warnings and len(warnings) == len(set(warnings)) <= 2, warnings
    assert all("the span processor is broken" in w and "logged once" in w for w in warnings)
    assert len(ours) > len(warnings)  # the later ones at DEBUG
    assert all(r.exc_info is None for r in ours)


@pytest.mark.parametrize("opted_in", [False, True])
async def test_a_failed_attempts_agent_span_names_the_error_type_and_its_text_only_when_opted_in(
    store_url: str, exporter: InMemorySpanExporter, opted_in: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if opted_in:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    provider = _provider(exporter)
    a, b = Scripted("a"), Scripted("b", before=failing(1, ValueError))
    team = durable([a, b], chain(a, b), store_url, "failing", name="pipe", tracer_provider=provider)
    with pytest.raises(Exception):  # noqa: B017 - GraphFlow's RuntimeError for a failed agent
        await team.run(task="go")

    (span,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent b"]
    attributes = dict(span.attributes or {})
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == attributes["error.type"] == "ValueError"
    assert attributes["graphflow_durable.node"] == "b"
    texts = [str(v) for v in attributes.values()]
    texts += [str(v) for e in span.events for v in (e.attributes or {}).values()]
    carried = [t for t in texts if "connection reset by peer" in t]
    if opted_in:
        (event,) = span.events
        assert event.name == "exception"
        assert dict(event.attributes or {})["exception.message"] == "b: connection reset by peer"
    else:
        assert carried == [] and list(span.events) == []


def _broken_reservoir(aggregation: type) -> Callable[[dict[str, Any]], ExemplarReservoir]:
    raise RuntimeError("the metrics view is broken")


async def test_a_meter_provider_that_raises_changes_nothing_in_the_run_and_is_logged_once(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK view whose exemplar reservoir cannot be made: every measurement raises."""
    monkeypatch.setattr(telemetry, "_WARNED", set())
    caplog.set_level(logging.DEBUG, logger="graphflow_durable")
    meters = MeterProvider(
        metric_readers=[InMemoryMetricReader()],
        views=[View(instrument_name="*", exemplar_reservoir_factory=_broken_reservoir)],
    )
    a, b = Scripted("a"), Scripted("b", before=failing(1))
    retry = RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False)
    team = durable([a, b], chain(a, b), store_url, "metered", name="pipe", meter_provider=meters, retry=retry)
    result = await team.run(task="go")

    assert [m.source for m in result.messages] == ["user", "a", "b", "b"]  # b's retry event, its answer
    run = team.store.get_run("metered")
    assert run is not None and run.status == "finished" and run.lease_owner is None
    ours = [r for r in caplog.records if r.name == "graphflow_durable._runtime.telemetry"]
    warnings = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 1 and "a metrics call raised RuntimeError: the metrics view is broken" in warnings[0]
    )
    assert len(ours) > 1  # the commits', the retry's and the end's measurements: DEBUG after the first


async def test_a_pool_whose_meter_provider_raises_drives_its_runs_as_any_pool(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(telemetry, "_WARNED", set())
    monkeypatch.setenv("GFD_AGENT_DELAY", "0")
    for i in range(2):
        store.queue.submit(f"r{i}", task=f"task {i}", team="t")
    meters = MeterProvider(
        metric_readers=[InMemoryMetricReader()],
        views=[View(instrument_name="*", exemplar_reservoir_factory=_broken_reservoir)],
    )
    worker = Worker(store, {"t": pool_team}, poll_interval=0.01, meter_provider=meters)
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["finished", "finished"]
    warnings = [r for r in caplog.records if r.name.endswith(".telemetry") and r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
