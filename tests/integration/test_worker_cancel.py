"""A run cancelled while a worker drives it: the worker stops it within its lease, reports it
``cancelled``, and the pool leaves it alone until it is retried, then finishes it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import EXPECTED_COMPLETIONS, team

sys.path.insert(0, str(Path(__file__).parents[1]))
from agents import wait_for


async def test_a_run_cancelled_under_a_worker_is_reported_cancelled_left_alone_then_retried(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFD_AGENT_DELAY", "0.2")
    store.queue.submit("r", task="cancel me", team="t")
    worker = Worker(store, {"t": team}, poll_interval=0.01, lease_seconds=0.9)
    runner = asyncio.ensure_future(worker.run_forever())
    await wait_for(lambda: (run := store.get_run("r")) is not None and run.head_seq >= 3, timeout=20)
    assert store.cancel_run("r").outcome == "requested"
    await wait_for(lambda: bool(worker.outcomes), timeout=0.9 + 1.0)  # within the lease (+ a turn)
    await asyncio.sleep(0.3)  # the worker polls on: it does not claim the cancelled run again
    worker.request_stop()
    await runner
    assert [(o.run_id, o.outcome) for o in worker.outcomes] == [("r", "cancelled")]
    run = store.get_run("r")
    assert run is not None and run.status == "cancelled"
    assert sum(1 for s in store.load("r").steps if s.kind == "complete") < sum(EXPECTED_COMPLETIONS.values())

    store.retry_run("r")
    again = Worker(store, {"t": team}, poll_interval=0.01, lease_seconds=0.9)
    await again.run_until_idle()
    assert [(o.run_id, o.outcome) for o in again.outcomes] == [("r", "finished")]
