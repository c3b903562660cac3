"""What watchers cost the driver: per-transition time of a run followed by W watchers vs by none.

    python benchmarks/watchers.py [--watchers 20] [--n 400] [--repeats 3] [--postgres URL | --start-postgres]

The ``loop`` workload (A -> B -> A, 100-byte messages, no agent latency: the worst case, a commit
every millisecond or so) is driven in this process; the watchers run in another process (as they
would: a web server, ``runs follow``), all W in one event loop, each a ``Store.follow`` of the run
from its first message. They are attached (following the run's id before it exists) before the
clock starts; the clock covers ``team.run()``: wall time, and the driver process's CPU time (its writer thread
included), which watchers would raise only by adding work to the driver itself. Configurations ``none`` and ``watched`` alternate in
every repeat (rotated order). Prints one Markdown table: median ms per transition, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphflow_durable.store import Store
from harness import TASK, Case, build_team

HERE = Path(__file__).resolve().parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def watch(url: str, run_id: str, count: int) -> tuple[int, float]:
    """Follow ``run_id`` with ``count`` watchers once it exists; the messages they received, and
    the CPU seconds the process spent from "ready" on."""
    with Store(url) as store:

        async def one() -> int:
            while store.get_run(run_id) is None:
                await asyncio.sleep(0.002)
            return len([m async for m in store.follow(run_id)])

        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        await asyncio.sleep(0.2)
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        cpu = _cpu()
        return sum(await asyncio.gather(*tasks)), _cpu() - cpu


async def drive(url: str, case: Case, watchers: int) -> tuple[float, float]:
    """One run of ``case`` on ``url`` with ``watchers`` following it: wall and CPU (this process,
    its writer thread included) ms per transition."""
    run_id = uuid.uuid4().hex
    store = Store(url)
    team = build_team(case, durable=store, run_id=run_id)
    proc = None
    if watchers:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--watch", url, run_id, str(watchers)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = await team.run(task=TASK)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    store.close()
    if proc is not None:
        out, _ = proc.communicate(timeout=120)
        watching, received = float(out.split()[-2]), int(out.split()[-1])
        sys.stderr.write(f"watchers' process: {watching:.2f} s CPU while the run took {seconds:.2f} s\n")
        assert received == watchers * len(result.messages), (received, watchers, len(result.messages))
    transitions = len(result.messages) - 1
    return seconds * 1e3 / transitions, cpu * 1e3 / transitions


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watchers", type=int, default=20, help="watchers of the watched runs (20)")
    p.add_argument("--n", type=int, default=400, help="transitions per run (400)")
    p.add_argument("--repeats", type=int, default=3, help="repeats (3)")
    p.add_argument("--postgres", default=None, help="a PostgreSQL URL: adds its rows")
    p.add_argument("--start-postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    p.add_argument("--watch", nargs=3, metavar=("URL", "RUN", "W"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.watch:
        url, run_id, count = args.watch
        received, cpu = await watch(url, run_id, int(count))
        sys.stdout.write(f"{cpu:.3f} {received}\n")
        return 0
    cluster: Any = None
    if args.start_postgres:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from pgcluster import PgCluster

        cluster = PgCluster.start(settings={"fsync": "on", "full_page_writes": "on"})
        args.postgres = cluster.url
    work = Path(tempfile.mkdtemp(prefix="gfd-watch-"))
    case = Case("loop", args.n, 100)
    urls = {
        "sqlite-full": f"sqlite:///{work}/full.db?synchronous=FULL",
        "sqlite-normal": f"sqlite:///{work}/normal.db?synchronous=NORMAL",
    }
    if args.postgres:
        urls["postgres"] = args.postgres
    try:
        rows = []
        for name, url in urls.items():
            samples: dict[int, list[tuple[float, float]]] = {0: [], args.watchers: []}
            await drive(url, Case("loop", 20, 100), 0)  # warm-up: the store's file, compiled statements
            for repeat in range(args.repeats):
                order = [0, args.watchers] if repeat % 2 == 0 else [args.watchers, 0]
                for count in order:
                    samples[count].append(await drive(url, case, count))
            wall0, wall = (statistics.median(s[0] for s in samples[c]) for c in (0, args.watchers))
            cpu0, cpu = (statistics.median(s[1] for s in samples[c]) for c in (0, args.watchers))
            rows.append(
                f"| {name} | {args.n} | {wall0:.3f} / {cpu0:.3f} | {wall:.3f} / {cpu:.3f} | "
                f"{wall / wall0:.2f}x / {cpu / cpu0:.2f}x |"
            )
    finally:
        if cluster is not None:
            cluster.stop()
    print(
        f"| store | N | no watcher: wall / CPU ms per transition | {args.watchers} watchers: wall / CPU | ratio wall / CPU |"
    )
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
