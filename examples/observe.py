"""Observe a run: a worker process drives it, this process follows it, then prints its trace.

Run it with no API key and no collector (SQLite in a temporary directory; needs the OpenTelemetry
SDK: ``pip install 'graphflow-durable[otel]'``):

    python examples/observe.py

What happens:
1. Inside a span ``submit``, this process submits a run (its trace context is stored with it).
2. A worker process (``observe.py --worker``) claims and drives the run (the team of
   ``worker_pool.py``: plan -> research, critique -> write), its spans going to an in-memory
   exporter. Meanwhile this process follows the run with ``attach_stream`` (read-only, from the
   store; ``graphflow-durable runs follow RUN`` does the same from a shell) and prints each message
   as its commit lands, then the round's result.
3. The worker hands its spans back (as JSON on its stdout) and this process prints the trace
   tree: the worker's ``invoke_workflow`` span is a child of ``submit``, one trace, with AutoGen's
   ``invoke_agent`` spans tagged with the node, the step that dispatched the turn and the attempt.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:
    sys.exit("examples/observe.py needs the OpenTelemetry SDK: pip install 'graphflow-durable[otel]'")

from autogen_agentchat.base import TaskResult

from graphflow_durable import Store, Worker, attach_stream
from worker_pool import team

RUN_ID = "observed"
SHOWN = ("node", "step", "attempt", "status", "resumed")


def in_memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def as_json(span: ReadableSpan) -> dict[str, Any]:
    attributes = dict(span.attributes or {})
    return {
        "name": span.name,
        "id": format(span.context.span_id, "016x"),
        "trace": format(span.context.trace_id, "032x"),
        "parent": None if span.parent is None else format(span.parent.span_id, "016x"),
        "start": span.start_time,
        "shown": {
            k: attributes[f"graphflow_durable.{k}"] for k in SHOWN if f"graphflow_durable.{k}" in attributes
        },
        "commits": sum(e.name == "graphflow_durable.commit" for e in span.events),
    }


def worker(url: str) -> None:
    """The worker process: drive the submitted run, then print its spans as JSON lines."""
    provider, exporter = in_memory()
    pool = Worker(
        url,
        team=lambda run_id, **kw: team(run_id, name="report", tracer_provider=provider, **kw),
        poll_interval=0.1,
    )
    asyncio.run(pool.run_until_idle())
    for span in exporter.get_finished_spans():
        print(json.dumps(as_json(span)))


def print_tree(spans: list[dict[str, Any]]) -> None:
    ids = {s["id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start"]):
        children.setdefault(span["parent"] if span["parent"] in ids else None, []).append(span)

    def show(span: dict[str, Any], depth: int) -> None:
        extra = " ".join(f"{k}={v}" for k, v in span["shown"].items())
        commits = f" ({span['commits']} commit events)" if span["commits"] else ""
        print(f"{'  ' * depth}{span['name']}  {extra}{commits}".rstrip())
        for child in children.get(span["id"], []):
            show(child, depth + 1)

    print(f"== trace {spans[0]['trace']}: {len({s['trace'] for s in spans})} trace(s)")
    for root in children.get(None, []):
        show(root, 0)


async def follow(store: Store) -> None:
    while store.get_run(RUN_ID) is None:  # the worker creates the run when it claims it
        await asyncio.sleep(0.05)
    async for item in attach_stream(store, RUN_ID):
        if isinstance(item, TaskResult):
            print(f"== round over: {item.stop_reason}")
        else:
            print(f"[{item.metadata['graphflow_durable.seq']}] {item.source}: {item.to_text()}")


def main() -> int:
    provider, exporter = in_memory()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'observe.db'}"
        with Store(url) as store:
            with provider.get_tracer("observe").start_as_current_span("submit"):
                store.queue.submit(RUN_ID, task="Write the quarterly report.", team=None)
            args = [sys.executable, __file__, "--worker", url]
            driver = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
            print(f"== following run {RUN_ID} (driven by worker pid {driver.pid})")
            started = time.monotonic()
            asyncio.run(follow(store))
            out, _ = driver.communicate(timeout=60)
            print(f"== the worker exited with {driver.returncode} after {time.monotonic() - started:.1f} s")
    spans = [as_json(s) for s in exporter.get_finished_spans()]
    print_tree(spans + [json.loads(line) for line in out.splitlines() if line.startswith("{")])
    return driver.returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2])
    else:
        sys.exit(main())
