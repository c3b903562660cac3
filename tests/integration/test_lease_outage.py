"""The lease through a database outage and a paused driver.

- An outage: a real PostgreSQL server (a cluster of this module's own) is stopped while an agent
  runs. Renewal retries through the outage; a driver that could not renew for longer than its
  lease minus the margin halts (no new dispatch) and leaves the run to be resumed.
- A paused driver: a driver frozen between a commit and its dispatch (its event loop blocked, as under
  SIGSTOP) past its lease, while another owner took the run over, does not dispatch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agents import Gate, Scripted, chain, close_stores, durable, fan, stored_transcript
from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.errors import RunLockedError, StoreError
from graphflow_durable.store import Store
from pgserver import Server
from smalldisk import SmallDisk


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from Server.serve()


async def _outage(server: Server, seconds: float) -> None:
    await asyncio.to_thread(server.down)
    await asyncio.sleep(seconds)
    await asyncio.to_thread(server.up)


def _first_commit_error(team: Any) -> list[BaseException]:
    """A list that receives every error the team's commits raise, the first one first."""
    errors: list[BaseException] = []
    store = team.store
    submit_commit = store._driver.submit_commit

    def spied(request: CommitRequest) -> asyncio.Future[int]:
        future = submit_commit(request)

        def done(f: asyncio.Future[int]) -> None:
            if not f.cancelled() and f.exception() is not None:
                errors.append(f.exception())  # type: ignore[arg-type]

        future.add_done_callback(done)
        return future

    store._driver.submit_commit = spied
    return errors


def _team(url: str, run_id: str, calls: list[str], gate: Gate, lease: float, **kwargs: Any) -> Any:
    agents = [Scripted(n, calls=calls, before=gate if n == "B" else None) for n in "ABC"]
    return durable(agents, chain(*agents), url, run_id, lease_seconds=lease, **kwargs)


@pytest.mark.postgres
async def test_lease_renewal_survives_a_postgres_outage_and_keeps_the_run_locked(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    lease = 3.0  # renewed every 1 s; halted only after 2 s without a renewal
    calls: list[str] = []
    gate = Gate()
    team = _team(server.url, "outage-short", calls, gate, lease)
    caplog.set_level(logging.INFO, logger="graphflow_durable.flow")
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    with Store(server.url) as other:
        before = other.get_run("outage-short")
        assert before is not None
        await _outage(server, 1.2)  # at least one renewal falls into it
        # The renewer came back: the lease's expiry moves on past where it stood before.
        deadline = time.monotonic() + lease
        while True:
            run = other.get_run("outage-short")
            assert run is not None
            if run.lease_expires_at > before.lease_expires_at + 1.0:
                break
            assert time.monotonic() < deadline, "the lease was not renewed after the outage"
            await asyncio.sleep(0.05)
        with pytest.raises(RunLockedError):  # no second driver can take the healthy run over
            other._driver.acquire_lease("outage-short", "intruder", lease_seconds=lease)
    # The renewer logs its recovery once its thread hands the renewal back, a moment after the
    # database shows it; ending the run before then would cancel the renewer with the log unsaid.
    deadline = time.monotonic() + lease
    while not any("renewed again" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "the renewer did not log its recovery"
        await asyncio.sleep(0.05)
    gate.open()
    result = await asyncio.wait_for(running, 20)
    assert [m.source for m in result.messages] == ["user", "A", "B", "C"]
    assert calls == ["A", "B", "C"]
    warnings = [r for r in caplog.records if "renewing the lease failed" in r.getMessage()]
    back = [r for r in caplog.records if "renewed again" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert [r.levelno for r in back] == [logging.INFO]
    assert not any("stops dispatching" in r.getMessage() for r in caplog.records)


@pytest.mark.postgres
async def test_a_driver_that_cannot_renew_halts_before_its_lease_expires_and_the_run_resumes_once(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    lease = 1.5  # renewed every 0.5 s; halted after 1 s without a renewal
    calls: list[str] = []
    gate = Gate()
    team = _team(server.url, "outage-long", calls, gate, lease)
    caplog.set_level(logging.INFO, logger="graphflow_durable.flow")
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    await _outage(server, lease + 1.0)  # past the lease: another driver could have taken over
    gate.open()
    halted = await asyncio.wait_for(running, 20)
    assert calls == ["A", "B"]  # C was not dispatched by the driver that lost contact
    assert any("stops dispatching" in r.getMessage() for r in caplog.records)
    assert re.fullmatch(HALTED, str(halted.stop_reason)), halted.stop_reason
    with Store(server.url) as store:
        run = store.get_run("outage-long")
        assert run is not None and run.status == "interrupted"
    # The run is left to be resumed: the next driver runs C, once.
    calls2: list[str] = []
    again = _team(server.url, "outage-long", calls2, Gate(), lease, lease_owner="next")
    await asyncio.wait_for(again.run(), 20)
    assert calls2 == ["C"]
    assert [s for s, _ in stored_transcript(again)] == ["user", "A", "B", "C"]


HALTED = (
    r"run [\w-]+: stopped dispatching: the lease could not be renewed since "
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \(lease [\d.]+ s\); run\(\) resumes it"
)


async def test_a_round_halted_because_the_lease_could_not_be_renewed_says_so_in_its_stop_reason(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database answers commits but not the lease's renewals (as in an outage that ends just
    before B answers): the round halts before C and its result says why, not GraphFlow's generic
    "The group chat is stopped."; run() resumes it."""
    lease = 1.2  # renewed every 0.4 s; halted after 0.8 s without a renewal
    calls: list[str] = []
    gate = Gate()
    team = _team(store_url, "unrenewed", calls, gate, lease)
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("renewing the lease: the server is not answering (test)")

    monkeypatch.setattr(team.store._driver, "heartbeat", down)
    started = time.time()
    await asyncio.sleep(lease)  # past the margin: the renewer halts the run
    gate.open()
    halted = await asyncio.wait_for(running, 20)
    assert calls == ["A", "B"]
    assert re.fullmatch(HALTED, str(halted.stop_reason)), halted.stop_reason
    since = str(halted.stop_reason).split("since ")[1].split(" ")[0]
    from datetime import datetime

    # The time is printed to the second (truncated): the last renewal, well within 1 s before the
    # renewals began to fail, shows as that second.
    assert math.floor(started - 1.0) <= datetime.fromisoformat(since).timestamp() <= started + 0.1
    assert team.run_info().status == "interrupted"  # type: ignore[union-attr]
    monkeypatch.undo()
    resumed = await asyncio.wait_for(team.run(), 20)
    assert (
        calls == ["A", "B", "C"]
        and resumed.stop_reason is not None
        and "stopped dispatching" not in resumed.stop_reason
    )


async def _frozen_driver(url: str, run_id: str) -> list[str]:
    """A drives; right after the commit that selects B, the driver freezes past its lease while
    another owner takes the run over and B is run there; then the frozen driver wakes up."""
    lease = 0.6
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "ABC"]
    team = durable(agents, chain(*agents), url, run_id, lease_seconds=lease)
    commits = team._session.commits
    write = commits.write
    taken = threading.Event()

    def take_over() -> None:
        time.sleep(lease + 0.2)
        with Store(url) as other:
            other._driver.acquire_lease(run_id, "successor", lease_seconds=30)
        taken.set()

    async def frozen_write(
        step: Any, messages: Sequence[Any], states: Sequence[Any], update: Any, **how: Any
    ) -> int:
        head = await write(step, messages, states, update, **how)
        if step.node == "A":  # A's completion, selecting B, is committed: freeze (as SIGSTOP does)
            thief = threading.Thread(target=take_over)
            thief.start()
            thief.join()  # blocks the event loop: no renewal, no dispatch, until after the takeover
            assert taken.is_set()
        return head

    commits.write = frozen_write  # type: ignore[method-assign]
    await asyncio.wait_for(team.run(task="go"), 20)
    return calls


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_driver_frozen_past_its_lease_does_not_dispatch_after_a_takeover(
    backend: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "postgres_database"))
    calls = await _frozen_driver(url, "frozen")
    assert calls == ["A"]  # B belongs to the successor now: never started by the frozen driver
    with Store(url) as store:
        run = store.get_run("frozen")
        assert run is not None and run.lease_owner == "successor"


async def _frozen_after_the_check(url: str, run_id: str) -> list[str]:
    """A's answer is committed and B selected; the manager's lease check before B's dispatch
    passes, and right after it the driver freezes past its lease (as under SIGSTOP) while another
    owner takes the run over; then it wakes up and the dispatch goes on to B's container."""
    lease = 0.6
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "ABC"]
    team = durable(agents, chain(*agents), url, run_id, lease_seconds=lease)
    lease_of = team._session.lease
    valid = lease_of.valid

    def take_over() -> None:
        time.sleep(lease + 0.2)
        with Store(url) as other:
            other._driver.acquire_lease(run_id, "successor", lease_seconds=30)

    async def checked_then_frozen() -> bool:
        ok = await valid()
        if ok and calls == ["A"]:  # the check before B's dispatch passed: freeze now
            thief = threading.Thread(target=take_over)
            thief.start()
            thief.join()  # blocks the event loop: no renewal, until after the takeover
        return ok

    lease_of.valid = checked_then_frozen  # type: ignore[method-assign]
    await asyncio.wait_for(team.run(task="go"), 20)
    return calls


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_driver_frozen_after_its_lease_check_does_not_start_the_agent_it_dispatched(
    backend: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "postgres_database"))
    calls = await _frozen_after_the_check(url, "frozen-late")
    assert calls == ["A"]  # B's turn belongs to the successor: the woken driver never called B
    assert any("does not start it" in r.getMessage() for r in caplog.records), caplog.text
    with Store(url) as store:
        run = store.get_run("frozen-late")
        assert run is not None and run.lease_owner == "successor"
        assert [s.node for s in store.load("frozen-late").steps if s.kind == "complete"] == ["A"]


@pytest.mark.postgres
async def test_a_commit_failing_in_an_outage_raises_its_own_error_and_the_run_resumes_after_expiry(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit failing in an outage: detach() after the failed commit fails too; the caller sees the commit's error."""
    lease = 1.0
    calls: list[str] = []
    gate = Gate()
    team = _team(server.url, "outage-commit", calls, gate, lease)
    errors = _first_commit_error(team)
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    await asyncio.to_thread(server.down)
    try:
        gate.open()  # B answers while the server is down: its commit fails
        with pytest.raises(StoreError) as raised:
            await asyncio.wait_for(running, 20)
    finally:
        await asyncio.to_thread(server.up)
    assert raised.value is errors[0]  # the commit's error, not a later one ("reading run ...")
    assert any(
        r.levelno == logging.WARNING and "releasing its lease failed too" in r.getMessage()
        for r in caplog.records
    )
    # Once the lease expired, the next driver resumes the run: B again, then C.
    await asyncio.sleep(lease + 0.2)
    calls2: list[str] = []
    opened = Gate()
    opened.open()
    again = _team(server.url, "outage-commit", calls2, opened, lease, lease_owner="next")
    await asyncio.wait_for(again.run(), 20)
    assert calls2 == ["B", "C"]
    assert [s for s, _ in stored_transcript(again)] == ["user", "A", "B", "C"]


@pytest.mark.postgres
async def test_an_outage_while_a_batch_hands_its_answers_over_records_none_and_the_batch_runs_again(
    server: Server,
) -> None:
    """A fan-out's two answers come while PostgreSQL is down: the first is handed over without
    waiting, the batch's last waits for both; run() raises the first one's error, no answer of the
    batch is recorded and the join never runs. The next driver, once the lease expired, runs both
    branches again, then the join."""
    lease = 1.0
    calls: list[str] = []
    gates = {"B1": Gate(), "B2": Gate()}
    a, d = Scripted("A", calls=calls), Scripted("D", calls=calls)
    b1, b2 = (Scripted(n, calls=calls, before=gates[n]) for n in ("B1", "B2"))
    team = durable([a, b1, b2, d], fan(a, b1, b2, d), server.url, "outage-batch", lease_seconds=lease)
    errors = _first_commit_error(team)
    running = asyncio.ensure_future(team.run(task="go"))
    for gate in gates.values():
        await gate.reached(running)
    await asyncio.to_thread(server.down)
    try:
        for gate in gates.values():  # both answer while the server is down
            gate.open()
        with pytest.raises(StoreError) as raised:
            await asyncio.wait_for(running, 20)
    finally:
        await asyncio.to_thread(server.up)
    assert len(errors) == 2 and raised.value is errors[0]  # the first answer's error
    assert "D" not in calls
    with Store(server.url) as store:
        assert [s.node for s in store.load("outage-batch").steps if s.kind == "complete"] == ["A"]
    await asyncio.sleep(lease + 0.2)
    calls2: list[str] = []
    agents2 = [Scripted(n, calls=calls2) for n in ("A", "B1", "B2", "D")]
    again = durable(
        agents2, fan(*agents2), server.url, "outage-batch", lease_seconds=lease, lease_owner="next"
    )
    await asyncio.wait_for(again.run(), 20)
    assert sorted(calls2[:2]) == ["B1", "B2"] and calls2[2:] == ["D"]
    assert sorted(s for s, _ in stored_transcript(again)) == ["A", "B1", "B2", "D", "user"]


async def test_a_commit_failing_on_a_full_disk_raises_its_own_error_and_the_run_resumes(
    small_disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit failing on a real SQLite file on a full disk: the caller sees the commit's error, not the
    one of the bookkeeping after it; once space is back the next driver resumes the run."""
    url = f"sqlite:///{small_disk.path / 'runs.db'}"
    lease = 1.0

    async def fill_disk(agent: Scripted, messages: Sequence[Any]) -> None:
        if agent.turn == 1:
            small_disk.fill()

    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=fill_disk if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), url, "full-disk", lease_seconds=lease)
    errors = _first_commit_error(team)
    with pytest.raises(StoreError) as raised:
        await asyncio.wait_for(team.run(task="go"), 20)
    assert raised.value is errors[0]  # the first error, not the one of the bookkeeping after it
    assert any(r.levelno == logging.WARNING and "failed too" in r.getMessage() for r in caplog.records)
    small_disk.free()
    await asyncio.sleep(lease + 0.2)
    calls2: list[str] = []
    agents2 = [Scripted(n, calls=calls2) for n in "ABC"]
    again = durable(agents2, chain(*agents2), url, "full-disk", lease_seconds=lease, lease_owner="next")
    await asyncio.wait_for(again.run(), 20)
    assert calls2 == ["B", "C"]
    assert [s for s, _ in stored_transcript(again)] == ["user", "A", "B", "C"]


async def test_a_commit_failing_on_a_full_disk_freed_at_once_leaves_the_run_interrupted_not_failed(
    small_disk: SmallDisk,
) -> None:
    """Space is back as soon as B's commit failed, so the end is recorded: the run is
    ``interrupted`` (a database fault is not the run's failure; a pool claims no failed run on its
    own, so ``failed`` would leave it waiting for ``runs retry``), and the next driver finishes it."""
    url = f"sqlite:///{small_disk.path / 'runs.db'}"

    async def fill_disk(agent: Scripted, messages: Sequence[Any]) -> None:
        if agent.turn == 1:
            small_disk.fill()

    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=fill_disk if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), url, "full-disk-brief", lease_seconds=1.0)
    submit_commit = team.store._driver.submit_commit

    def freed_when_failed(request: CommitRequest) -> asyncio.Future[int]:
        future = submit_commit(request)
        future.add_done_callback(lambda f: small_disk.free() if f.exception() is not None else None)
        return future

    team.store._driver.submit_commit = freed_when_failed
    with pytest.raises(StoreError):
        await asyncio.wait_for(team.run(task="go"), 20)
    with Store(url) as store:
        run = store.get_run("full-disk-brief")
        assert run is not None and run.status == "interrupted" and run.lease_owner is None
        assert store.load("full-disk-brief").steps[-1].kind == "interrupt"
    calls2: list[str] = []
    agents2 = [Scripted(n, calls=calls2) for n in "ABC"]
    again = durable(agents2, chain(*agents2), url, "full-disk-brief", lease_owner="next")
    await asyncio.wait_for(again.run(), 20)
    assert calls2 == ["B", "C"]
    assert [s for s, _ in stored_transcript(again)] == ["user", "A", "B", "C"]


async def test_a_run_created_on_a_full_disk_is_its_error_leaves_no_run_and_starts_once_space_is_back(
    small_disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's row, its first snapshot and the round's first commit are one transaction: on a
    full disk run() raises the StoreError of creating it (and logs no WARNING beside it), nothing of
    the run is stored, no agent ran, and once space is back the same run() starts it from the
    beginning."""
    url = f"sqlite:///{small_disk.path / 'runs.db'}"
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "AB"]
    team = durable(agents, chain(*agents), url, "full-at-creation")
    store = team.store
    assert store.get_run("full-at-creation") is None  # the store is open (its write-ahead log too)
    small_disk.fill()
    try:
        with pytest.raises(StoreError, match=r"creating run full-at-creation failed.*disk is full"):
            await asyncio.wait_for(team.run(task="go"), 20)
    finally:
        small_disk.free()
    assert calls == []
    assert store.get_run("full-at-creation") is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    result = await asyncio.wait_for(team.run(task="go"), 20)
    assert calls == ["A", "B"] and [m.source for m in result.messages] == ["user", "A", "B"]
    assert store.get_run("full-at-creation").status == "finished"  # type: ignore[union-attr]


@pytest.mark.postgres
async def test_the_database_gone_while_a_run_is_created_is_its_error_and_nothing_half_made(
    server: Server,
) -> None:
    """The run's row, its first snapshot and the round's first commit are one transaction (written
    by the store's writer): PostgreSQL stopped right then fails run() with a StoreError, leaves no
    run, and the next run() starts it."""
    calls: list[str] = []
    opened = Gate()
    opened.open()
    team = _team(server.url, "outage-create", calls, opened, 3.0)
    store = team.store
    submit_create_run = store._driver.submit_create_run

    def create_in_an_outage(request: CreateRequest) -> Any:
        server.down()
        return submit_create_run(request)

    store._driver.submit_create_run = create_in_an_outage  # type: ignore[method-assign]
    try:
        with pytest.raises(StoreError, match="creating run outage-create"):
            await asyncio.wait_for(team.run(task="go"), 30)
    finally:
        server.up()
        store._driver.submit_create_run = submit_create_run  # type: ignore[method-assign]
    assert calls == []
    assert store.get_run("outage-create") is None
    await asyncio.wait_for(team.run(task="go"), 30)
    assert calls == ["A", "B", "C"]
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B", "C"]
