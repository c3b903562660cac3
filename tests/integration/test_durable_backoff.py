"""The back-off before a retry is durable: the run records when its node may run again; a pool worker
releases the run for it (any worker resumes it once due), and a driver frozen during its back-off
past its lease writes nothing once another driver took the run over."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.messages import BaseChatMessage

from agents import Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable import DurableGraphFlow, RetryPolicy, Worker
from graphflow_durable._model.codec import loads
from graphflow_durable._storage.schema import steps
from graphflow_durable.cli.runs import main
from graphflow_durable.errors import LeaseLostError
from graphflow_durable.store import Store

POLICY = RetryPolicy(max_attempts=3, initial_interval=2.0, jitter=False)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def fail_first_call_of(node: str, left: dict[str, int]):  # type: ignore[no-untyped-def]
    """A hook: ``node``'s first call (over every team built with it) raises a retryable error."""

    async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if agent.name == node and left["n"] > 0:
            left["n"] -= 1
            raise ConnectionError(f"{agent.name}: connection reset by peer")

    return hook


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def reference(url: str) -> list[tuple[str, str]]:
    agents = [Scripted(n) for n in "ABC"]
    await durable(agents, chain(*agents), url, "reference").run(task="go")
    return stored_transcript(durable(agents, chain(*agents), url, "reference"))


def cursor_at(store: Store, run_id: str, seq: int) -> dict[str, Any]:
    """The cursor a past step stored (the store reads only the head's)."""
    query = sa.select(steps.c.scheduler).where(steps.c.run_id == run_id, steps.c.seq == seq)
    with store._e.engine.connect() as conn:
        return dict(loads(conn.execute(query).scalar_one()))


def attempt_failed(store: Store, run_id: str) -> dict[str, Any]:
    (step,) = [s for s in store.load(run_id).steps if s.kind == "attempt_failed"]
    return dict(step.data)


async def test_a_pool_worker_releases_a_run_for_its_back_off_and_another_worker_finishes_it(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    left = {"n": 1}

    def team(run_id: str, **durable_kwargs: Any) -> DurableGraphFlow:
        agents = [Scripted(n, calls=calls, before=fail_first_call_of("B", left)) for n in "ABC"]
        return DurableGraphFlow(agents, chain(*agents), run_id=run_id, retry=POLICY, **durable_kwargs)

    expected = await reference(store_url)
    with Store(store_url) as store:
        store.queue.submit("job", task="go", team=None)
        first = Worker(store, team=team, poll_interval=0.05, owner="first")
        driving = asyncio.ensure_future(first.run_forever())
        await until(lambda: any(o.run_id == "job" for o in first.outcomes))
        # The first worker released the run for B's back-off: it does not hold it while it waits.
        (released,) = first.outcomes
        assert released.outcome == "interrupted" and "backing off until" in str(released.error)
        retry_at = attempt_failed(store, "job")["retry_at"]
        run = store.get_run("job")
        assert run is not None and run.status == "interrupted" and run.lease_owner is None
        assert time.time() < retry_at  # observed while it backs off
        queued = store.queue.get_submission("job")
        assert queued is not None and queued.not_before == retry_at
        assert queued.attempts == 0 and queued.last_error is None  # a back-off is not a failure
        info = team("job", store=store, lease_owner="reader", lease_seconds=30).run_info()
        assert info is not None and info.next_attempt_at == retry_at
        assert info.turns == {"B": {"attempts": 1, "failures": 1, "crashes": 0}}
        assert main(["runs", "show", "--store", store_url, "job"]) == 0
        assert any(line.startswith("next retry") for line in capsys.readouterr().out.splitlines())
        first.request_stop()
        await driving

        second = Worker(store, team=team, poll_interval=0.05, owner="second")
        driving = asyncio.ensure_future(second.run_forever())
        await until(lambda: any(o.outcome == "finished" for o in second.outcomes))
        second.request_stop()
        await driving
        assert [o.outcome for o in second.outcomes] == ["finished"]
        log = store.load("job")
        assert log.run.status == "finished"
        done = team("job", store=store, lease_owner="reader", lease_seconds=30)
        assert stored_transcript(done) == expected
        assert calls == ["A", "B", "B", "C"]
        assert [(s.kind, s.attempt) for s in done.history(node="B")] == [
            ("attempt_failed", 1),
            ("complete", 2),
        ]
        # Claimed and dispatched once due, by the recorded times; as a resume, not a crash.
        redispatch = next(s for s in done.history() if s.kind == "resume" and "B" in s.dispatched)
        assert redispatch.time >= retry_at
        assert done.run_info().next_attempt_at is None


async def test_a_driver_frozen_during_its_back_off_past_its_lease_writes_nothing_after_a_takeover(
    store_url: str,
) -> None:
    lease = 0.6
    calls: list[str] = []
    left = {"n": 1}
    policy = RetryPolicy(max_attempts=3, initial_interval=1.0, jitter=False)

    def agents() -> list[Scripted]:
        return [Scripted(n, calls=calls, before=fail_first_call_of("B", left)) for n in "ABC"]

    stale_agents = agents()
    stale = durable(
        stale_agents, chain(*stale_agents), store_url, "frozen", retry=policy, lease_seconds=lease
    )
    commits = stale._session.commits
    write = commits.write
    heads: list[int] = []

    def successor() -> None:
        time.sleep(lease + 0.2)  # the frozen driver's lease expires
        fresh = agents()
        other = durable(fresh, chain(*fresh), store_url, "frozen", retry=policy, lease_seconds=30)
        asyncio.run(other.run())
        with Store(store_url) as store:
            heads.append(store.get_run("frozen").head_seq)  # type: ignore[union-attr]

    async def frozen_write(step: Any, *args: Any, **how: Any) -> int:
        head = await write(step, *args, **how)
        if step.kind == "attempt_failed":  # B's back-off is committed: freeze (as SIGSTOP does)
            thread = threading.Thread(target=successor)
            thread.start()
            thread.join()  # blocks the event loop: no renewal, no dispatch, until the successor ends
        return head

    commits.write = frozen_write  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(stale.run(task="go"), 30)
    except LeaseLostError:
        pass  # its commit after the back-off was refused by the fencing token
    with Store(store_url) as store:
        log = store.load("frozen")
        assert log.run.status == "finished" and log.run.head_seq == heads[0]  # nothing written since
        retry_at = attempt_failed(store, "frozen")["retry_at"]
    # B ran twice: the failed attempt (frozen driver), the second one (successor); never a third.
    assert calls == ["A", "B", "B", "C"]
    assert stored_transcript(stale) == await reference(store_url)
    # The successor resumed the back-off where it was (not a crash), and dispatched B once due.
    redispatch = next(s for s in stale.history() if s.kind == "resume" and "B" in s.dispatched)
    assert redispatch.time >= retry_at
    with Store(store_url) as store:
        resumed = cursor_at(store, "frozen", redispatch.seq)
    assert resumed["attempts"] == {"B": 2} and "crashes" not in resumed and "retry_at" not in resumed


async def test_a_pool_worker_resuming_a_run_interrupted_during_its_back_off_releases_it_until_due(
    store_url: str,
) -> None:
    calls: list[str] = []
    left = {"n": 1}

    def team(run_id: str, **durable_kwargs: Any) -> DurableGraphFlow:
        agents = [Scripted(n, calls=calls, before=fail_first_call_of("B", left)) for n in "ABC"]
        return DurableGraphFlow(agents, chain(*agents), run_id=run_id, retry=POLICY, **durable_kwargs)

    with Store(store_url) as store:
        # run() outside a pool: interrupted (Ctrl+C) while it sleeps out B's back-off.
        driven = team("job", store=store, lease_owner="script", lease_seconds=30)
        running = asyncio.ensure_future(driven.run(task="go"))
        await until(
            lambda: (
                store.get_run("job") is not None
                and bool(store.load("job").steps[-1].kind == "attempt_failed")
            )
        )
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        retry_at = attempt_failed(store, "job")["retry_at"]
        head = store.get_run("job").head_seq  # type: ignore[union-attr]
        worker = Worker(store, team=team, poll_interval=0.05, owner="worker")
        driving = asyncio.ensure_future(worker.run_forever())
        await until(lambda: bool(worker.outcomes))
        # The worker claimed it, found B backing off, and released it again until due: no dispatch.
        assert worker.outcomes[0].outcome == "interrupted" and calls == ["A", "B"]
        run = store.get_run("job")
        assert run is not None and run.status == "interrupted" and run.lease_owner is None
        assert run.head_seq == head + 1  # the resume that released it, nothing dispatched
        queued = store.queue.get_submission("job")
        assert queued is not None and queued.not_before == retry_at and queued.attempts == 0
        await until(lambda: any(o.outcome == "finished" for o in worker.outcomes))
        worker.request_stop()
        await driving
        assert calls == ["A", "B", "B", "C"]
        redispatch = next(s for s in driven.history() if s.kind == "resume" and "B" in s.dispatched)
        assert redispatch.time >= retry_at


async def test_deferring_a_run_in_the_queue_needs_its_lease_and_counts_no_failure(store_url: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    await durable(agents, chain(*agents), store_url, "run").run(task="go")
    with Store(store_url) as store:
        token = store._driver.acquire_lease("run", "driver", lease_seconds=30)
        assert store.queue.defer("run", 1000.0, fencing_token=token)  # a run never submitted, too
        queued = store.queue.get_submission("run")
        assert queued is not None and queued.not_before == 1000.0
        assert (queued.attempts, queued.last_error, queued.task) == (0, None, None)
        store._driver.release_lease("run", token)
        store._driver.acquire_lease("run", "successor", lease_seconds=30)
        # A driver taken over changes nothing (fenced by its token); nor does one without the lease.
        assert not store.queue.defer("run", 2000.0, fencing_token=token)
        assert store.queue.get_submission("run").not_before == 1000.0  # type: ignore[union-attr]
