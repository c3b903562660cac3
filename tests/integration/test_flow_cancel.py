"""Cancel as the driving flow sees it: a request honoured at the next renewal (or by the next
driver when the one asked stopped first), the run left ``cancelled``, and ``run()`` resuming it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping

import pytest

from agents import Gate, Hook, Scripted, chain, close_stores, durable, fail_once, stored_transcript, text
from graphflow_durable.errors import RunStateError
from graphflow_durable.store import Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def agents(calls: list[str], hooks: Mapping[str, Hook] | None = None) -> list[Scripted]:
    hooks = hooks or {}
    return [Scripted(n, calls=calls, before=hooks.get(n)) for n in ("A", "B", "C")]


async def test_a_cancel_of_a_running_flow_stops_it_at_the_next_renewal_and_run_resumes_it(
    store_url: str,
) -> None:
    reference_calls: list[str] = []
    ref_agents = agents(reference_calls)
    reference = await durable(ref_agents, chain(*ref_agents), store_url, "ref").run(task="go")

    calls: list[str] = []
    gate = Gate()
    first = agents(calls, hooks={"B": gate})
    team = durable(first, chain(*first), store_url, "run", lease_seconds=0.6)
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    with Store(store_url) as other:  # another store object: as another process would
        assert other.cancel_run("run").outcome == "requested"
        await asyncio.sleep(0.5)  # the driver renews its 0.6 s lease every 0.2 s: it has seen it
        gate.open()  # B answers: recorded; C is not dispatched
        await asyncio.wait_for(running, 10)
        run = other.get_run("run")
        assert run is not None and (run.status, run.cancel_requested_at, run.lease_owner) == (
            "cancelled",
            None,
            None,
        )
    assert calls == ["A", "B"]
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B"]

    result = await team.run()  # no task: resumes the cancelled run
    assert calls == ["A", "B", "C"]
    assert stored_transcript(team) == text(reference.messages)
    assert text(result.messages)[-1] == text(reference.messages)[-1]
    info = team.run_info()
    assert info is not None and info.status == "finished"


async def test_a_request_the_asked_driver_never_saw_is_honoured_by_the_next_driver(store_url: str) -> None:
    calls: list[str] = []
    made = agents(calls, hooks={"B": fail_once()})
    team = durable(made, chain(*made), store_url, "run")
    with pytest.raises(RuntimeError):
        await team.run(task="go")  # B fails: the run is failed, its lease released
    store = team.store
    store._driver.acquire_lease(
        "run", "remote", lease_seconds=0.3, host="elsewhere", pid=1
    )  # another host's driver
    assert store.cancel_run("run").outcome == "requested"
    await asyncio.sleep(0.4)  # ... which dies before it renews: its lease runs out
    await team.run()
    run = team.run_info()
    assert run is not None and (run.status, run.cancel_requested_at) == ("cancelled", None)
    assert calls == ["A", "B"]  # nothing was dispatched under the request

    await team.run()
    assert calls == ["A", "B", "B", "C"]
    run = team.run_info()
    assert run is not None and run.status == "finished"


async def test_a_dispatch_whose_lease_check_renews_and_finds_a_cancel_request_is_refused(
    store_url: str,
) -> None:
    calls: list[str] = []
    gate = Gate()
    made = agents(calls, hooks={"B": gate})
    team = durable(made, chain(*made), store_url, "run", lease_seconds=60)  # renewer: every 20 s
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    assert team.store.cancel_run("run").outcome == "requested"
    team._session.lease.confirmed_at = float("-inf")  # not fresh: the next dispatch renews first
    gate.open()
    await asyncio.wait_for(running, 10)
    assert calls == ["A", "B"]  # C's dispatch was refused by the renewal that found the request
    run = team.run_info()
    assert run is not None and run.status == "cancelled"


async def test_a_cancel_stops_the_run_before_its_next_dispatch_without_waiting_for_a_renewal(
    store_url: str,
) -> None:
    calls: list[str] = []
    gate = Gate()
    made = agents(calls, hooks={"B": gate})
    team = durable(made, chain(*made), store_url, "run", lease_seconds=60)  # renewer: every 20 s
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    with Store(store_url) as other:  # as another process would
        assert other.cancel_run("run").outcome == "requested"
    gate.open()  # B's answer is committed; that commit reads the request: C is never dispatched
    await asyncio.wait_for(running, 10)
    assert calls == ["A", "B"]
    run = team.run_info()
    assert run is not None and (run.status, run.cancel_requested_at) == ("cancelled", None)
    assert not run.ended_before_cancel


async def test_a_cancel_after_the_last_dispatch_is_kept_and_reported_until_the_next_round(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    gate = Gate()
    made = agents(calls, hooks={"C": gate})
    team = durable(made, chain(*made), store_url, "run", lease_seconds=60)
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)  # C, the last node, is dispatched and running
    with Store(store_url) as other:
        assert other.cancel_run("run").outcome == "requested"
        gate.open()
        with caplog.at_level(logging.WARNING, logger="graphflow_durable.flow"):
            await asyncio.wait_for(running, 10)
        assert calls == ["A", "B", "C"]
        run = other.get_run("run")
        assert run is not None and run.status == "finished"
        assert run.cancel_requested_at is not None and run.ended_before_cancel  # not wiped
        assert "finished before the cancel requested at" in caplog.text
        with pytest.raises(RunStateError, match="finished: its last round ended before the cancel requested"):
            other.cancel_run("run")

    await team.run(task="again")  # a new round: the old request is not one of its
    run = team.run_info()
    assert run is not None and (run.status, run.cancel_requested_at) == ("finished", None)
    assert calls == ["A", "B", "C", "A", "B", "C"]
