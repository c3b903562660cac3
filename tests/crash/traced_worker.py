"""The crash worker (tests/crash/worker.py) with an OpenTelemetry SDK tracer that writes each span,
as it starts and as it ends, to the JSON-lines file named by ``$GFD_SPAN_LOG`` (a SIGKILLed
process's open spans are in it too).

Usage: ``python tests/crash/traced_worker.py STORE_URL RUN_ID [KILL]`` (as worker.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker


class SpanLog(SpanProcessor):
    """Each span's name, ids, parent, links and attributes, flushed as it starts and ends."""

    def __init__(self, path: str) -> None:
        self._file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115  # open for the process

    def _write(self, phase: str, span: ReadableSpan) -> None:
        context = span.get_span_context()
        assert context is not None
        row: dict[str, Any] = {
            "phase": phase,
            "pid": os.getpid(),
            "name": span.name,
            "trace_id": context.trace_id,
            "span_id": context.span_id,
            "parent": None if span.parent is None else span.parent.span_id,
            "links": [link.context.span_id for link in span.links],
            "attributes": {
                k: v for k, v in (span.attributes or {}).items() if isinstance(v, (str, int, bool))
            },
        }
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self._write("start", span)

    def on_end(self, span: ReadableSpan) -> None:
        self._write("end", span)


def log_metrics(path: str, reader: InMemoryMetricReader) -> None:
    """The process's metric totals (sums of each metric's points), one JSON line."""
    data = reader.get_metrics_data()
    totals: dict[str, float] = {}
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    totals[metric.name] = totals.get(metric.name, 0) + getattr(point, "value", 0)
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(json.dumps({"phase": "metrics", "pid": os.getpid(), "totals": totals}) + "\n")


if __name__ == "__main__":
    path = os.environ["GFD_SPAN_LOG"]
    provider = TracerProvider()
    provider.add_span_processor(SpanLog(path))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    code = asyncio.run(worker.main(sys.argv[1:]))
    log_metrics(path, reader)
    sys.exit(code)
