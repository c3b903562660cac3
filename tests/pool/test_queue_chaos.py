"""Flow control under chaos: worker PROCESSES drive runs of three queues with different settings
while the test SIGKILLs and SIGSTOPs them and restarts PostgreSQL. Every run finishes, each
completion is recorded once, no cap is exceeded (counted from the agents' own start and end
timestamps), partitions never overlap, and priorities are respected where a cap made runs wait.

``GFD_QUEUE_CHAOS_RUNS`` sets the number of runs: 500 by default (about 70 s on two shared cores;
the default test command runs the slow tests too); fewer for a quicker look.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphflow_durable.store import Store

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from queueteam import most_at_once, turns  # noqa: E402
from test_queue_pool import QueuePool  # noqa: E402
from test_worker_pool import holders  # noqa: E402

from pgserver import Server  # noqa: E402

RUNS = int(os.environ.get("GFD_QUEUE_CHAOS_RUNS", "500"))

pytestmark = [pytest.mark.slow, pytest.mark.crash, pytest.mark.postgres, pytest.mark.timeout(300 + RUNS * 3)]

LEASE = 2.0
CUSTOMERS = 12


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from Server.serve()


@pytest.fixture
def database(server: Server) -> Iterator[str]:
    yield from server.database()


def submit_all(url: str, runs: int) -> dict[str, tuple[str, int, str | None]]:
    """``runs`` runs over three queues: ``capped`` (4 at once, priorities), ``customers`` (one per
    customer, 2 per worker) and ``ranked`` (2 at once, 20 starts a second, priorities)."""
    placed: dict[str, tuple[str, int, str | None]] = {}
    with Store(url) as store:
        store.queue.configure("capped", concurrency=4)
        store.queue.configure("customers", worker_concurrency=2)
        store.queue.configure("ranked", concurrency=2, rate="20/1s")
        for i in range(runs):
            queue = ("capped", "customers", "ranked")[i % 3]
            priority = 0 if queue == "customers" else i % 4
            partition = f"c{i % CUSTOMERS}" if queue == "customers" else None
            run_id = f"{queue}-{i:04d}"
            store.queue.submit(
                run_id, task=f"task {i}", team=None, queue=queue, priority=priority, partition=partition
            )
            placed[run_id] = (queue, priority, partition)
    return placed


def test_queues_under_sigkill_sigstop_and_a_postgres_restart_keep_every_cap_and_finish_every_run(
    server: Server, database: str, tmp_path: Path
) -> None:
    runs = RUNS
    placed = submit_all(database, runs)
    rng = random.Random(11)
    pool = QueuePool(database, tmp_path, lease=LEASE, concurrency=4, delay=0.05)
    for _ in range(4):
        pool.start()
    stops: list[tuple[int, float, float]] = []  # pid, stopped at, continued at (epoch seconds)
    stopped: list[tuple[subprocess.Popen[bytes], float]] = []  # and when to continue it (monotonic)
    stopped_at: dict[int, float] = {}
    restarted = False
    finished = 0
    deadline = time.monotonic() + 120 + runs * 2.5
    try:
        while time.monotonic() < deadline:
            try:
                with Store(database) as store:
                    finished = len(store.list_runs("finished"))
            except Exception:  # the server is restarting
                time.sleep(0.5)
                continue
            if finished == runs:
                break
            time.sleep(rng.uniform(0.5, 1.5))
            for proc, until in list(stopped):
                if time.monotonic() >= until:
                    proc.send_signal(signal.SIGCONT)
                    stopped.remove((proc, until))
                    stops.append((proc.pid, stopped_at[proc.pid], time.time()))
            if not restarted and finished >= runs // 3:
                server.restart()
                restarted = True
                continue
            try:
                busy = holders(database)
            except Exception:  # the server is restarting
                continue
            candidates = [p for p in pool.live() if p.pid in busy and all(p is not s for s, _ in stopped)]
            if not candidates:
                continue
            victim = rng.choice(candidates)
            if rng.random() < 0.5:
                pool.kill(victim)
                pool.start()
            else:
                victim.send_signal(signal.SIGSTOP)
                stopped_at[victim.pid] = time.time()
                stopped.append((victim, time.monotonic() + LEASE * 2 + 0.5))
        for proc, _ in stopped:
            stops.append((proc.pid, stopped_at[proc.pid], time.time()))
        codes = pool.stop_all()
    finally:
        for proc in pool.procs:
            if proc.poll() is None:
                proc.kill()
    assert finished == runs and restarted
    assert codes and all(code == 0 for code in codes), (codes, pool.stderr()[-3000:])
    # A turn of a stopped worker that spans its stop counts until the stop only: its lease expired
    # meanwhile and its queue and partition counted it free (its answer is not recorded once its
    # run was taken over). A worker continued after that starts no turn until it holds a lease
    # again, so every other turn counts in full.
    frozen = defaultdict(list)
    for pid, start, _end in stops:
        frozen[pid].append(start)
    logged = [
        (run_id, node, pid, start, min([end, *(s for s in frozen.get(pid, []) if start < s < end)]))
        for run_id, node, pid, start, end in turns(tmp_path / "exec.log")
    ]
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    parts: dict[str | None, list[tuple[float, float]]] = defaultdict(list)
    for run_id, _node, _pid, start, end in logged:
        queue, _priority, partition = placed[run_id]
        spans[queue].append((start, end))
        if partition is not None:
            parts[partition].append((start, end))
    assert most_at_once(spans["capped"]) <= 4
    assert most_at_once(spans["ranked"]) <= 2
    assert all(most_at_once(p) == 1 for p in parts.values())
    # priorities: within a capped queue, the first turns of priority 0 runs came before those of 3
    first: dict[str, float] = {}
    for run_id, node, _pid, start, _end in logged:
        if node == "A":
            first[run_id] = min(start, first.get(run_id, start))
    for queue in ("capped", "ranked"):
        zero = sorted(t for r, t in first.items() if placed[r][0] == queue and placed[r][1] == 0)
        three = sorted(t for r, t in first.items() if placed[r][0] == queue and placed[r][1] == 3)
        assert zero and three and zero[len(zero) // 2] < three[len(three) // 2]
    with Store(database) as store:
        for run_id in placed:
            assert len(store.load(run_id).messages) == 3, run_id  # each completion recorded once
