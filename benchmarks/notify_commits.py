"""What notifying followers costs concurrent committers on PostgreSQL (benchmarks/README.md, Watchers).

P processes each commit N steps of a run of their own, one commit in flight per process (the
store's blocking commit), on one throw-away cluster (``tests/pgcluster.py``, fsync on); code trees
given as NAME=SRC (each an export of a commit's ``src``, put on the children's PYTHONPATH) alternate
in every repeat. ``--commit-delay-us`` sets PostgreSQL's ``commit_delay`` (with
``commit_siblings = 0``): every WAL flush first waits that long, as on a slow disk or with a
synchronous standby. Prints commits/s per tree (median of the repeats, each repeat in brackets)
and its ratio to the first tree's.

usage: notify_commits.py NAME=SRC ... [--procs 1,4] [--n 300] [--repeats 5] [--commit-delay-us 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def child(url: str, gate: str, n: int) -> None:
    from graphflow_durable._storage.driver import CommitRequest, CreateRequest
    from graphflow_durable.store import MessageRecord, Step, Store

    store = Store(url)
    run_id = uuid.uuid4().hex
    token = store._driver.create_run(
        CreateRequest(run_id, graph_fingerprint="f", graph={}, owner="me", lease_seconds=600)
    ).fencing_token
    store._driver.commit(_req(CommitRequest, MessageRecord, Step, run_id, 0, token))  # warm up
    print("ready", flush=True)
    while not Path(gate).exists():
        time.sleep(0.001)
    for head in range(1, n + 1):
        store._driver.commit(_req(CommitRequest, MessageRecord, Step, run_id, head, token))
    store.close()
    print("done", flush=True)


def _req(CommitRequest: Any, MessageRecord: Any, Step: Any, run_id: str, head: int, token: int) -> Any:
    message = MessageRecord(head, {"type": "TextMessage", "source": "A", "content": "x" * 100}, True)
    return CommitRequest(
        run_id, expected_head=head, fencing_token=token, step=Step("complete", "A", {}), messages=[message]
    )


def measure(url: str, src: str, procs: int, n: int, work: Path) -> float:
    gate = work / f"gate-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": src}
    ps = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", url, str(gate), str(n)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(procs)
    ]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    gate.touch()
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "done"
    seconds = time.perf_counter() - t0
    for p in ps:
        p.wait()
    return procs * n / seconds


def main() -> None:
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    from pgcluster import PgCluster

    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--procs", default="4")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--commit-delay-us", default="0", help="PostgreSQL commit_delay: a slow flush (e.g. 2000)"
    )
    a = ap.parse_args()
    variants = [tuple(v.split("=", 1)) for v in a.variants]
    work = Path(tempfile.mkdtemp(prefix="notify-commits-"))
    cluster = PgCluster.start(
        settings={
            "fsync": "on",
            "full_page_writes": "on",
            "max_connections": "300",
            "commit_delay": a.commit_delay_us,
            "commit_siblings": "0",
        }
    )
    res: dict[tuple[int, str], list[float]] = {}
    try:
        for r in range(a.repeats):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for procs in [int(x) for x in a.procs.split(",")]:
                for name, src in order:
                    rate = measure(cluster.url, src, procs, a.n, work)
                    res.setdefault((procs, name), []).append(rate)
                    print(f"  repeat {r} P{procs} {name}: {rate:.0f} commits/s", flush=True)
    finally:
        cluster.stop()
    names = [n for n, _ in variants]
    for procs in [int(x) for x in a.procs.split(",")]:
        ref = statistics.median(res[(procs, names[0])])
        print(
            f"P={procs}: "
            + " | ".join(
                f"{nm} {statistics.median(res[(procs, nm)]):.0f}/s "
                f"({statistics.median(res[(procs, nm)]) / ref:.2f}x) "
                f"[{', '.join(f'{v:.0f}' for v in res[(procs, nm)])}]"
                for nm in names
            )
        )


if __name__ == "__main__":
    main()
