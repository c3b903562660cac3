"""A worker process stalled (SIGSTOP) past its lease, while another worker started a run of the
same partition in its place, starts no turn when it is continued: its lease, expired, is no longer
its own even though nobody took that run over, and a claim it made before the stall is stale."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from graphflow_durable.store import Store

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from queueteam import most_at_once, turns  # noqa: E402
from test_queue_pool import QueuePool, wait_finished  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.crash]

LEASE = 2.0


def starts(log: Path) -> list[tuple[str, str, int, float]]:
    """The logged turn starts: ``(run_id, node, pid, start)``."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(r[0], r[1], int(r[2]), float(r[3])) for r in rows]


def wait_for(what: str, ready: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state ``T`` in /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("one:A", id="between-turns"),
        pytest.param("one:build", id="between-claim-and-first-turn"),
    ],
)
def test_a_worker_stalled_past_its_lease_starts_no_turn_once_its_partition_went_to_another_run(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    start_log, mark = tmp_path / "starts.log", tmp_path / "stopped"
    monkeypatch.setenv("GFD_START_LOG", str(start_log))
    monkeypatch.setenv("GFD_SELF_STOP", where)
    monkeypatch.setenv("GFD_SELF_STOP_MARK", str(mark))
    with Store(store_url) as store:
        store.queue.submit("one", task="t 1", team=None, queue="customers", priority=5, partition="p")
    (tmp_path / "hold").touch()  # B waits while it exists: the second run's B stays in flight
    pool = QueuePool(store_url, tmp_path, lease=LEASE, concurrency=1, delay=0.05)
    try:
        stale = pool.start()
        wait_for("the first worker to stop itself", lambda: mark.exists() and stopped(stale.pid))
        # The other run of the partition comes first for the next worker; it is claimable once the
        # stalled worker's lease expired (the partition counts that run free then).
        with Store(store_url) as store:
            store.queue.submit("two", task="t 2", team=None, queue="customers", priority=0, partition="p")
        successor = pool.start()
        wait_for(
            "the second run's B to start",
            lambda: any(r[:3] == ("two", "B", successor.pid) for r in starts(start_log)),
        )
        stale.send_signal(signal.SIGCONT)
        continued = time.time()
        time.sleep(LEASE * 1.5)  # the stale driver would have started its turn by now
        during = [r for r in starts(start_log) if r[3] >= continued]
        (tmp_path / "hold").unlink()
        finished = wait_finished(store_url, 2, timeout=60)
        codes = pool.stop_all()
    finally:
        for proc in pool.procs:
            if proc.poll() is None:
                proc.kill()
    assert during == [], f"a turn started while the partition's other run was in flight: {during}"
    assert finished == 2 and codes == [0, 0], (codes, pool.stderr()[-3000:])
    assert most_at_once([(s, e) for *_, s, e in turns(tmp_path / "exec.log")]) == 1
    with Store(store_url) as store:
        for run_id in ("one", "two"):
            assert len(store.load(run_id).messages) == 3, run_id  # each completion recorded once
