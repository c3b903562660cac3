"""What a durable run records for OpenTelemetry, through ``opentelemetry-api`` only: one span
``invoke_workflow {team}`` per attach, one trace per run across processes (the run's stored trace
context), events per commit, the attributes on AutoGen's ``invoke_agent`` span of a turn, and the
``graphflow_durable.*`` metrics. No message text is recorded. ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``
(AutoGen's own switch) turns all of it off. Telemetry never changes a run's outcome: an exception
from a tracing or metrics call (a span processor, a view, an exporter run inline) is logged once at
WARNING and the run goes on (:class:`_Contained`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, NoOpMeterProvider, Observation
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from graphflow_durable.context import ExecutionContext

try:  # what metrics.get_meter_provider() returns while no provider is set (not public API)
    from opentelemetry.metrics._internal import _ProxyMeterProvider
except ImportError:  # pragma: no cover - another API version: a proxy then meters as any provider
    _ProxyMeterProvider = NoOpMeterProvider  # type: ignore[assignment, misc]

__all__ = [
    "CONTENT_ENV",
    "DISABLE_ENV",
    "PoolMetrics",
    "Telemetry",
    "agent_span",
    "record_output",
    "tracing_disabled",
]

logger = logging.getLogger(__name__)

#: AutoGen's switch for its runtime's tracing; it turns off everything this package records too.
DISABLE_ENV = "AUTOGEN_DISABLE_RUNTIME_TRACING"
#: The GenAI semantic conventions' opt-in to message content on spans: off unless ``true``.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_NS = "graphflow_durable"
_SCOPE = "graphflow_durable"
_PROPAGATOR = TraceContextTextMapPropagator()
_WARNED: set[str] = set()  # what raised already (logged at WARNING once per process)


class _Contained:
    """``with`` it around a tracing or metrics call the package makes (``what``: the call): an
    exception from it is logged, at WARNING the first time per process and at DEBUG after, and goes
    no further (the run goes on as if nothing was recorded). One object per kind of call, reused."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> bool:
        if not isinstance(error, Exception):
            return False
        first = self.what not in _WARNED
        _WARNED.add(self.what)
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "OpenTelemetry: %s raised %s: %s; the run goes on without it%s",
            self.what,
            type(error).__name__,
            error,
            " (logged once)" if first else "",
        )
        return True


_STARTING = _Contained("starting the workflow span")
_AGENT_SPAN = _Contained("starting an agent span")
_SPAN_CALL = _Contained("a span call")
_METRICS = _Contained("a metrics call")
_ENDING = _Contained("ending a span")


def tracing_disabled() -> bool:
    """Whether ``AUTOGEN_DISABLE_RUNTIME_TRACING`` is ``true`` (read at each attach)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() == "true"


def _capture_content() -> bool:
    return os.environ.get(CONTENT_ENV, "").strip().lower() == "true"


def _messages(role: str, messages: Sequence[Any]) -> str:
    """Messages as the GenAI conventions' ``gen_ai.*.messages`` JSON (text parts only)."""
    return json.dumps(
        [
            {"role": role, "name": m.source, "parts": [{"type": "text", "content": m.to_text()}]}
            for m in messages
        ]
    )


def _carrier(ctx: otel_context.Context) -> str | None:
    """The W3C ``traceparent`` of ``ctx``'s span, ``None`` when it has no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get("traceparent")


def _extract(traceparent: object) -> otel_context.Context | None:
    """The context of a stored ``traceparent``; ``None`` for anything that is not a valid one (a
    number, a list, a malformed string: the stored context is telemetry, never trusted)."""
    if not isinstance(traceparent, str) or not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})  # a malformed one: no valid span
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _stored(text: str | None) -> Mapping[str, Any]:
    """A run's stored trace context (JSON ``{"root", "last"}``) as a mapping; empty when it is
    missing or unreadable (not JSON, not an object): the attach then starts the run's trace afresh."""
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return loaded if isinstance(loaded, Mapping) else {}


class Telemetry:
    """A team's tracer and meter (given, else the global ones) and the span of its current attach.

    ``tracer_provider`` and ``meter_provider`` are as AutoGen's runtime takes them; they are not
    part of the team's component config (objects, not data).
    """

    def __init__(
        self, tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.span: Span | None = None
        self._instruments: dict[str, Any] | None = None  # this attach's, None: it meters nothing
        self._meter_of: MeterProvider | None = None  # the provider ``_made``'s instruments are on
        self._made: dict[str, Any] = {}
        self._pending: str | None = None  # the trace context to store on the run (JSON), once
        # Whether the current attach's commits are told (:meth:`committed`): its span records or it
        # meters. Decided once per attach, so that a commit with neither does not call in here.
        self.watching = False

    @property
    def enabled(self) -> bool:
        """Whether the current attach's span records (its events and attributes are kept)."""
        return self.span is not None and self.span.is_recording()

    @property
    def metering(self) -> bool:
        """Whether the current attach records metrics: on when its meter provider keeps them
        (see :meth:`_meter`), whether or not its span records (a meter provider alone is enough)."""
        return self._instruments is not None

    def _meter(self) -> dict[str, Any] | None:
        """The instruments on the team's meter provider (else the global one), made once per
        provider; ``None`` under ``AUTOGEN_DISABLE_RUNTIME_TRACING=true`` or when the provider keeps
        nothing (a no-op one; the global one while none is set: a provider set later meters from
        the next attach on)."""
        if tracing_disabled():
            return None
        provider = self.meter_provider or metrics.get_meter_provider()
        if isinstance(provider, _ProxyMeterProvider):
            provider = metrics.get_meter_provider()  # the global one, if set since
        if isinstance(provider, (NoOpMeterProvider, _ProxyMeterProvider)):
            # Nothing would keep a measurement: no instruments, so that neither the commits nor the
            # end of the attach (which reads the run's status for the count) do work for nothing.
            return None
        if self._meter_of is not provider:
            meter = provider.get_meter(_SCOPE)
            self._meter_of = provider
            self._made = {
                "commit": meter.create_histogram(
                    f"{_NS}.commit.duration", unit="s", description="Time to commit one transition"
                ),
                "transitions": meter.create_counter(
                    f"{_NS}.transitions", description="Transitions committed"
                ),
                "runs": meter.create_counter(f"{_NS}.runs", description="Attaches of runs, by status"),
                "takeovers": meter.create_counter(
                    f"{_NS}.lease.takeovers", description="Runs resumed after their driver died"
                ),
                "retries": meter.create_counter(f"{_NS}.retries", description="Failed attempts retried"),
                "replayed": meter.create_counter(
                    f"{_NS}.calls.replayed", description="Recorded calls replayed instead of made"
                ),
                "tokens": meter.create_counter(
                    f"{_NS}.tokens.saved", description="Model tokens not paid for again (replayed calls)"
                ),
                "rate_waits": meter.create_counter(
                    f"{_NS}.rate_limit.waits", description="Model calls that waited for a rate limit"
                ),
                "rate_wait": meter.create_histogram(
                    f"{_NS}.rate_limit.wait", unit="s", description="Time model calls waited for a rate limit"
                ),
            }
        return self._made

    def may_record(self) -> bool:
        """Whether a span started now could record: ``False`` under
        ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``, for a no-op tracer provider, or for the global one
        while none is set. When it is ``False`` the attach does not read the run's stored trace
        context, which only a recording span uses."""
        if tracing_disabled():
            return False
        provider = self.tracer_provider or trace.get_tracer_provider()
        if isinstance(provider, ProxyTracerProvider):
            provider = trace.get_tracer_provider()  # the global one, if set since
        return not isinstance(provider, (NoOpTracerProvider, ProxyTracerProvider))

    def begin(
        self,
        team_name: str,
        run_id: str,
        *,
        stored: str | None,
        start_ns: int,
        resumed_from_step: int | None,
        took_over: bool,
    ) -> None:
        """Start the attach's span (from ``start_ns``): a child of the run's stored trace context
        (``stored``, JSON ``{"root", "last"}``) linked to the last attach's span; on the first
        attach, a child of the caller's current span, whose context (else the span's own) becomes
        the run's. A stored context that is unreadable or holds no valid ``traceparent`` starts the
        run's trace afresh."""
        self._pending, self._instruments = None, None  # the span: None since the last attach's end
        started = False
        with _STARTING:
            self._start(team_name, run_id, _stored(stored), start_ns, resumed_from_step)
            started = True
        if not started:  # the attach records no span; the run goes on
            span, self.span, self._pending = self.span, None, None
            if span is not None:
                _end(span)
        with _METRICS:
            self._instruments = self._meter()  # once per attach: the commits' path looks up nothing
            if took_over and self._instruments is not None:
                self._instruments["takeovers"].add(1)
        self.watching = self._instruments is not None or self.enabled

    def _start(
        self,
        team_name: str,
        run_id: str,
        saved: Mapping[str, Any],
        start_ns: int,
        resumed_from_step: int | None,
    ) -> None:
        provider: TracerProvider = (
            NoOpTracerProvider()
            if tracing_disabled()
            else self.tracer_provider or trace.get_tracer_provider()
        )
        tracer = provider.get_tracer(_SCOPE)
        root = _extract(saved.get("root"))
        last = _extract(saved.get("last"))
        links = [] if last is None else [Link(trace.get_current_span(last).get_span_context())]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": team_name,
            "gen_ai.conversation.id": run_id,
            f"{_NS}.run_id": run_id,
            f"{_NS}.resumed": resumed_from_step is not None,
        }
        if resumed_from_step is not None:
            attributes[f"{_NS}.resumed_from_step"] = resumed_from_step
        caller = otel_context.get_current()
        self.span = tracer.start_span(
            f"invoke_workflow {team_name}",
            context=root if root is not None else caller,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=start_ns,
        )
        if self.span.is_recording():
            own = _carrier(trace.set_span_in_context(self.span))
            first = saved.get("root") if root is not None else (_carrier(caller) or own)
            self._pending = json.dumps({"root": first, "last": own})

    def agent_tracer(self) -> Tracer:
        """The tracer of AutoGen's ``invoke_agent`` spans of the team's turns: AutoGen's scope on the
        team's provider, so that they reach the exporter the workflow span reaches (the global
        provider's, or with tracing off, AutoGen's own default). Taken once per attach: the
        global one is a proxy that follows a provider set later, as AutoGen's per-turn look-up does."""
        if self.tracer_provider is not None and not tracing_disabled():
            with _AGENT_SPAN:
                return self.tracer_provider.get_tracer("autogen-core")
        return trace.get_tracer("autogen-core")  # also when getting the team's raised

    def task(self, messages: Sequence[Any]) -> None:
        """The attach's task messages: ``gen_ai.input.messages`` on its span, only when message
        content is opted in (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``)."""
        if self.enabled and messages and _capture_content():
            assert self.span is not None
            with _SPAN_CALL:
                self.span.set_attribute("gen_ai.input.messages", _messages("user", messages))

    def take_pending(self) -> str | None:
        """The trace context to store on the run once this attach has committed (then ``None``)."""
        pending, self._pending = self._pending, None
        return pending

    def context(self) -> contextvars.Context:
        """A copy of the current context with the attach's span current: the tasks that run the
        team are created in it, so AutoGen's spans of the run sit in the workflow span's trace.
        Recording nothing, the current context as it is (AutoGen's spans keep the caller's)."""
        if self.span is None or not self.span.is_recording():
            return contextvars.copy_context()
        token = otel_context.attach(trace.set_span_in_context(self.span))
        try:
            return contextvars.copy_context()
        finally:
            otel_context.detach(token)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the attach's span (attributes: numbers and names, never message text)."""
        if self.span is not None:
            with _SPAN_CALL:
                self.span.add_event(f"{_NS}.{name}", dict(attributes))

    def committed(self, seq: int, rows: int, size: Callable[[], int], seconds: float) -> None:
        """A transition committed at ``seq``: the commit duration and the count, and an event with
        the bytes of its messages (``size``, called only when the span records)."""
        instruments = self._instruments
        if instruments is not None:
            with _METRICS:
                instruments["commit"].record(seconds)
                instruments["transitions"].add(1)
        if self.enabled:
            self.event("commit", {"seq": seq, "rows": rows, "bytes": size(), "duration_s": seconds})

    def replayed(self, tokens: int) -> None:
        """A recorded call replayed instead of made (``tokens`` its model tokens, 0 for a tool)."""
        instruments = self._instruments
        if instruments is not None:
            with _METRICS:
                instruments["replayed"].add(1)
                instruments["tokens"].add(tokens)
        if self.enabled:
            self.event("call_replayed", {"tokens_saved": tokens})

    def rate_limit_waited(self, key: str, seconds: float) -> None:
        """A model call waited ``seconds`` for its turn of rate limit ``key`` (attribute ``key``)."""
        instruments = self._instruments
        if instruments is not None:
            with _METRICS:
                instruments["rate_waits"].add(1, {"key": key})
                instruments["rate_wait"].record(seconds, {"key": key})
        if self.enabled:
            self.event("rate_limit_wait", {"key": key, "seconds": seconds})

    def attempt_failed(self, node: str, attempt: int, error_type: str, retried: bool) -> None:
        """An attempt of ``node``'s turn failed (a ``timeout`` event when it timed out); ``retried``:
        it runs again (a ``retry`` event, counted)."""
        if retried and self._instruments is not None:
            with _METRICS:
                self._instruments["retries"].add(1)
        if not self.enabled:
            return
        if error_type == "NodeTimeoutError":
            self.event("timeout", {"node": node, "attempt": attempt})
        if retried:
            self.event("retry", {"node": node, "attempt": attempt, "error.type": error_type})

    def answered(self, node: str, request_id: str, by: str | None, waited: float | None) -> None:
        """A turn takes the answer to ``request_id`` (``by``: respond, inline or default; ``waited``:
        seconds from the question to the answer): an ``answer`` event."""
        attributes: dict[str, Any] = {"node": node, "request_id": request_id, "answered_by": by or ""}
        if waited is not None:
            attributes["waited_s"] = round(waited, 3)
        self.event("answer", attributes)

    def round(self, number: int) -> None:
        """The run's round at the end of the attach (``graphflow_durable.round``)."""
        if self.span is not None:
            with _SPAN_CALL:
                self.span.set_attribute(f"{_NS}.round", number)

    def lease_lost(self) -> None:
        """The lease was lost: another driver holds the run."""
        self.event("lease_lost", {})

    def end(self, status: str, error: BaseException | None = None) -> None:
        """End the attach's span with the run's ``status`` (a failed run: span status ERROR and
        ``error.type``, ``error``'s type; never its message, which may quote a model's text); count
        the attach by status."""
        span, self.span = self.span, None
        instruments, self._instruments = self._instruments, None
        self.watching = False
        if instruments is not None:
            with _METRICS:
                instruments["runs"].add(1, {"status": status})
        if span is None:
            return
        with _SPAN_CALL:
            if span.is_recording():
                span.set_attribute(f"{_NS}.status", status)
                if status == "failed":
                    _failed(span, "_OTHER" if error is None else type(error).__name__)
        _end(span)


def _failed(span: Span, error_type: str) -> None:
    """A span ends in error: status ERROR described by ``error_type`` alone, and ``error.type``."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))


def _end(span: Span) -> None:
    """End ``span``; a span processor's ``on_end`` (an exporter run inline) that raises is logged."""
    with _ENDING:
        span.end()


@contextmanager
def agent_span(
    tracer: Tracer | None, name: str, description: str, agent_id: str, execution: ExecutionContext | None
) -> Iterator[Span | None]:
    """AutoGen's ``invoke_agent {name}`` span around an attempt of a turn (the attributes of
    AutoGen's ``trace_invoke_agent_span``, on ``tracer``, else AutoGen's scope on the global
    provider), given the turn's node, step, attempt and run. An attempt that raises ends it with
    status ERROR and ``error.type`` (the exception's type); its message and traceback (an
    ``exception`` event) only when message content is opted in. A tracing call that raises is
    logged, never the attempt's outcome. Yields the span when it records, else ``None`` (the
    usual case with no SDK: the turn then tags and records nothing on it)."""
    tracer = tracer or trace.get_tracer("autogen-core")
    span: Span = trace.INVALID_SPAN  # if starting it raises: the turn runs under no span
    with _AGENT_SPAN:
        span = tracer.start_span(
            f"invoke_agent {name}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.system": "autogen",
                "gen_ai.agent.name": name,
                "gen_ai.agent.id": agent_id,
                "gen_ai.agent.description": description,
            },
        )
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        if span.is_recording():
            _tag(span, execution)
            yield span
        else:
            yield None
    except Exception as error:
        with _SPAN_CALL:
            if span.is_recording():
                _failed(span, type(error).__name__)
                if _capture_content():
                    span.record_exception(error)
        raise
    finally:
        otel_context.detach(token)
        _end(span)


def _tag(span: Span, execution: ExecutionContext | None) -> None:
    """Give the recording ``invoke_agent`` span of a turn the turn's node, step, attempt and run."""
    if execution is None or tracing_disabled():
        return
    with _SPAN_CALL:
        span.set_attributes(
            {
                f"{_NS}.node": execution.node,
                f"{_NS}.step": execution.step,
                f"{_NS}.attempt": execution.attempt,
                "gen_ai.conversation.id": execution.run_id,
            }
        )


def record_output(span: Span, message: Any) -> None:
    """A turn's answer (an AutoGen chat message): ``gen_ai.output.messages`` on the turn's recording
    ``invoke_agent`` span (what :func:`agent_span` yielded), only when message content is opted in."""
    if not tracing_disabled() and _capture_content():
        with _SPAN_CALL:
            span.set_attribute("gen_ai.output.messages", _messages("assistant", [message]))


class PoolMetrics:
    """A worker's metrics: ``graphflow_durable.queue.claim.latency`` (histogram, seconds from when
    an item became claimable to its claim) and ``graphflow_durable.queue.depth`` (observable gauge:
    the items claimable now, counted by ``depth`` only when a reader collects, until the worker
    closes its store; attribute ``worker``). Nothing under ``AUTOGEN_DISABLE_RUNTIME_TRACING=true``."""

    def __init__(
        self,
        provider: MeterProvider | None,
        worker: str,
        depth: Callable[[], int | None],
        queues: Callable[[], list[dict[str, Any]] | None] | None = None,
    ) -> None:
        self._worker = {"worker": worker}
        # Weakly: the meter provider keeps the gauge's callback (so this object) for good, and a
        # worker (its store) must not live as long as a global provider does.
        self._depth = weakref.WeakMethod(depth) if inspect.ismethod(depth) else lambda: depth
        self._queues = (
            None
            if queues is None
            else weakref.WeakMethod(queues)
            if inspect.ismethod(queues)
            else lambda: queues
        )
        self._stats: tuple[float, list[dict[str, Any]]] | None = None  # one count per collection
        self.running = True  # False once the worker closed its store: the gauge reports nothing
        self._latency = None
        self._throttled = None
        if tracing_disabled():
            return
        with _METRICS:
            meter = (provider or metrics.get_meter_provider()).get_meter(_SCOPE)
            self._latency = meter.create_histogram(
                f"{_NS}.queue.claim.latency", unit="s", description="From claimable to claimed"
            )
            meter.create_observable_gauge(
                f"{_NS}.queue.depth", callbacks=[self._observe], description="Items claimable now"
            )
            self._throttled = meter.create_counter(
                f"{_NS}.queue.throttled",
                description="Claims that found nothing while a queue or partition was at a cap",
            )
            for name, key in (("queued", "queued"), ("active", "active")):
                meter.create_observable_gauge(
                    f"{_NS}.queue.{name}",
                    callbacks=[functools.partial(self._observe_queues, key)],
                    description=f"Runs per named queue: {name}",
                )

    def throttled(self, queue: str, why: str) -> None:
        """A claim found nothing while ``queue`` was held back (``why``: at a cap, partition busy, rate)."""
        if self._throttled is not None and not tracing_disabled():
            reason = (
                "partition" if why.startswith("partition") else "rate" if "rate" in why else "concurrency"
            )
            with _METRICS:
                self._throttled.add(1, {**self._worker, "queue": queue, "reason": reason})

    def _observe_queues(self, key: str, options: CallbackOptions) -> Iterable[Observation]:
        if not self.running or tracing_disabled() or self._queues is None:
            return []
        now = time.monotonic()
        if self._stats is None or now - self._stats[0] > 1.0:
            count = self._queues()
            found = None if count is None else count()
            if found is None:
                return []
            self._stats = (now, found)
        return [Observation(int(row[key]), {"queue": row["queue"]}) for row in self._stats[1]]

    def claimed(self, claimable_since: float | None) -> None:
        """A worker claimed an item claimable since ``claimable_since`` (epoch seconds)."""
        if self._latency is not None and claimable_since is not None and not tracing_disabled():
            with _METRICS:
                self._latency.record(max(time.time() - claimable_since, 0.0), self._worker)

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.running or tracing_disabled():
            return []
        depth = self._depth()
        found = None if depth is None else depth()
        return [] if found is None else [Observation(found, self._worker)]
