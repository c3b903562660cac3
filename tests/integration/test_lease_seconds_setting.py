"""A lease period is a finite number greater than 0 wherever one is given: a lease of 0 s or less
is expired as it is taken, so another process would take a live run over while its agents run."""

from __future__ import annotations

import math

import pytest

from agents import Scripted, chain
from graphflow_durable import DurableGraphFlow, Store
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import UsageError
from graphflow_durable.worker import Worker

BAD = [0, 0.0, -1, -0.5, math.nan, math.inf, "30", True, None]


def made(url: str, **kw: object) -> DurableGraphFlow:
    a, b = Scripted("A"), Scripted("B")
    return DurableGraphFlow([a, b], chain(a, b), store=url, run_id="r", **kw)  # type: ignore[arg-type]


def refused(raised: pytest.ExceptionInfo[UsageError]) -> None:
    assert raised.value.option == "lease_seconds"
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("bad", BAD)
def test_a_flow_refuses_a_lease_period_that_is_not_greater_than_zero(sqlite_url: str, bad: object) -> None:
    with pytest.raises(UsageError, match="lease_seconds must be a number greater than 0") as raised:
        made(sqlite_url, lease_seconds=bad)
    refused(raised)


def test_a_flow_keeps_a_positive_lease_period(sqlite_url: str) -> None:
    assert made(sqlite_url, lease_seconds=0.5).dump_component().config["lease_seconds"] == 0.5


@pytest.mark.parametrize("bad", [0, -1, math.nan])
def test_a_worker_refuses_a_lease_period_that_is_not_greater_than_zero(sqlite_url: str, bad: float) -> None:
    with pytest.raises(UsageError, match="lease_seconds must be a number greater than 0") as raised:
        Worker(sqlite_url, team=lambda run_id, **kw: None, lease_seconds=bad)  # type: ignore[arg-type,return-value]
    refused(raised)


@pytest.mark.parametrize("bad", [0, -5, math.inf])
def test_the_stores_lease_calls_refuse_a_lease_period_that_is_not_greater_than_zero(
    store: Store, bad: float
) -> None:
    driver = store._driver
    run = driver.create_run(CreateRequest("r", graph_fingerprint="f", graph={}, owner="w", lease_seconds=60))
    calls = {
        "acquire_lease": lambda: driver.acquire_lease("r", "other", lease_seconds=bad),
        "heartbeat": lambda: driver.heartbeat("r", "w", run.fencing_token, lease_seconds=bad),
        "renew_lease": lambda: driver.renew_lease("r", "w", run.fencing_token, lease_seconds=bad),
        "claim": lambda: store.queue.claim("other", lease_seconds=bad),
        "create_run": lambda: driver.create_run(
            CreateRequest("s", graph_fingerprint="f", graph={}, owner="w", lease_seconds=bad)
        ),
    }
    for name, call in calls.items():
        with pytest.raises(UsageError, match="lease_seconds must be a number greater than 0") as raised:
            call()
        refused(raised)
        # nothing was taken over or made: the run is still the first owner's, no other run exists
        after = store.get_run("r")
        assert after is not None and after.lease_owner == "w", name
        assert after.fencing_token == run.fencing_token, name
    assert store.get_run("s") is None
