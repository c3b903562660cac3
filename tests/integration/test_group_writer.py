"""The store's group writer: commits leave the event loop, wait together, and fail alone.

To make commits wait together deterministically, a second connection holds SQLite's write lock
(``BEGIN IMMEDIATE``): the writer thread blocks on it with its first commit, the others queue up
behind, and all of them form the next group once the lock is let go.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.base import TerminationCondition
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, StopMessage

from agents import Scripted, Ticker, chain, close_stores, durable, statements, stored_transcript
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._runtime import config
from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.errors import ConflictError, LeaseLostError, StoreError, UsageError
from graphflow_durable.scheduler import GraphSpec, initial
from graphflow_durable.store import (
    AgentStateRecord,
    MessageRecord,
    RunRecord,
    RunUpdate,
    Step,
    StepKind,
    Store,
)

LEASE = 60.0


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _create(store: Store, run_id: str) -> RunRecord:
    return store._driver.create_run(
        CreateRequest(run_id, graph_fingerprint="f", graph={}, owner="me", lease_seconds=LEASE)
    )


def _step(store: Store, run_id: str, head: int, token: int = 1) -> asyncio.Future[int]:
    """Commit step ``head + 1`` of ``run_id`` under ``token`` (1: the first run's, on a new store)."""
    message = MessageRecord(head, {"type": "TextMessage", "source": run_id, "content": f"m{head}"}, True)
    return store._driver.submit_commit(
        CommitRequest(
            run_id,
            expected_head=head,
            fencing_token=token,
            step=Step("complete", "A", {}),
            messages=[message],
        )
    )


class WriteLock:
    """SQLite's write lock, held by another connection until :meth:`release`."""

    def __init__(self, url: str) -> None:
        self._conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        self._conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._conn.execute("ROLLBACK")
        self._conn.close()


async def test_commits_that_wait_together_are_written_as_one_group_and_a_refused_one_fails_alone(
    sqlite_url: str,
) -> None:
    store = Store(sqlite_url)
    tokens = {run_id: _create(store, run_id).fencing_token for run_id in ("a", "b", "stale", "fenced")}
    await _step(store, "stale", 0, tokens["stale"])  # at head 1: a commit expecting head 0 is refused
    groups_before = store._writer.groups
    lock = WriteLock(sqlite_url)
    first = _step(store, "a", 0, tokens["a"])
    await asyncio.sleep(0.2)  # the writer thread now waits on the lock with "a" in hand
    rest = [
        _step(store, "b", 0, tokens["b"]),
        _step(store, "stale", 0, tokens["stale"]),
        _step(store, "fenced", 0, token=0),  # 0: no token the store issues
    ]
    lock.release()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[1] == 1
    assert isinstance(outcomes[2], ConflictError)
    assert isinstance(outcomes[3], LeaseLostError)
    assert store._writer.groups - groups_before == 2  # "a" alone, then the three that queued
    assert [r.head_seq for r in map(store.get_run, ("a", "b", "stale", "fenced")) if r] == [1, 1, 1, 0]
    assert [m.body["content"] for m in store.load("b").messages] == ["m0"]
    assert store.load("fenced").messages == []
    store.close()


async def test_the_event_loop_runs_while_a_commit_waits_for_the_database(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    _create(store, "r")
    async with Ticker() as ticker:
        lock = WriteLock(sqlite_url)
        commit = _step(store, "r", 0)
        await asyncio.sleep(0.3)
        assert not commit.done()  # not durable, so not reported
        during = ticker.ticks
        lock.release()
        assert await commit == 1
    # With the commit inline on the loop, the ticker could not have run while the lock was held.
    assert during >= 5
    store.close()


async def test_the_event_loop_runs_while_the_check_before_a_dispatch_renews_the_lease(
    sqlite_url: str,
) -> None:
    """The check before a dispatch renews a lease that is not surely fresh (here made to look stale,
    as after the loop froze past the safety margin); that renewal waits for SQLite's write lock,
    held by another connection, in a thread: the loop (every other run of the process) runs on."""
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), sqlite_url, "r")
    store = team.store
    submit_commit = store._driver.submit_commit
    locked, ticker, window = threading.Event(), Ticker(), []

    def hold_the_write_lock() -> None:
        lock = WriteLock(sqlite_url)
        locked.set()
        time.sleep(0.5)
        window.append(ticker.ticks)  # ticks counted while the lock was held
        lock.release()

    def after_a(future: asyncio.Future[int]) -> None:  # A's answer is durable: B's dispatch is next
        team._session.lease.confirmed_at = time.monotonic() - 1000
        threading.Thread(target=hold_the_write_lock).start()
        locked.wait(5)
        ticker.ticks = 0

    def spied(request: CommitRequest) -> asyncio.Future[int]:
        future = submit_commit(request)
        if request.step.node == "A":
            future.add_done_callback(after_a)
        return future

    store._driver.submit_commit = spied  # type: ignore[method-assign]
    async with ticker:
        result = await team.run(task="go")
    assert [m.source for m in result.messages] == ["user", "A", "B"]
    assert window and window[0] >= 10  # on the loop, the renewal would have frozen it: no tick
    assert time.monotonic() - team._session.lease.confirmed_at < 5  # the check did renew


async def test_a_cancelled_caller_does_not_cancel_its_commit(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    _create(store, "r")
    lock = WriteLock(sqlite_url)
    commit = _step(store, "r", 0)
    waiter = asyncio.ensure_future(asyncio.shield(commit))
    await asyncio.sleep(0.1)
    commit.cancel()  # even the future itself: the commit was handed over
    waiter.cancel()
    lock.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for _ in range(100):
        run = store.get_run("r")
        if run is not None and run.head_seq == 1:
            break
        await asyncio.sleep(0.02)
    assert run is not None and run.head_seq == 1
    store.close()


async def test_a_commit_refuses_a_cancellation_and_its_cancelled_awaiter_ends_once_it_is_durable(
    sqlite_url: str,
) -> None:
    """The future of a commit handed over cannot be cancelled (the commit lands all the same); a
    task awaiting it directly that is cancelled gets its cancellation once the outcome is in, and
    the outcome stays readable on the future."""
    store = Store(sqlite_url)
    _create(store, "r")
    lock = WriteLock(sqlite_url)
    commit = _step(store, "r", 0)

    async def awaits() -> int:
        return await commit

    waiter = asyncio.ensure_future(awaits())
    await asyncio.sleep(0.1)
    assert not commit.cancel()
    waiter.cancel()
    await asyncio.sleep(0.2)
    assert not waiter.done() and not commit.done()  # not durable yet: the awaiter waits for it
    lock.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert commit.result() == 1
    store.close()


async def test_close_writes_what_was_handed_over_and_refuses_more(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    _create(store, "r")
    message = MessageRecord(0, {"type": "TextMessage", "source": "r", "content": "m0"}, True)
    blocking = store._driver.commit  # the blocking form goes through the same writer
    request = CommitRequest(
        "r", expected_head=0, fencing_token=1, step=Step("complete", "A", {}), messages=[message]
    )
    assert blocking(request) == 1
    future = _step(store, "r", 1)
    store.close()
    assert future.done() or await future == 2
    with Store(sqlite_url) as again:
        assert again.get_run("r").head_seq == 2  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="closed"):
        _step(store, "r", 2)


async def test_many_runs_of_one_store_share_its_writer_and_each_ends_as_alone(store_url: str) -> None:
    """Twelve concurrent three-agent runs on one Store object: fewer groups than commits, and every
    run's transcript is the one a run alone produces."""
    alone = [Scripted(n) for n in "ABC"]
    reference = durable(alone, chain(*alone), store_url, "alone")
    await reference.run(task="go")
    expected = [source for source, _ in stored_transcript(reference)]
    store = Store(store_url)
    teams = []
    for i in range(12):
        agents = [Scripted(n) for n in "ABC"]
        teams.append(durable(agents, chain(*agents), store, f"run-{i}"))
    groups, commits = store._writer.groups, store._writer.commits
    await asyncio.gather(*(team.run(task="go") for team in teams))
    for team in teams:
        assert [source for source, _ in stored_transcript(team)] == expected
        run = team.run_info()
        assert run is not None and run.status == "finished" and run.lease_owner is None
    written = store._writer.commits - commits
    # the creation (with the first snapshot), the start, one per agent (the last gives the lease up)
    assert written == 12 * (1 + 1 + 3)
    assert store._writer.groups - groups < written
    store.close()


async def test_the_last_commit_of_a_round_gives_the_lease_up(store_url: str, monkeypatch: Any) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), store_url, "r")
    released: list[str] = []
    original = team.store._driver.release_lease
    monkeypatch.setattr(
        team.store._driver, "release_lease", lambda *a, **k: released.append(a[0]) or original(*a, **k)
    )
    await team.run(task="go")
    run = team.run_info()
    assert run is not None and run.status == "finished"
    assert run.lease_owner is None and run.lease_expires_at is None
    assert released == []  # no transaction of its own
    # The next call takes the lease again, as before.
    await team.run(task="again")
    assert team.run_info().lease_owner is None  # type: ignore[union-attr]
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B", "user", "A", "B"]


async def test_an_interrupted_run_records_its_end_and_gives_the_lease_up_in_one_commit(
    store_url: str, monkeypatch: Any
) -> None:
    agents = [Scripted(n, before=_fail if n == "B" else None) for n in "AB"]
    team = durable(agents, chain(*agents), store_url, "r")
    released: list[str] = []
    original = team.store._driver.release_lease
    monkeypatch.setattr(
        team.store._driver, "release_lease", lambda *a, **k: released.append(a[0]) or original(*a, **k)
    )
    with pytest.raises(RuntimeError, match="B broke"):
        await team.run(task="go")
    run = team.run_info()
    assert run is not None and run.status == "failed" and run.lease_owner is None
    assert released == []
    assert team.store.load("r").steps[-1].kind == "interrupt"


async def _fail(agent: Scripted, messages: Any) -> None:
    raise RuntimeError("B broke")


def test_run_update_release_lease_through_the_public_commit(store_url: str) -> None:
    with Store(store_url) as store:
        _create(store, "r")
        store._driver.commit(
            CommitRequest(
                "r",
                expected_head=0,
                fencing_token=1,
                step=Step("complete", "A", {}),
                update=RunUpdate(status="finished", release_lease=True),
            )
        )
        run = store.get_run("r")
        assert run is not None and run.lease_owner is None and run.fencing_token == 1
        assert store._driver.acquire_lease("r", "next", lease_seconds=LEASE) == 2


@pytest.mark.filterwarnings(
    "ignore:.*multi-threaded.*fork:DeprecationWarning"
)  # Python 3.12+: we fork on purpose
def test_a_forked_child_gets_a_writer_of_its_own(sqlite_url: str) -> None:
    """The parent's writer thread does not exist in a child of fork(): the child starts its own
    instead of queueing commits nobody writes."""
    store = Store(sqlite_url)
    _create(store, "r")
    step = Step("complete", "A", {})
    assert (
        store._driver.commit(CommitRequest("r", expected_head=0, fencing_token=1, step=step)) == 1
    )  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its commit is written
        try:
            ok = store._driver.commit(CommitRequest("r", expected_head=1, fencing_token=1, step=step)) == 2
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert store._driver.commit(CommitRequest("r", expected_head=2, fencing_token=1, step=step)) == 3
    store.close()


async def test_a_commit_handed_over_while_the_thread_holds_an_earlier_one_is_written_after_it(
    sqlite_url: str,
) -> None:
    """SQLite NORMAL writes a commit inline when the writer is idle. A thread that has taken an
    earlier commit of the run off its queue, and not written it yet, is not idle: the next commit
    must follow that one, not overtake it and be refused as if another writer had moved the head."""
    store = Store(f"{sqlite_url}?synchronous=NORMAL")
    _create(store, "r")
    writer = store._driver._writer
    assert writer._inline and writer._thread is None
    taken, go = threading.Event(), threading.Event()

    class Pausing(queue.SimpleQueue[Any]):
        def get(self, block: bool = True, timeout: float | None = None) -> Any:
            items = super().get(block, timeout)
            if items is not None and not taken.is_set():
                taken.set()  # as if the thread lost the interpreter right after taking them
                go.wait(10)
            return items

    writer._inbox = Pausing()
    with writer._writing:  # busy: the first commit goes to the thread
        first = _step(store, "r", 0)
    assert await asyncio.to_thread(taken.wait, 10)
    second = _step(store, "r", 1)
    go.set()
    assert (await first, await second) == (1, 2)
    assert store.get_run("r").head_seq == 2  # type: ignore[union-attr]


def test_teams_given_the_same_url_share_one_store(sqlite_url: str) -> None:
    first = durable([Scripted("A")], chain(Scripted("A")), sqlite_url, "one")
    second = durable([Scripted("A")], chain(Scripted("A")), sqlite_url, "two")
    assert first.store is second.store
    first.store.close()
    assert second._session.store is first.store  # the session keeps what it opened
    third = durable([Scripted("A")], chain(Scripted("A")), sqlite_url, "three")
    assert third.store is not first.store and not third.store.closed  # a closed one is reopened


def test_the_shared_stores_do_not_keep_a_closed_store_alive(tmp_path: Any) -> None:
    team = durable([Scripted("A")], chain(Scripted("A")), f"sqlite:///{tmp_path / 'a.db'}", "one")
    closed = weakref.ref(team.store)
    team.store.close()
    del team
    close_stores()
    other = durable([Scripted("A")], chain(Scripted("A")), f"sqlite:///{tmp_path / 'b.db'}", "two")
    assert not other.store.closed
    gc.collect()
    assert closed() is None, "a closed store stays reachable from the process's shared stores"


async def test_a_team_given_a_store_url_opens_it_off_the_event_loop(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run of a team given a store URL opens the store (engine, schema, migrations) in a
    thread, so that the other runs on the event loop do not wait for it; the run then commits as
    ever."""
    opened_on: list[int] = []

    class Watched(config.Store):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            opened_on.append(threading.get_ident())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(config, "Store", Watched)
    team = durable(
        [Scripted("A"), Scripted("B")],
        chain(Scripted("A"), Scripted("B")),
        f"sqlite:///{tmp_path / 'x.db'}",
        "r",
    )
    result = await team.run(task="go")
    assert len(opened_on) == 1 and opened_on[0] != threading.get_ident()
    assert [m.source for m in result.messages] == ["user", "A", "B"]
    assert team.store.get_run("r").status == "finished"  # type: ignore[union-attr]


async def test_a_connection_that_cannot_be_opened_is_a_store_error_naming_the_commit(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the writer's connection fails (SQLAlchemy wraps the driver's error): the caller gets
    a StoreError naming the commit, and the writer lives on."""
    store = Store(postgres_database)
    _create(store, "r")
    engine = store._e.engine
    connect = engine.raw_connection

    def refused() -> Any:
        monkeypatch.setattr(engine, "raw_connection", connect)  # once
        with sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/x?connect_timeout=2").connect():
            pass
        raise AssertionError("port 1 answered")

    monkeypatch.setattr(engine, "raw_connection", refused)
    with pytest.raises(StoreError, match=r"committing step 1 of run r failed on .*OperationalError"):
        await _step(store, "r", 0)
    assert await _step(store, "r", 0) == 1
    store.close()


async def test_a_renewal_racing_the_last_commit_is_not_a_lost_lease(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The round's last commit gives the lease up; a renewal under way in its thread then finds the
    lease released with this driver's own token: that is not another driver taking the run."""
    caplog.set_level(logging.WARNING, logger="graphflow_durable")
    store = Store(sqlite_url)
    teams = []
    for i in range(40):
        agents = [Scripted(n) for n in "AB"]
        teams.append(durable(agents, chain(*agents), store, f"r{i}", lease_seconds=0.06))  # renew every 20 ms
    await asyncio.gather(*(team.run(task="go") for team in teams))
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == []
    assert all(t.run_info().status == "finished" for t in teams)  # type: ignore[union-attr]
    store.close()


async def test_with_synchronous_normal_an_idle_writer_commits_inline(sqlite_url: str) -> None:
    """No fsync to wait for: the commit is written on the caller's thread, no hand-over (and no
    writer thread is started while none is needed)."""
    store = Store(f"{sqlite_url}?synchronous=NORMAL")
    _create(store, "r")
    written = store._writer.commits
    future = _step(store, "r", 0)
    assert future.done() and store._writer.commits == written + 1  # written before submit_commit returned
    assert await future == 1
    assert store._writer._thread is None
    store.close()


async def test_with_synchronous_normal_a_locked_database_does_not_block_the_event_loop(
    sqlite_url: str,
) -> None:
    """Inline, the commit would wait the busy timeout on the event loop: it goes to the thread."""
    store = Store(f"{sqlite_url}?synchronous=NORMAL")
    _create(store, "r")
    lock = WriteLock(sqlite_url)
    commit = _step(store, "r", 0)  # returns at once although the lock is taken
    assert store._writer._thread is not None and store._writer._thread.is_alive()
    ticks = 0
    for _ in range(20):
        await asyncio.sleep(0.01)
        ticks += 1
    assert not commit.done() and ticks == 20
    lock.release()
    assert await commit == 1
    assert store.get_run("r").head_seq == 1  # type: ignore[union-attr]
    store.close()


def _three_way_fan(before: Any) -> tuple[list[Scripted], Any]:
    """S -> (P1, P2, P3) -> J, J waiting for all three; ``before`` runs at the start of each P's turn."""
    from autogen_agentchat.teams import DiGraphBuilder

    s, j = Scripted("S"), Scripted("J")
    ps = [Scripted(f"P{i}", before=before) for i in (1, 2, 3)]
    b = DiGraphBuilder()
    for agent in (s, *ps, j):
        b.add_node(agent)
    for p in ps:
        b.add_edge(s, p).add_edge(p, j)
    b.set_entry_point(s)
    return [s, *ps, j], b.build()


async def test_the_answers_of_a_parallel_batch_ready_together_are_written_in_one_group(
    sqlite_url: str,
) -> None:
    """The first answer's commit waits on SQLite's write lock (taken when the first P's turn
    starts); the others do not wait for it to be durable: they queue behind it and share a group.
    Were each answer to wait for its own commit, every commit would be a group of its own."""
    lock: list[WriteLock] = []

    async def hold_the_write_lock(agent: Scripted, messages: Any) -> None:
        if not lock:
            lock.append(WriteLock(sqlite_url))
            asyncio.get_running_loop().call_later(0.3, lock[0].release)

    store = Store(sqlite_url)
    agents, graph = _three_way_fan(hold_the_write_lock)
    team = durable(agents, graph, store, "fan")
    commits, groups = store._writer.commits, store._writer.groups
    result = await team.run(task="go")
    assert [m.source for m in result.messages] == ["user", "S", "P1", "P2", "P3", "J"]
    written, grouped = store._writer.commits - commits, store._writer.groups - groups
    assert written == 7  # the creation (with the first snapshot), the start, then S, P1, P2, P3 and J
    assert grouped < written  # answers of the batch shared a group (the second and third at least)
    done = [s.node for s in store.load("fan").steps if s.kind == "complete"]
    assert sorted(done) == ["J", "P1", "P2", "P3", "S"] and done[-1] == "J"
    assert stored_transcript(team) == [(m.source, m.content) for m in result.messages]  # type: ignore[union-attr]
    store.close()


async def test_a_batch_whose_answers_were_handed_over_raises_the_lost_lease_and_records_none(
    store_url: str,
) -> None:
    """The driver freezes past its lease at the start of the batch and another owner takes the run:
    the answers handed over without waiting are refused, the run raises the lost lease, and nothing
    of the batch is recorded; the join never runs."""
    calls: list[str] = []
    frozen: list[bool] = []

    async def freeze_past_the_lease(agent: Scripted, messages: Any) -> None:
        if not frozen:
            frozen.append(True)
            time.sleep(0.8)  # blocks the event loop: no renewal (lease 0.5 s)
            with Store(store_url) as other:
                other._driver.acquire_lease("frozen-batch", "successor", lease_seconds=30)

    agents, graph = _three_way_fan(freeze_past_the_lease)
    for agent in agents:
        agent.calls = calls
    team = durable(agents, graph, store_url, "frozen-batch", lease_seconds=0.5)
    with pytest.raises(LeaseLostError):
        await team.run(task="go")
    assert "J" not in calls
    with Store(store_url) as store:
        run = store.get_run("frozen-batch")
        assert run is not None and run.lease_owner == "successor"
        assert [s.node for s in store.load("frozen-batch").steps if s.kind == "complete"] == ["S"]


async def test_a_new_run_is_created_by_the_writer_in_turn_with_other_runs_commits(sqlite_url: str) -> None:
    """A creation waits its turn in the writer's queue, like a commit, and shares the group written
    next (before, it ran on a thread of its own that competed for SQLite's write lock)."""
    store = Store(sqlite_url)
    _create(store, "a")
    groups_before = store._writer.groups
    lock = WriteLock(sqlite_url)
    first = _step(store, "a", 0)
    await asyncio.sleep(0.2)  # the writer thread now waits on the lock with "a" in hand
    first_step = Step(StepKind.CREATED, None, {"s": 1})
    created = store._driver.submit_create_run(
        CreateRequest(
            "new", graph_fingerprint="f", graph={}, owner="me", lease_seconds=LEASE, first_step=first_step
        )
    )
    taken = store._driver.submit_create_run(
        CreateRequest("a", graph_fingerprint="f", graph={}, owner="me", lease_seconds=LEASE)
    )
    after = _step(store, "a", 1)
    lock.release()
    outcomes = await asyncio.gather(first, created, taken, after, return_exceptions=True)
    assert outcomes[0] == 1 and outcomes[3] == 2
    assert isinstance(outcomes[2], ConflictError) and "run a already exists" in str(outcomes[2])
    record = outcomes[1]
    assert record == store.get_run("new")  # the record given back is the row as stored
    assert record.head_seq == 1 and record.lease_expires_at > time.time()
    assert record.fencing_token == 2  # the store's second token: run "a" drew the first
    assert [s.kind for s in store.load("new").steps] == ["created"]
    assert store._writer.groups - groups_before == 2  # "a" alone, then the three that queued
    store.close()


def _created(store: Store, run_id: str) -> asyncio.Future[Any]:
    first_step = Step(StepKind.CREATED, None, {"s": 1})
    return store._driver.submit_create_run(
        CreateRequest(
            run_id, graph_fingerprint="f", graph={}, owner="me", lease_seconds=LEASE, first_step=first_step
        )
    )


def _first_commit(store: Store, run_id: str) -> asyncio.Future[int]:
    return store._driver.submit_commit(
        CommitRequest(run_id, expected_head=1, fencing_token=1, step=Step(StepKind.START, None, {}))
    )


async def test_a_run_created_together_with_its_first_commit_takes_one_transaction_and_a_refused_one_takes_the_commit_with_it(
    sqlite_url: str,
) -> None:
    store = Store(sqlite_url)
    taken = _created(store, "taken")  # another driver's run, at head 1 with token 1
    assert (await taken).head_seq == 1
    groups_before = store._writer.groups
    with store._driver.together():
        futures = [
            _created(store, "new"),
            _first_commit(store, "new"),
            _created(store, "taken"),
            _first_commit(store, "taken"),  # its guard (head 1, token 1) would pass on the other's run
        ]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in futures)  # nothing is handed over before the block ends
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert outcomes[0].head_seq == 1 and outcomes[1] == 2
    assert isinstance(outcomes[2], ConflictError) and outcomes[3] is outcomes[2]
    assert store._writer.groups - groups_before == 1
    assert [s.kind for s in store.load("new").steps] == ["created", "start"]
    assert [s.kind for s in store.load("taken").steps] == ["created"]  # the other's run untouched
    store.close()


async def test_a_blocking_commit_inside_together_is_refused_and_nothing_is_written(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    with (
        store._driver.together(),
        pytest.raises(UsageError, match=r"inside together\(\).*submit_commit"),
    ):
        store._driver.create_run(
            CreateRequest("r", graph_fingerprint="f", graph={}, owner="me", lease_seconds=LEASE)
        )
    assert store.get_run("r") is None
    store.close()


class _CreatedMeanwhile(TerminationCondition):
    """A termination condition that, asked about the task (after the team attached the new run,
    before the round's first commit), lets time pass and optionally has another driver create the
    same run id meanwhile."""

    def __init__(self, url: str, run_id: str | None, wait: float = 0.0) -> None:
        self._url, self._run_id, self._wait = url, run_id, wait
        self.before: Callable[[Sequence[BaseAgentEvent | BaseChatMessage]], Awaitable[None]] | None = None

    @property
    def terminated(self) -> bool:
        return False

    async def __call__(self, messages: Sequence[BaseAgentEvent | BaseChatMessage]) -> StopMessage | None:
        await asyncio.sleep(self._wait)
        if self.before is not None:
            before, self.before = self.before, None
            await before(messages)
        if self._run_id is not None:
            with Store(self._url) as other:
                other._driver.create_run(
                    CreateRequest(
                        self._run_id, graph_fingerprint="other", graph={}, owner="other", lease_seconds=LEASE
                    )
                )
            self._run_id = None
        return None

    async def reset(self) -> None:
        pass


@pytest.mark.parametrize(
    "backend", ["sqlite FULL", "sqlite NORMAL (inline)", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_new_run_is_created_in_the_transaction_of_its_first_commit(
    backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "postgres":
        url = str(request.getfixturevalue("postgres_database"))
    else:
        url = str(request.getfixturevalue("sqlite_url")) + (
            "?synchronous=NORMAL" if "NORMAL" in backend else ""
        )
    a, b = Scripted("a"), Scripted("b")
    team = durable([a, b], chain(a, b), url, "folded")
    store = team.store
    groups_before = store._writer.groups
    result = await team.run(task="go")
    assert [m.source for m in result.messages] == ["user", "a", "b"]
    steps = store.load("folded").steps
    assert [s.kind for s in steps] == ["created", "start", "complete", "complete"]
    assert store._writer.groups - groups_before == len(steps) - 1  # created + start: one transaction
    assert store.get_run("folded").status == "finished"


async def test_a_run_created_by_another_driver_before_the_first_commit_is_refused_and_left_untouched(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    a, b = Scripted("a", calls=calls), Scripted("b", calls=calls)
    team = durable(
        [a, b], chain(a, b), sqlite_url, "raced", termination=_CreatedMeanwhile(sqlite_url, "raced")
    )
    with pytest.raises(ConflictError, match="run raced already exists"):
        await team.run(task="go")
    assert calls == []  # nothing was dispatched
    with Store(sqlite_url) as store:
        run = store.get_run("raced")
        assert run is not None
        assert (run.graph_fingerprint, run.lease_owner, run.status, run.head_seq) == (
            "other",
            "other",
            "running",
            0,
        )
        assert store.load("raced").steps == []
    assert "lease" not in caplog.text  # no renewal nor release was tried on the other's run


async def test_the_lease_is_not_renewed_before_the_run_it_is_created_with_exists(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With a lease of 0.15 s (renewed every 0.05 s) and 0.4 s between attach and the first commit,
    the renewer runs while the run is not stored yet: it must neither find it missing nor halt."""
    calls: list[str] = []
    a, b = Scripted("a", calls=calls), Scripted("b", calls=calls)
    team = durable(
        [a, b],
        chain(a, b),
        sqlite_url,
        "slow-start",
        termination=_CreatedMeanwhile(sqlite_url, None, 0.4),
        lease_seconds=0.15,
    )
    result = await team.run(task="go")
    assert calls == ["a", "b"] and [m.source for m in result.messages] == ["user", "a", "b"]
    assert team.store.get_run("slow-start").status == "finished"
    assert "lease" not in caplog.text


async def test_after_a_refused_creation_the_next_run_takes_the_other_drivers_run_over_and_renews_its_lease(
    sqlite_url: str,
) -> None:
    """The other driver made the run with the same graph and died (its lease expires): the next
    run() of the refused team takes it over, runs it, and keeps its lease renewed all along."""
    lease = 0.3
    leases_seen: list[float] = []

    async def outlive_the_lease(agent: Scripted, messages: Any) -> None:
        await asyncio.sleep(3 * lease)  # renewals every lease / 3 keep the lease alive meanwhile
        with Store(sqlite_url) as other:
            run = other.get_run("taken-over")
            assert run is not None and run.lease_expires_at is not None
            leases_seen.append(run.lease_expires_at - time.time())

    calls: list[str] = []
    a, b = Scripted("a", calls=calls), Scripted("b", calls=calls, before=outlive_the_lease)
    spec = GraphSpec.from_digraph(chain(a, b))
    raced = _CreatedMeanwhile(sqlite_url, None)
    team = durable([a, b], chain(a, b), sqlite_url, "taken-over", termination=raced, lease_seconds=lease)

    async def create_as_another_driver(messages: Any) -> None:
        with Store(sqlite_url) as other:  # the same graph, a first step, a short lease, another host
            other._driver.create_run(
                CreateRequest(
                    "taken-over",
                    graph_fingerprint=team._session.fingerprint,
                    graph=team._session.graph_description,
                    owner="other",
                    lease_seconds=0.05,
                    host="elsewhere",
                    pid=1,
                    first_step=Step(StepKind.CREATED, None, Cursor.fresh(initial(spec)).to_json(spec)),
                )
            )

    raced.before = create_as_another_driver
    with pytest.raises(ConflictError, match="run taken-over already exists"):
        await team.run(task="go")
    assert calls == []
    await asyncio.sleep(0.1)  # the other driver's lease expires
    result = await team.run(task="go")
    assert calls == ["a", "b"] and [m.source for m in result.messages] == ["user", "a", "b"]
    assert leases_seen and leases_seen[0] > 0, leases_seen  # still leased after 3 lease lengths
    run = team.store.get_run("taken-over")
    assert run is not None and run.status == "finished" and run.fencing_token == 2


async def test_a_commit_writes_each_table_in_one_statement_and_checks_its_guard_in_the_head_update(
    store_url: str,
) -> None:
    creator = Store(store_url)  # so that the commit's store checks its writer's connection out traced
    token = _create(creator, "r").fencing_token
    creator.close()
    store = Store(store_url)
    messages = [
        MessageRecord(seq, {"type": "TextMessage", "source": "A", "content": f"m{seq}"}, True)
        for seq in range(3)
    ]
    states = [AgentStateRecord("A", {"turn": 1}), AgentStateRecord("B", {"turn": 0})]
    request = CommitRequest(
        "r",
        expected_head=0,
        fencing_token=token,
        step=Step("complete", "A", {}),
        messages=messages,
        agent_states=states,
    )
    with statements(store) as seen:
        assert await store._driver.submit_commit(request) == 1
    if store_url.startswith("sqlite"):
        kinds = [re.match(r"BEGIN IMMEDIATE|COMMIT|UPDATE \w+|INSERT INTO \w+", sql) for sql in seen]
        assert [kind.group() if kind else sql for kind, sql in zip(kinds, seen, strict=True)] == [
            "BEGIN IMMEDIATE",
            "UPDATE graphflow_runs",  # the guard (head, token, message count) and the move
            "INSERT INTO graphflow_steps",
            "INSERT INTO graphflow_messages",
            "INSERT INTO graphflow_agent_states",
            "COMMIT",
        ]
    else:  # the followers' notification: one statement, in a transaction of its own
        assert seen == ["BEGIN", "UPDATE 1", "INSERT 0 1", "INSERT 0 3", "INSERT 0 2", "COMMIT", "SELECT 1"]
    log = store.load("r")
    assert [m.body["content"] for m in log.messages] == ["m0", "m1", "m2"]
    assert log.agent_states == {"A": {"turn": 1}, "B": {"turn": 0}}
