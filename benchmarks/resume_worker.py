"""Cold resume in a fresh process: ``python benchmarks/resume_worker.py SPEC_JSON``.

SPEC_JSON holds the case, the durable run's store URL and run id, and optionally the path of the
plain team's ``save_state()`` JSON. Prints one JSON object:

- ``durable_ms``: open the store, construct the DurableGraphFlow, and ``_attach()`` the run (claim
  its lease, load its log, restore every participant and the manager): ready to dispatch.
- ``plain_ms``: ``json.loads`` the saved state, construct the GraphFlow, ``load_state()`` it.
- ``durable_peak_mb`` / ``plain_peak_mb``: tracemalloc peaks of the same work, run a second time.

The durable path runs first, cold (nothing imported lazily or compiled yet beyond module import).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphflow_durable.store import Store
from harness import Case, build_team


async def durable(spec: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    store = Store(spec["db_url"])
    team = build_team(Case(**spec["case"]), durable=store, run_id=spec["run_id"])
    await team._session.attach()
    seconds = time.perf_counter() - t0
    store._driver.release_lease(spec["run_id"], team._session.lease.token)
    store.close()
    return seconds


async def plain(spec: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    state = json.loads(Path(spec["state_path"]).read_text())
    team = build_team(Case(**spec["case"]))
    await team.load_state(state)
    return time.perf_counter() - t0


async def peak(fn: Any, spec: dict[str, Any]) -> float:
    gc.collect()
    tracemalloc.start()
    await fn(spec)
    value = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return value / 1e6


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"durable_ms": await durable(spec) * 1e3}
    if spec.get("state_path"):
        out["plain_ms"] = await plain(spec) * 1e3
    if spec.get("memory", True):
        out["durable_peak_mb"] = await peak(durable, spec)
        if spec.get("state_path"):
            out["plain_peak_mb"] = await peak(plain, spec)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
