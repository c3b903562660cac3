"""Flow control in a real pool: worker PROCESSES (``graphflow-durable worker``) and submitter
processes at once, the caps checked from the agents' own start and end timestamps; a killed or
stopped worker's runs released to another worker no sooner than the cap allows."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from graphflow_durable.store import Store

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from queueteam import most_at_once, turns  # noqa: E402
from test_worker_pool import Pool  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.crash]


class QueuePool(Pool):
    """The pool test's worker processes, driving ``queueteam:team`` (A -> B, timed turns)."""

    team = "queueteam:team"


def wait_finished(url: str, count: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        with Store(url) as store:
            done = len(store.list_runs("finished"))
        if done >= count:
            break
        time.sleep(0.3)
    return done


#: A submitter process: its own store, three runs (one per queue) under its number.
SUBMITTER = """
import sys
from graphflow_durable.store import Store
url, k = sys.argv[1], int(sys.argv[2])
with Store(url) as store:
    store.queue.submit(f"capped-{k}", task=f"capped {k}", team=None, queue="capped", priority=k % 3)
    store.queue.submit(f"cust-{k}", task=f"cust {k}", team=None, queue="customers", partition=f"c{k % 4}")
    store.queue.submit(f"free-{k}", task=f"free {k}", team=None, queue="free")
"""


def test_twenty_submitters_and_six_workers_keep_every_cap_counted_from_the_agents_timestamps(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url) as store:
        store.queue.configure("capped", concurrency=3)
        store.queue.configure("customers", worker_concurrency=1)
    pool = QueuePool(store_url, tmp_path, lease=10, concurrency=4, delay=0.15)
    try:
        for _ in range(6):
            pool.start()
        submitters = [
            subprocess.Popen([sys.executable, "-c", SUBMITTER, store_url, str(k)], stderr=subprocess.PIPE)
            for k in range(20)
        ]
        for proc in submitters:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
        finished = wait_finished(store_url, 60, timeout=90)
        codes = pool.stop_all()
    finally:
        for proc in pool.procs:
            if proc.poll() is None:
                proc.kill()
    assert finished == 60
    assert codes and all(code == 0 for code in codes), (codes, pool.stderr()[-3000:])
    logged = turns(tmp_path / "exec.log")
    by_queue: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_partition: dict[int, list[tuple[float, float]]] = defaultdict(list)
    by_worker: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run_id, _node, pid, start, end in logged:
        queue, k = run_id.split("-")
        by_queue[queue].append((start, end))
        if queue == "cust":
            by_partition[int(k) % 4].append((start, end))
            by_worker[pid].append((start, end))
    assert 2 <= most_at_once(by_queue["capped"]) <= 3
    assert all(most_at_once(spans) == 1 for spans in by_partition.values())
    assert all(most_at_once(spans) == 1 for spans in by_worker.values())
    assert most_at_once(by_queue["free"]) > 3  # the unlimited queue went wider
    with Store(store_url) as store:
        for run_id in {row[0] for row in logged}:
            # every completion recorded once: the task, A's answer, B's answer
            assert len(store.load(run_id).messages) == 3, run_id


def test_a_killed_workers_run_is_taken_by_another_worker_at_once_and_the_cap_still_holds(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url) as store:
        store.queue.configure("one", concurrency=1)
        for i in range(3):
            store.queue.submit(f"one-{i}", task=f"t {i}", team=None, queue="one")
    (tmp_path / "hold").touch()  # B waits: the first run stays in flight
    pool = QueuePool(store_url, tmp_path, lease=30, concurrency=2, delay=0.1)
    try:
        first = pool.start()
        deadline = time.monotonic() + 30
        while not turns(tmp_path / "exec.log") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [row[0] for row in turns(tmp_path / "exec.log")] == ["one-0"]
        pool.kill(first)
        killed_at = time.time()
        pool.start()
        (tmp_path / "hold").unlink()
        finished = wait_finished(store_url, 3, timeout=25)  # well inside the dead worker's 30 s lease
        codes = pool.stop_all()
    finally:
        for proc in pool.procs:
            if proc.poll() is None:
                proc.kill()
    assert finished == 3 and codes == [0]
    logged = turns(tmp_path / "exec.log")
    assert most_at_once([(s, e) for *_, s, e in logged]) == 1
    assert all(start > killed_at for _, _, pid, start, _ in logged if pid != first.pid)


def test_a_stopped_workers_run_counts_until_its_lease_expires_then_its_successor_drives(
    store_url: str, tmp_path: Path
) -> None:
    if store_url.startswith("sqlite"):
        pytest.skip("a process stopped inside a write transaction holds an SQLite file's one write lock")
    lease = 3.0
    with Store(store_url) as store:
        store.queue.configure("one", concurrency=1)
        for i in range(2):
            store.queue.submit(f"one-{i}", task=f"t {i}", team=None, queue="one")
    (tmp_path / "hold").touch()
    pool = QueuePool(store_url, tmp_path, lease=lease, concurrency=2, delay=0.1)
    try:
        first = pool.start()
        deadline = time.monotonic() + 30
        while not turns(tmp_path / "exec.log") and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        second = pool.start()
        (tmp_path / "hold").unlink()
        finished = wait_finished(store_url, 2, timeout=30)
        pool.kill(first)  # never continued: its stale turn is not logged
        codes = pool.stop_all()
    finally:
        for proc in pool.procs:
            if proc.poll() is None:
                proc.kill()
    assert finished == 2 and codes == [0]
    successor = [row for row in turns(tmp_path / "exec.log") if row[2] == second.pid]
    # the stopped worker renewed at most a third of its lease before it stopped
    assert min(start for *_, start, _ in successor) >= stopped_at + lease * 2 / 3 - 0.1
    assert most_at_once([(s, e) for *_, s, e in turns(tmp_path / "exec.log")]) == 1
