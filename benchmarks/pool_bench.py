"""Worker-pool throughput (issue 13): W ``graphflow-durable worker`` processes draining submitted runs.

Used by ``concurrency.py`` (``--workers 1,2,4``). Workers are started and idle (each has logged
``started``) before the clock starts; the clock runs from the first ``store.queue.submit`` to the
last run stopped. This file is also the team module the workers import (``pool_bench:team``): the
``loop`` of harness.py, sized by ``$GFD_BENCH_TRANSITIONS`` and ``$GFD_BENCH_SIZE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from graphflow_durable.flow import DurableGraphFlow  # noqa: E402
from graphflow_durable.store import Store  # noqa: E402
from harness import TASK, Case, build_team  # noqa: E402

POOL_TEAM = "bench"


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """The pool workers' factory: the same loop, sized by ``$GFD_BENCH_TRANSITIONS``/``$GFD_BENCH_SIZE``."""
    case = Case(
        "loop",
        int(os.environ.get("GFD_BENCH_TRANSITIONS", "40")),
        int(os.environ.get("GFD_BENCH_SIZE", "100")),
        latency_ms=int(os.environ.get("GFD_BENCH_LATENCY_MS", "0")),
    )
    store = durable.pop("store")
    flow = build_team(case, durable=store, run_id=run_id, **durable)
    assert isinstance(flow, DurableGraphFlow)
    return flow


@contextmanager
def workers(
    url: str, count: int, concurrency: int, n: int, size: int, work: Path, latency_ms: int = 0
) -> Iterator[None]:
    """``count`` worker processes, each logged ``started`` (idle, polling) before this yields."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "GFD_BENCH_TRANSITIONS": str(n),
        "GFD_BENCH_SIZE": str(size),
        "GFD_BENCH_LATENCY_MS": str(latency_ms),
    }
    args = [
        sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", url,
        "--team", f"{POOL_TEAM}=pool_bench:team", "--concurrency", str(concurrency),
        "--poll-interval", "0.05",
    ]  # fmt: skip
    logs = [work / f"worker-{count}-{i}-{uuid.uuid4().hex[:6]}.log" for i in range(count)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with open(log, "wb") as err:
                procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env))
        deadline = time.monotonic() + 120
        while not all("started" in log.read_text(errors="replace") for log in logs):
            for proc, log in zip(procs, logs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start within 120 s; see " + ", ".join(map(str, logs)))
            time.sleep(0.05)
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bench_pool(
    url: str,
    counts: list[int],
    runs: int,
    n: int,
    size: int,
    concurrency: int,
    work: Path,
    latency_ms: int = 0,
) -> list[dict[str, Any]]:
    """For each worker count: submit ``runs`` runs to idle workers and time them to the last finish.
    With ``latency_ms`` every agent answer waits that long, as a model call does: the pool is then
    bounded by how many turns wait at once (workers x concurrency), not by the CPU."""
    rows: list[dict[str, Any]] = []
    with Store(url) as store:
        for count in counts:
            prefix = f"pool{count}-{uuid.uuid4().hex[:8]}-"
            with workers(url, count, concurrency, n, size, work, latency_ms):
                t0 = time.perf_counter()
                for i in range(runs):
                    store.queue.submit(f"{prefix}{i}", task=TASK, team=POOL_TEAM)
                pending = [f"{prefix}{i}" for i in range(runs)]
                finished = []
                deadline = time.monotonic() + 60 + runs * n * (0.05 + latency_ms / 1000)
                while pending:
                    # Oldest first, stop at the first unfinished one: about one query per poll.
                    while pending:
                        record = store.get_run(pending[0])
                        # The loop ends on its termination condition: "stopped" is its end.
                        if record is None or record.status not in ("stopped", "finished"):
                            if record is not None and record.status == "failed":
                                raise RuntimeError(
                                    f"pool run {record.run_id} failed: see the worker logs in {work}"
                                )
                            break
                        finished.append(record)
                        pending.pop(0)
                    if pending:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{len(pending)} pool runs unfinished at the deadline")
                        time.sleep(0.02)
                seconds = time.perf_counter() - t0
            transitions = sum(rec.message_count - 1 for rec in finished)
            rows.append(
                {
                    "workers": count,
                    "runs": runs,
                    "concurrency": concurrency,
                    "n": n,
                    "size": size,
                    "latency_ms": latency_ms,
                    "transitions": transitions,
                    "seconds": seconds,
                    "transitions_per_s": transitions / seconds,
                }
            )
            print(
                f"[pool] {count} worker(s), agents wait {latency_ms} ms: "
                f"{transitions / seconds:.0f} transitions/s ({seconds:.1f}s)",
                flush=True,
            )
    base = rows[0]["transitions_per_s"] if rows else None
    for row in rows:
        row["speedup"] = row["transitions_per_s"] / base if base else None
    return rows
