"""Leases on PostgreSQL are judged by the database's clock, not by the clock of each worker.

A "process" with a skewed clock is simulated by replacing the ``time`` module the store's methods,
its leases and the queue read (``graphflow_durable.store.time``, ``..._storage.lease.time``,
``..._storage.workqueue.time``) with one whose ``time()`` is off by a fixed amount, only while that
worker acts.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import graphflow_durable._storage.lease as lease_module
import graphflow_durable.store as store_module
from graphflow_durable._storage import workqueue as workqueue_module
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import RunLockedError
from graphflow_durable.store import Store

pytestmark = pytest.mark.postgres


class _SkewedTime:
    """The ``time`` module, except that ``time()`` is ``skew`` seconds off."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def time(self) -> float:
        return _time.time() + self.skew

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


@pytest.fixture
def skewed_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    @contextmanager
    def skewed(seconds: float) -> Iterator[None]:
        with monkeypatch.context() as patch:
            fake = _SkewedTime(seconds)
            for module in (store_module, lease_module, workqueue_module):
                patch.setattr(module, "time", fake)
            assert abs(store_module.time.time() - _time.time() - seconds) < 1
            yield

    return skewed


def test_a_worker_whose_clock_is_120s_fast_cannot_take_a_live_lease_but_takes_it_once_expired(
    postgres_database: str, skewed_clock: Any
) -> None:
    with Store(postgres_database) as healthy, Store(postgres_database) as fast:
        healthy._driver.create_run(
            CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="healthy", lease_seconds=2)
        )
        healthy.queue.submit("run-2", task="t", team=None)
        assert healthy.queue.claim("healthy", lease_seconds=2) is not None  # the submission's claim
        with skewed_clock(120):
            with pytest.raises(RunLockedError, match="healthy"):
                fast._driver.acquire_lease("run-1", "fast", lease_seconds=60)
            assert fast.queue.claim("fast", lease_seconds=60) is None  # neither the run nor run-2
        assert healthy._driver.renew_lease("run-1", "healthy", 1, lease_seconds=2) > _time.time() + 1
        _time.sleep(2.5)  # now both really expired
        with skewed_clock(120):
            # the store's third token (the run drew the first, the submission's claim the second)
            assert fast._driver.acquire_lease("run-1", "fast", lease_seconds=60) == 3
            claim = fast.queue.claim("fast", lease_seconds=60)
        assert claim is not None and claim.run_id == "run-2"
        run = healthy.get_run("run-1")
        assert run is not None and run.lease_owner == "fast"
        assert run.lease_expires_at is not None and run.lease_expires_at < _time.time() + 61  # database time
        assert claim.expires_at < _time.time() + 61


def test_a_worker_whose_clock_is_120s_slow_stores_its_expiry_in_the_databases_time(
    postgres_database: str, skewed_clock: Any
) -> None:
    with Store(postgres_database) as slow, Store(postgres_database) as healthy:
        with skewed_clock(-120):
            slow._driver.create_run(
                CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="slow", lease_seconds=30)
            )
            expires = slow._driver.renew_lease("run-1", "slow", 1, lease_seconds=30)
            slow.queue.submit("run-2", task="t", team=None)
            claim = slow.queue.claim("slow", lease_seconds=30)
        assert expires > _time.time() + 20
        assert claim is not None and claim.run_id == "run-2" and claim.expires_at > _time.time() + 20
        with pytest.raises(RunLockedError, match="slow"):
            healthy._driver.acquire_lease("run-1", "healthy", lease_seconds=30)
        assert healthy.queue.claim("healthy", lease_seconds=30) is None
