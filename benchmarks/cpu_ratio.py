"""CPU time per transition, durable over plain, for comparing two trees on a busy machine.

Usage::

    python benchmarks/cpu_ratio.py SHAPE N REPEATS [--policy] [--tracing] [--full]
    PYTHONPATH=/tmp/pre/src python benchmarks/cpu_ratio.py loop 200 5   # an older tree

Runs the case (100 B messages) as plain ``GraphFlow`` and as ``DurableGraphFlow`` on SQLite with
``synchronous=NORMAL`` (and, with ``--policy`` on a tree that has them, with ``harness.POLICY`` set:
retry and timeout on every node, never triggered; with ``--tracing``, with an OpenTelemetry SDK
tracer and meter provider that export nothing, so every span, event and metric is recorded and
dropped: the cost of tracing on, against the default global no-op providers of the plain durable
row), alternated ``REPEATS`` times in this process.
With ``--full`` also SQLite ``synchronous=FULL``. Prints one JSON line: per configuration the
median CPU time (``time.process_time``: every thread of the process, so the store's writer too),
the event-loop thread's own CPU time (``loop_cpu_ms``: ``time.thread_time``, without the writer
thread's) and wall time per transition, and their ratios. CPU
time is less disturbed than wall time by other processes sharing the cores; run the two trees
alternately, several times, and compare the ratios (see LOG.md, 2026-11-26).
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphflow_durable.store import Store
from harness import POLICY, Case, build_team, has_policies


async def once(case: Case, config: str, work: Path) -> tuple[float, float, float]:
    """CPU, loop-thread CPU and wall milliseconds per transition of one run of ``case`` under ``config``."""
    store = None
    options: dict[str, Any] = {}
    if config != "plain":
        sync = "FULL" if config == "sqlite-full" else "NORMAL"
        store = Store(f"sqlite:///{work / (uuid.uuid4().hex + '.db')}", synchronous=sync)
        options = POLICY if config.endswith("+policy") else {}
        if config.endswith("+tracing"):
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.trace import TracerProvider

            options = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}
    team = build_team(case, durable=store, run_id=uuid.uuid4().hex, **options)
    gc.collect()
    cpu, loop, wall = time.process_time(), time.thread_time(), time.perf_counter()
    result = await team.run(task="benchmark task")
    cpu, loop, wall = time.process_time() - cpu, time.thread_time() - loop, time.perf_counter() - wall
    if store is not None:
        store.close()
    n = len(result.messages) - 1
    return cpu * 1e3 / n, loop * 1e3 / n, wall * 1e3 / n


async def main(argv: list[str]) -> None:
    shape, n, repeats = argv[0], int(argv[1]), int(argv[2])
    case = Case(shape, n, 100)
    configs = ["plain", "sqlite-normal"]
    if "--policy" in argv and has_policies():
        configs.append("sqlite-normal+policy")
    if "--tracing" in argv:
        configs.append("sqlite-normal+tracing")
    if "--full" in argv:
        configs.append("sqlite-full")
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    loop: dict[str, list[float]] = {c: [] for c in configs}
    wall: dict[str, list[float]] = {c: [] for c in configs}
    work = Path(tempfile.mkdtemp(prefix="gfd-cpu-"))
    for rep in range(repeats):
        for config in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
            c, t, w = await once(case, config, work)
            cpu[config].append(c)
            loop[config].append(t)
            wall[config].append(w)
    out: dict[str, dict[str, float]] = {
        c: {
            "cpu_ms": statistics.median(cpu[c]),
            "loop_cpu_ms": statistics.median(loop[c]),
            "wall_ms": statistics.median(wall[c]),
        }
        for c in configs
    }
    for c in configs[1:]:
        out[c]["loop_cpu_added_us"] = (out[c]["loop_cpu_ms"] - out["plain"]["loop_cpu_ms"]) * 1e3
        for what in ("cpu", "loop_cpu", "wall"):
            out[c][f"{what}_x_plain"] = out[c][f"{what}_ms"] / out["plain"][f"{what}_ms"]
            if c.endswith(("+policy", "+tracing")):
                out[c][f"{what}_x_normal"] = out[c][f"{what}_ms"] / out["sqlite-normal"][f"{what}_ms"]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 3 or not args[1].isdigit() or not args[2].isdigit():
        sys.exit("usage: python benchmarks/cpu_ratio.py SHAPE N REPEATS [--policy] [--tracing] [--full]")
    asyncio.run(main(sys.argv[1:]))
