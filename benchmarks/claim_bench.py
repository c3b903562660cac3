"""Claims per second with a deep queue: the claim walks indexes, not the queued rows.

Seeds a fresh store with Q submitted runs (bulk-inserted rows, as ``store.queue.submit`` writes
them) of one named queue that has a concurrency cap far above what is claimed (so every claim runs
flow control: the gate's counts, and on PostgreSQL the queue's advisory lock), then times C claims
in a row by one claimant, for Q = 100 and Q = 100,000. The ratio of the two rates is the row of
benchmarks/README.md ("Flow control: claims with a deep queue").

    python benchmarks/claim_bench.py [--postgres URL] [--claims 300] [--depths 100,100000]

Without ``--postgres`` a PostgreSQL server is started from tests/pgcluster.py when its binaries are
found; SQLite runs always.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from graphflow_durable._storage.schema import queue  # noqa: E402
from graphflow_durable.store import Store  # noqa: E402

QUEUE = "bulk"


def seed(store: Store, depth: int) -> None:
    """``depth`` submissions of queue ``bulk``, oldest first, in batches."""
    store.queue.configure(QUEUE, concurrency=10_000_000)
    now = time.time() - depth
    rows = [
        {
            "run_id": f"run-{i:07d}",
            "team": None,
            "task": '"task"',
            "status": "pending",
            "attempts": 0,
            "claim_token": 0,
            "created_at": now + i,
            "updated_at": now + i,
            "queue": QUEUE,
            "priority": 0,
        }
        for i in range(depth)
    ]
    with store._e.write.begin() as conn:
        for start in range(0, depth, 5000):
            conn.execute(sa.insert(queue), rows[start : start + 5000])
    with store._e.write.begin() as conn:
        conn.exec_driver_sql("ANALYZE")  # the planner sees the deep queue


def claims_per_second(url: str, depth: int, claims: int) -> float:
    with Store(url) as store:
        seed(store, depth)
        spent = 0.0
        for i in range(claims + 5):  # the first 5 warm the connection pool and the plans
            started = time.perf_counter()
            claim = store.queue.claim("bench", lease_seconds=600)
            if i >= 5:
                spent += time.perf_counter() - started
            assert claim is not None
            store.queue.release_claim(claim)  # the queue stays as deep (released: first again)
        return claims / spent


def fresh_pg(admin_url: str, name: str) -> str:
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL whose user may CREATE DATABASE")
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--depths", default="100,100000")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    cluster = None
    pg = args.postgres
    if pg is None:
        try:
            from pgcluster import PgCluster

            cluster = PgCluster.start()
            pg = cluster.url
        except Exception as exc:  # noqa: BLE001 -- no server: SQLite only
            print(f"PostgreSQL not available ({exc}); SQLite only", file=sys.stderr)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results: dict[str, dict[int, float]] = {}
            for depth in depths:
                url = f"sqlite:///{Path(tmp) / f'claims{depth}.db'}"
                results.setdefault("sqlite", {})[depth] = claims_per_second(url, depth, args.claims)
                if pg is not None:
                    url = fresh_pg(pg, f"gfd_claims_{depth}")
                    results.setdefault("postgresql", {})[depth] = claims_per_second(url, depth, args.claims)
        for backend, rates in results.items():
            shown = ", ".join(f"{depth:,} queued: {rate:.0f} claims/s" for depth, rate in rates.items())
            ratio = rates[depths[-1]] / rates[depths[0]]
            print(f"{backend}: {shown}; ratio {ratio:.2f}")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
