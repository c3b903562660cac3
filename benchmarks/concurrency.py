"""Concurrency workload (issue 13): many runs in one event loop, and a worker pool on PostgreSQL.

Usage::

    python benchmarks/concurrency.py [--quick] [--out DIR] [--postgres URL | --start-postgres]
    python benchmarks/run.py --concurrency [same options]

1. R concurrent runs (R = 1, 10, 50, 200) in one process and one event loop, each the two-agent
   ``loop`` of harness.py (A -> B -> A, deterministic agents, no API key) with ``--transitions``
   completions, under plain ``GraphFlow`` (in memory, the floor) and ``DurableGraphFlow`` on
   SQLite FULL, SQLite NORMAL (one new store file per measurement, shared by its R runs) and
   PostgreSQL. Reported: aggregate transitions/s, its ratio to plain's in the same run, and the
   event loop's wake-up lag (a sampler task sleeps 1 ms in a loop and records the overshoot):
   p50, p99, max; and the process's CPU time (every thread) per transition, which bounds the
   throughput when agents answer at once (not reported for rows whose agents wait: the lag
   sampler's own wake-ups are then most of it). With ``--agent-wait-ms`` each answer first waits
   that long, as for a model's answer (default 0 and 100 ms): one set of rows each. Memory: one
   more, untimed, run per configuration under ``tracemalloc`` (Python allocations only, the R
   teams' construction included), as peak MB and KB per run.
2. Worker pool (pool_bench.py): W = 1, 2, 4 ``graphflow-durable worker`` processes on
   PostgreSQL, started and idle before the clock starts; the clock runs from the first submission
   of ``--pool-runs`` runs to the last one ended, once with agents that answer at once (CPU-bound:
   2 cores) and once with agents whose answer waits 50 ms, as a model call does
   (``--pool-latency-ms``). Reported: transitions/s and speed-up over one worker.

Writes ``DIR/concurrency.json`` and ``DIR/concurrency.md`` (default DIR: ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import graphflow_durable  # noqa: E402
from graphflow_durable.store import Store  # noqa: E402
from harness import TASK, Case, build_team  # noqa: E402
from pool_bench import bench_pool  # noqa: E402

POSTGRES_ENV = "GRAPHFLOW_BENCH_POSTGRES_URL"
LAG_INTERVAL = 0.001


class LagSampler:
    """Measures how late the event loop wakes a task that sleeps ``interval`` seconds."""

    def __init__(self, interval: float = LAG_INTERVAL) -> None:
        self.interval = interval
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags_ms.append((time.perf_counter() - t0 - self.interval) * 1e3)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._sample())

    async def stop(self) -> list[float]:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        return self.lags_ms


def percentile(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``xs`` by nearest rank, ``None`` when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _unlink_db(path: Path | None) -> None:
    if path is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


async def run_many(
    config: str,
    r: int,
    n: int,
    size: int,
    work: Path,
    postgres_url: str | None,
    *,
    wait_ms: int = 0,
    trace_memory: bool = False,
) -> dict[str, Any]:
    """R runs of the loop at once under ``config``; the clock covers ``gather(team.run() ...)``.

    The store is opened (schema created) and the R teams built before the clock starts. With
    ``trace_memory`` the run is not timed: tracemalloc covers the teams' construction and the runs.
    """
    store: Store | None = None
    db_path: Path | None = None
    if config.startswith("sqlite-"):
        db_path = work / f"conc-{config}-{uuid.uuid4().hex}.db"
        store = Store(f"sqlite:///{db_path}", synchronous=config.split("-", 1)[1].upper())
    elif config == "postgres":
        assert postgres_url, "postgres configuration without a URL"
        store = Store(postgres_url)
    try:
        case = Case("loop", n, size, latency_ms=wait_ms)
        gc.collect()
        if trace_memory:
            tracemalloc.start()
        teams = [build_team(case, durable=store, run_id=f"conc-{uuid.uuid4().hex}") for _ in range(r)]
        sampler = LagSampler()
        if not trace_memory:
            sampler.start()
            await asyncio.sleep(0)  # the sampler's first sleep starts before the clock does
        t0, cpu0 = time.perf_counter(), time.process_time()
        results = await asyncio.gather(*(t.run(task=TASK) for t in teams))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        out: dict[str, Any] = {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "transitions": sum(len(res.messages) - 1 for res in results),
        }
        if trace_memory:
            out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            out["lags_ms"] = await sampler.stop()
        return out
    finally:
        if store is not None:
            store.close()
        _unlink_db(db_path)


async def bench_concurrency(
    rs: list[int],
    configs: list[str],
    n: int,
    size: int,
    repeats: int,
    work: Path,
    postgres: str | None,
    wait_ms: int = 0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every R, every configuration interleaved (rotated) per repeat; then one traced run each
    (agents that answer at once only: a wait changes how long, not how much, is held)."""
    rows: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    for r in rs:
        tps: dict[str, list[float]] = {c: [] for c in configs}
        cpu_us: dict[str, list[float]] = {c: [] for c in configs}
        lags: dict[str, list[float]] = {c: [] for c in configs}
        transitions: dict[str, int] = {}
        t_start = time.perf_counter()
        for rep in range(repeats):
            for config in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
                res = await run_many(config, r, n, size, work, postgres, wait_ms=wait_ms)
                tps[config].append(res["transitions"] / res["seconds"])
                cpu_us[config].append(res["cpu_seconds"] / res["transitions"] * 1e6)
                lags[config] += res["lags_ms"]
                transitions[config] = res["transitions"]
        plain = statistics.median(tps["plain"])
        for config in configs:
            value = statistics.median(tps[config])
            rows.append(
                {
                    "r": r,
                    "wait_ms": wait_ms,
                    "config": config,
                    "n": n,
                    "size": size,
                    "transitions": transitions[config],
                    "transitions_per_s": value,
                    "samples_tps": tps[config],
                    "ratio_to_plain": value / plain,
                    # With waits the lag sampler's wake-ups are most of the CPU: not reported.
                    "cpu_us_per_transition": None if wait_ms else statistics.median(cpu_us[config]),
                    "lag_samples": len(lags[config]),
                    "lag_p50_ms": percentile(lags[config], 0.5),
                    "lag_p99_ms": percentile(lags[config], 0.99),
                    "lag_max_ms": max(lags[config], default=None),
                }
            )
        if r > 1 and not wait_ms:  # memory per run: one traced, untimed run per configuration
            for config in configs:
                peak = (await run_many(config, r, n, size, work, postgres, trace_memory=True))["peak_bytes"]
                memory.append({"r": r, "config": config, "peak_mb": peak / 1e6, "per_run_kb": peak / r / 1e3})
        summary = ", ".join(
            f"{row['config']}={row['transitions_per_s']:.0f}/s p99 {row['lag_p99_ms']:.1f} ms"
            for row in rows
            if row["r"] == r
        )
        print(f"[R={r}, wait {wait_ms} ms] {summary} ({time.perf_counter() - t_start:.1f}s)", flush=True)
    return rows, memory


# -- output ---------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    out = [
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, Python {m['python']}, SQLite {m['sqlite']}; commit "
        f"{m['git_commit']}{' (src modified)' if m['src_dirty'] else ''}; mode {result['mode']}, "
        f"{result['repeats']} repeats, medians; ratios within this run; package {result['package']}.",
        "",
        f"### {result['n']}-transition loops ({result['size']} B messages), R at once in one event loop",
        "",
        "| agent wait ms | R | config | transitions/s | x plain | CPU us/transition | loop lag p50 / p99 / max ms |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in result["concurrency"]:
        out.append(
            f"| {row.get('wait_ms', 0)} | {row['r']} | {row['config']} | {_f(row['transitions_per_s'], '{:.0f}')} |"
            f" {_f(row['ratio_to_plain'], '{:.2f}')}x | {_f(row.get('cpu_us_per_transition'), '{:.0f}')} |"
            f" {_f(row['lag_p50_ms'], '{:.2f}')} / {_f(row['lag_p99_ms'])} / {_f(row['lag_max_ms'])} |"
        )
    if result["memory"]:
        out += ["", "### Memory (tracemalloc peak, Python allocations, team construction included)", ""]
        out += ["| R | config | peak MB | KB per run |", "|---:|---|---:|---:|"]
        for row in result["memory"]:
            out.append(f"| {row['r']} | {row['config']} | {_f(row['peak_mb'])} | {_f(row['per_run_kb'])} |")
    if result["pool"]:
        p0 = result["pool"][0]
        out += [
            "",
            f"### Worker pool on PostgreSQL ({p0['runs']} submitted {p0['n']}-transition loops,"
            f" --concurrency {p0['concurrency']} per worker, {m['cpus']} CPUs)",
            "",
            "| agent wait ms | workers | transitions | seconds | transitions/s | speed-up vs 1 |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in result["pool"]:
            out.append(
                f"| {row.get('latency_ms', 0)} | {row['workers']} | {row['transitions']} | {_f(row['seconds'], '{:.2f}')} |"
                f" {_f(row['transitions_per_s'], '{:.0f}')} | {_f(row['speedup'], '{:.2f}')}x |"
            )
    return "\n".join(out) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="R = 1,3, 10 transitions, 1 repeat (smoke check)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    p.add_argument(
        "--postgres", default=os.environ.get(POSTGRES_ENV), help=f"PostgreSQL URL (or ${POSTGRES_ENV})"
    )
    p.add_argument(
        "--start-postgres",
        action="store_true",
        help="start a throw-away local cluster (fsync on) for the run",
    )
    p.add_argument("--repeats", type=int, default=None, help="repeats per R (default 1 quick, 3 full)")
    p.add_argument("--rs", type=_ints, default=None, help="concurrent runs, e.g. 1,10,50,200 (the default)")
    p.add_argument("--transitions", type=int, default=None, help="transitions per run (default 10 quick, 40)")
    p.add_argument("--size", type=int, default=100, help="message size in characters (default 100)")
    p.add_argument(
        "--agent-wait-ms",
        type=_ints,
        default=None,
        help="agent answer waits for the R-runs rows, one set of rows each (default 0,100; quick 0): "
        "0 measures CPU per transition, a wait like a model call's the throughput a user sees",
    )
    p.add_argument("--workers", type=_ints, default=None, help="worker counts (default 1,2,4; quick 1,2)")
    p.add_argument(
        "--pool-runs", type=int, default=None, help="runs submitted per worker count (4 quick, 100)"
    )
    p.add_argument("--pool-concurrency", type=int, default=10, help="--concurrency of each worker (10)")
    p.add_argument(
        "--pool-latency-ms",
        type=_ints,
        default=None,
        help="agent answer waits for the pool rows, one set of rows each (default 0,50; quick 0): "
        "0 is CPU-bound, a wait like a model call's shows how the pool scales with workers",
    )
    p.add_argument("--no-pool", action="store_true", help="skip the worker-pool rows")
    args = p.parse_args(argv)
    from run import machine  # benchmarks/run.py; imported here since run.py imports this module

    rs = args.rs or ([1, 3] if args.quick else [1, 10, 50, 200])
    n = args.transitions or (10 if args.quick else 40)
    repeats = args.repeats or (1 if args.quick else 3)
    counts = args.workers or ([1, 2] if args.quick else [1, 2, 4])
    pool_runs = args.pool_runs or (4 if args.quick else 100)
    latencies = args.pool_latency_ms or ([0] if args.quick else [0, 50])
    waits = args.agent_wait_ms or ([0] if args.quick else [0, 100])
    cluster = None
    if args.start_postgres:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from pgcluster import PgCluster

        cluster = PgCluster.start(
            settings={"fsync": "on", "full_page_writes": "on", "max_connections": "300"}
        )
        args.postgres = cluster.url
    configs = ["plain", "sqlite-full", "sqlite-normal"] + (["postgres"] if args.postgres else [])
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gfd-conc-"))
    started = time.time()
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "repeats": repeats,
        "configs": configs,
        "n": n,
        "size": args.size,
        "rs": rs,
        "agent_wait_ms": waits,
        "lag_interval_ms": LAG_INTERVAL * 1e3,
        "memory_method": "tracemalloc peak (Python allocations), R teams built and run, untimed",
        "machine": machine(),
        # Which code ran (PYTHONPATH=<export of a commit>/src measures a commit, not the work tree).
        "package": str(Path(graphflow_durable.__file__).resolve().parent),
        "postgres": "throw-away local cluster, fsync on" if cluster else bool(args.postgres),
        "skipped": [],
        "concurrency": [],
        "memory": [],
        "pool": [],
    }
    try:
        for wait_ms in waits:
            rows, memory = await bench_concurrency(
                rs, configs, n, args.size, repeats, work, args.postgres, wait_ms
            )
            result["concurrency"] += rows
            result["memory"] += memory
        if args.no_pool:
            result["skipped"].append("worker pool (--no-pool)")
        elif not args.postgres:
            result["skipped"].append(
                f"worker pool (needs PostgreSQL: --postgres URL, ${POSTGRES_ENV} or --start-postgres)"
            )
        else:
            for latency in latencies:
                result["pool"] += bench_pool(
                    args.postgres, counts, pool_runs, n, args.size, args.pool_concurrency, work, latency
                )
    finally:
        if cluster is not None:
            cluster.stop()
    result["seconds"] = time.time() - started
    (args.out / "concurrency.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (args.out / "concurrency.md").write_text(md)
    print(md)
    print(f"wrote {args.out / 'concurrency.json'} and {args.out / 'concurrency.md'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
