"""The write paths of retries and crash-loop protection under real faults.

- a failed attempt's ``attempt_failed`` commit (a node raising a retryable error under a retry
  policy, with attempts left or its last) with PostgreSQL stopped or on a full disk, for good or
  only for that commit (the database back for the driver's clean-up); a driver frozen past its
  lease before that commit or in the back-off after it, while another took the run over; a short
  PostgreSQL outage in the back-off;
- the resume step that counts a crash (a resume of a run whose process was SIGKILLed during a
  turn), and the one that fails the run for a crash loop, under the same faults;
- ``Store.retry_run`` of a run whose budget ran out, with PostgreSQL stopped and on a full disk.

Each fault is one :class:`StoreError` (or, for the frozen driver, nothing written at all); no step
is lost or written twice; a failure or a crash is counted exactly once; and once the fault is gone a
resume finishes the run with the transcript of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable import NodeFailedError, RetryPolicy
from graphflow_durable._storage.driver import CommitRequest
from graphflow_durable.errors import StoreError
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import StepKind, Store
from pgserver import Server
from processes import run_script
from smalldisk import SmallDisk

from .test_write_path_faults import Strike, one_store_error, rows, stop

WORKER = Path(__file__).resolve().parents[1] / "crash" / "crash_loop_worker.py"
LEASE = 1.0
FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from Server.serve()


@pytest.fixture
def database(server: Server) -> Iterator[str]:
    yield from server.database()


class Fault:
    """One way to break the commit of a step of a given kind, struck just before the commit goes to
    the store's writer (which writes through the driver's own cursor, unseen by SQLAlchemy's
    events): a full disk (SQLite) or PostgreSQL stopped (``-m immediate``), either for good (the
    test heals it) or ``briefly``: healed as soon as that commit failed, so the driver's clean-up
    after it (recording how the run ended, releasing the lease) reaches the database."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.briefly = kind.endswith("-briefly")
        self.fired = False
        if kind.startswith("full-disk"):
            self.disk: SmallDisk = request.getfixturevalue("small_disk")
            self.url = f"sqlite:///{self.disk.path / 'runs.db'}"
        else:
            self.server: Server = request.getfixturevalue("server")
            self.url = str(request.getfixturevalue("database"))
        self._down = False

    def strike(self) -> None:
        self.fired = self._down = True
        if self.kind.startswith("full-disk"):
            self.disk.fill()
        else:
            self.server.down()

    def heal(self) -> None:
        if self._down:
            self._down = False
            if self.kind.startswith("full-disk"):
                self.disk.free()
            else:
                self.server.up()

    def arm(self, team: DurableGraphFlow, kind: StepKind) -> None:
        """Strike once, just before the first commit of a ``kind`` step is handed to the writer."""
        driver = team.store._driver
        submit = driver.submit_commit

        def struck(request: CommitRequest) -> Any:
            if self.fired or request.step.kind is not kind:
                return submit(request)
            self.strike()
            future = submit(request)
            if self.briefly:
                future.add_done_callback(lambda _f: self.heal())
            return future

        driver.submit_commit = struck  # type: ignore[method-assign]


FAULTS = [
    pytest.param("full-disk", id="full-disk"),
    pytest.param("full-disk-briefly", id="full-disk-briefly"),
    pytest.param("postgres-stopped", id="postgres-stopped", marks=pytest.mark.postgres),
    pytest.param("postgres-stopped-briefly", id="postgres-stopped-briefly", marks=pytest.mark.postgres),
]


def steps(url: str, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    """``(kind, node, scheduler)`` of every stored step of ``run_id``, in order (read with plain
    SQLAlchemy: the store reads back the head's scheduler state only)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT kind, node, scheduler FROM graphflow_steps WHERE run_id = :r ORDER BY seq"),
                {"r": run_id},
            )
            return [(kind, node, json.loads(scheduler)) for kind, node, scheduler in found]
    finally:
        engine.dispose()


def step_kinds(url: str, run_id: str) -> list[str]:
    return [kind for kind, _, _ in steps(url, run_id)]


# -- the crash-count resume ---------------------------------------------------------------------


RUN = "poison-run"


def poison_team(url: str, calls: list[str], most: int, owner: str) -> DurableGraphFlow:
    """The graph of ``crash_loop_worker.py`` (A -> K -> B), K answering, driven in this process."""
    a, k, b = agents = [Scripted(n, calls=calls) for n in ("A", "K", "B")]
    return durable(
        agents, chain(a, k, b), url, RUN, max_crash_attempts=most, lease_seconds=LEASE, lease_owner=owner
    )


def died_during_k(url: str, tmp_path: Path, most: int) -> None:
    """A real process drives the run and SIGKILLs itself in K's turn: the run is left ``running``."""
    proc = run_script(WORKER, url, RUN, str(most), "kill", exec_log=tmp_path / "exec.log")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Store(url) as store:
        run = store.get_run(RUN)
        assert run is not None and run.status == "running"


def assert_left_running(url: str) -> None:
    """The run is ``running``, as the dead process left it (whether or not the failed resume could
    release its lease): the next driver counts the crash."""
    with Store(url) as store:
        run = store.get_run(RUN)
        assert run is not None and run.status == "running", run


async def resumed_after_the_fault(url: str, calls: list[str], most: int) -> Any:
    """Once the fault is healed and the failed resume's lease has expired: the next driver."""
    await asyncio.sleep(LEASE + 0.2)
    return await asyncio.wait_for(poison_team(url, calls, most, "next").run(task="go"), 30)


@pytest.mark.crash
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_resume_counting_a_crash_under_a_fault_writes_nothing_and_the_crash_counts_once(
    fault: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """K's process died once; the resume that counts that crash (and re-runs K) cannot commit.
    Nothing is written, K is not run; the next resume counts the crash once (attempt 2, one
    crash), runs K once and finishes as an uninterrupted run."""
    f = Fault(fault, request)
    died_during_k(f.url, tmp_path, most=3)
    before = steps(f.url, RUN)
    calls: list[str] = []
    team = poison_team(f.url, calls, 3, "first")
    try:
        f.arm(team, StepKind.RESUME)
        with pytest.raises(StoreError):
            await asyncio.wait_for(team.run(task="go"), 30)
        assert f.fired
    finally:
        f.heal()
    assert calls == []  # K was not dispatched by the driver that could not count its crash
    assert steps(f.url, RUN) == before
    assert_left_running(f.url)
    result = await resumed_after_the_fault(f.url, calls, 3)
    assert calls == ["K", "B"]
    assert [m.source for m in result.messages][-2:] == ["K", "B"]
    after = steps(f.url, RUN)
    assert after[: len(before)] == before
    resume = after[len(before)]  # the one step that re-dispatched K, then K's and B's answers
    assert [kind for kind, _, _ in after[len(before) :]] == ["resume", "complete", "complete"]
    assert resume[2]["crashes"] == {"K": 1} and resume[2]["attempts"] == {"K": 2}, resume
    reference = [Scripted(n) for n in ("A", "K", "B")]
    await durable(reference, chain(*reference), f.url, "reference").run(task="go")
    with Store(f.url) as store:
        assert [(m.body["source"], m.body.get("content")) for m in store.load(RUN).messages] == [
            (m.body["source"], m.body.get("content")) for m in store.load("reference").messages
        ]


@pytest.mark.crash
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_crash_loop_failing_the_run_under_a_fault_is_still_a_crash_loop_once_healed(
    fault: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``max_crash_attempts=1``: the resume after K's one crash fails the run, and that commit
    cannot be written. Once healed, the next resume fails the run the same way: K never runs again."""
    f = Fault(fault, request)
    died_during_k(f.url, tmp_path, most=1)
    before = steps(f.url, RUN)
    calls: list[str] = []
    team = poison_team(f.url, calls, 1, "first")
    f.arm(team, StepKind.INTERRUPT)
    try:
        with pytest.raises(StoreError):
            await asyncio.wait_for(team.run(task="go"), 30)
        assert f.fired
    finally:
        f.heal()
    assert steps(f.url, RUN) == before
    assert_left_running(f.url)
    with pytest.raises(NodeFailedError, match="the process died once during node K's turn"):
        await resumed_after_the_fault(f.url, calls, 1)
    assert calls == []
    with Store(f.url) as store:
        run = store.get_run(RUN)
        assert run is not None and run.status == "failed"
        assert run.result["node_failed"]["attempts"] == 1  # type: ignore[index]
    assert step_kinds(f.url, RUN) == [kind for kind, _, _ in before] + ["interrupt"]


# -- the attempt_failed commit ------------------------------------------------------------------


def failing_once(agent: Scripted, calls: list[str]) -> Any:
    """A hook raising a retryable ``ConnectionError`` on the agent's first call only."""
    left = {"n": 1}

    async def hook(agent: Scripted, messages: Any) -> None:
        if left["n"]:
            left["n"] -= 1
            raise ConnectionError(f"{agent.name}: connection reset by peer")

    return hook


def retry_team(
    url: str, calls: list[str], owner: str, *, fail: bool, retry: RetryPolicy = FAST, lease: float = LEASE
) -> DurableGraphFlow:
    """A -> B -> C under ``retry``; with ``fail``, B's first attempt raises a retryable error."""
    agents = [Scripted(n, calls=calls) for n in "ABC"]
    if fail:
        agents[1].before = failing_once(agents[1], calls)
    return durable(
        agents, chain(*agents), url, "retried", retry=retry, lease_seconds=lease, lease_owner=owner
    )


async def reference_transcript(url: str) -> list[tuple[str, str]]:
    agents = [Scripted(n) for n in "ABC"]
    team = durable(agents, chain(*agents), url, "reference")
    await team.run(task="go")
    return stored_transcript(team)


#: A failed attempt with attempts left (``attempt_failed`` and a retry), and the last one (its
#: ``attempt_failed`` commit also records the run ``failed`` with its ``node_failed`` marker).
BUDGETS = [pytest.param(FAST, id="retried"), pytest.param(RetryPolicy(max_attempts=1), id="exhausted")]


@pytest.mark.parametrize("policy", BUDGETS)
@pytest.mark.parametrize("fault", FAULTS)
async def test_an_attempt_failed_commit_under_a_fault_is_a_store_error_and_the_resume_finishes_once(
    fault: str, policy: RetryPolicy, request: pytest.FixtureRequest
) -> None:
    """B's first attempt raises a retryable error; its ``attempt_failed`` commit cannot be written.
    run() raises the StoreError, B is not retried by that driver and nothing of the failure is
    stored; the run is left ``running`` (also when the database is back for the driver's clean-up),
    so the next driver counts that attempt once (as a turn whose outcome was never recorded: a
    crash, see docs/lifecycle.md), runs B once more and finishes with the transcript of an
    uninterrupted run. (The exhausted case too: a failure that was never recorded spends no
    budget.)"""
    f = Fault(fault, request)
    calls: list[str] = []
    team = retry_team(f.url, calls, "first", fail=True, retry=policy)
    f.arm(team, StepKind.ATTEMPT_FAILED)
    try:
        with pytest.raises(StoreError):
            await asyncio.wait_for(team.run(task="go"), 30)
        assert f.fired
    finally:
        f.heal()
    assert calls == ["A", "B"]  # no retry after a failure that could not be recorded
    with Store(f.url) as store:
        assert store.get_run("retried").status == "running"  # type: ignore[union-attr]
    before = steps(f.url, "retried")
    assert [(kind, node) for kind, node, _ in before][-1] == ("complete", "A")
    assert "attempt_failed" not in [kind for kind, _, _ in before]
    await asyncio.sleep(LEASE + 0.2)
    again = retry_team(f.url, calls, "next", fail=False, retry=policy)
    await asyncio.wait_for(again.run(task="go"), 30)
    assert calls == ["A", "B", "B", "C"]
    after = steps(f.url, "retried")
    assert after[: len(before)] == before
    assert [(kind, node) for kind, node, _ in after[len(before) :]] == [
        ("resume", None),
        ("complete", "B"),
        ("complete", "C"),
    ]
    resume = after[len(before)][2]
    assert resume["attempts"] == {"B": 2} and resume["crashes"] == {"B": 1}, resume
    assert "failures" not in resume
    assert stored_transcript(again) == await reference_transcript(f.url)


@pytest.mark.postgres
@pytest.mark.parametrize("start", ["in-the-back-off", "at-the-state-reload"])
async def test_a_short_postgres_outage_in_a_retry_back_off_is_slept_out_or_one_store_error(
    start: str, server: Server, database: str
) -> None:
    """B's first attempt fails; its ``attempt_failed`` step is committed, the agent's state is read
    back, and ``run()`` sleeps out a 3 s back-off holding its lease (4 s: halted only after 2.7 s
    without a renewal). PostgreSQL stopped for 1.2 s ``in-the-back-off`` (after that read): the
    renewal retries through it, B runs once more when the back-off ends, and the run finishes as an
    uninterrupted run, one failure stored, no crash. Stopped ``at-the-state-reload`` (just after the
    commit): reading the state fails, run() raises that StoreError, and the next driver finishes the
    run with the stored failure counted once and no crash (B was backing off, not running)."""
    calls: list[str] = []
    slow = RetryPolicy(max_attempts=3, initial_interval=3.0, jitter=False)
    team = retry_team(database, calls, "first", fail=True, retry=slow, lease=4.0)
    outage: list[asyncio.Future[None]] = []

    async def down_and_up() -> None:
        await asyncio.to_thread(server.down)
        await asyncio.sleep(1.2)
        await asyncio.to_thread(server.up)

    if start == "in-the-back-off":
        turns = team._session.turns
        stored_state = turns.stored_state

        async def then_outage(run_id: str, node: str) -> Any:
            state = await stored_state(run_id, node)
            outage.append(asyncio.ensure_future(down_and_up()))
            return state

        turns.stored_state = then_outage  # type: ignore[method-assign]
    else:
        commits = team._session.commits
        write = commits.write

        async def outage_after(step: Any, *args: Any, **how: Any) -> int:
            head = await write(step, *args, **how)
            if step.kind is StepKind.ATTEMPT_FAILED:
                await asyncio.to_thread(server.down)
                outage.append(asyncio.ensure_future(asyncio.sleep(1.2)))
            return head

        commits.write = outage_after  # type: ignore[method-assign]
    try:
        if start == "in-the-back-off":
            result = await asyncio.wait_for(team.run(task="go"), 30)
            assert result.stop_reason is not None and "stopped dispatching" not in result.stop_reason
        else:
            with pytest.raises(StoreError, match="loading run retried failed"):
                await asyncio.wait_for(team.run(task="go"), 30)
    finally:
        if outage:
            await outage[0]
        if start != "in-the-back-off":
            server.up()
    assert outage
    if start != "in-the-back-off":
        assert calls == ["A", "B"]
        await asyncio.sleep(4.2)  # the failed driver's lease expires
        again = retry_team(database, calls, "next", fail=False, retry=slow, lease=4.0)
        await asyncio.wait_for(again.run(task="go"), 30)
    assert calls == ["A", "B", "B", "C"]
    assert stored_transcript(team) == await reference_transcript(database)
    found = steps(database, "retried")
    assert [(kind, node) for kind, node, _ in found].count(("attempt_failed", "B")) == 1
    resume = next(sched for kind, _, sched in found if kind == "resume")
    assert resume["attempts"] == {"B": 2} and resume["failures"] == {"B": 1}, resume
    # B's failure was recorded and B was backing off, not running: no crash, whichever way it ended.
    assert resume.get("crashes", {}) == {}, resume


async def _frozen_at_the_failure(url: str, calls: list[str], *, when: str) -> None:
    """B's first attempt fails; the driver freezes past its lease (its event loop blocked, as
    under SIGSTOP) ``before`` its ``attempt_failed`` commit or ``after`` it (in the back-off), while
    another owner takes the run over; then it wakes up."""
    team = retry_team(url, calls, "first", fail=True)
    commits = team._session.commits
    write = commits.write

    def take_over() -> None:
        time.sleep(LEASE + 0.2)
        with Store(url) as other:
            other._driver.acquire_lease("retried", "successor", lease_seconds=30)

    def freeze() -> None:
        thief = threading.Thread(target=take_over)
        thief.start()
        thief.join()  # blocks the event loop: no renewal, no dispatch, until after the takeover

    async def frozen_write(step: Any, *args: Any, **how: Any) -> int:
        if step.kind is StepKind.ATTEMPT_FAILED and when == "before":
            freeze()
        head = await write(step, *args, **how)
        if step.kind is StepKind.ATTEMPT_FAILED and when == "after":
            freeze()
        return head

    commits.write = frozen_write  # type: ignore[method-assign]
    if when == "before":
        with pytest.raises(StoreError):  # the stale driver's commit is refused by its fencing token
            await asyncio.wait_for(team.run(task="go"), 30)
    else:  # woken in the back-off: the lost lease halts the round quietly, before B's dispatch
        await asyncio.wait_for(team.run(task="go"), 30)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_driver_frozen_past_its_lease_at_a_failed_attempt_writes_nothing_after_a_takeover(
    backend: str, when: str, request: pytest.FixtureRequest
) -> None:
    """Frozen before the ``attempt_failed`` commit: that commit is refused, nothing of the failure
    is stored. Frozen after it, in the back-off: the failure is stored once and the re-dispatch is
    refused. Either way B is not run again by the stale driver, and the successor finishes the run
    with B's failure counted once (or not at all, when it was never stored) and the transcript of an
    uninterrupted run."""
    url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "postgres_database"))
    calls: list[str] = []
    await _frozen_at_the_failure(url, calls, when=when)
    assert calls == ["A", "B"]  # B's retry belongs to the successor
    before = steps(url, "retried")
    failed = [kind for kind, _, _ in before].count("attempt_failed")
    assert failed == (1 if when == "after" else 0)
    with Store(url) as store:
        run = store.get_run("retried")
        assert run is not None and run.lease_owner == "successor" and run.status == "running"
    successor = retry_team(url, calls, "successor", fail=False)
    await asyncio.wait_for(successor.run(task="go"), 30)
    assert calls == ["A", "B", "B", "C"]
    after = steps(url, "retried")
    assert after[: len(before)] == before
    assert [(kind, node) for kind, node, _ in after[len(before) :]] == [
        ("resume", None),
        ("complete", "B"),
        ("complete", "C"),
    ]
    resume = after[len(before)][2]
    assert resume["attempts"] == {"B": 2}, resume
    assert resume.get("failures", {}) == ({"B": 1} if when == "after" else {}), resume
    assert stored_transcript(successor) == await reference_transcript(url)


# -- Store.retry_run of a run whose budget ran out ------------------------------------------------


async def exhausted(url: str, calls: list[str]) -> None:
    """Run ``retried`` with B failing on each of its ``FAST.max_attempts`` attempts: it ends
    ``failed`` with its ``node_failed`` marker (the budget ran out)."""
    agents = [Scripted(n, calls=calls) for n in "ABC"]

    async def always(agent: Scripted, messages: Any) -> None:
        raise ConnectionError(f"{agent.name}: connection reset by peer")

    agents[1].before = always
    team = durable(agents, chain(*agents), url, "retried", retry=FAST, lease_seconds=LEASE)
    with pytest.raises(NodeFailedError):
        await asyncio.wait_for(team.run(task="go"), 30)
    close_stores()
    assert calls == ["A", "B", "B", "B"]


@pytest.mark.parametrize(
    "fault", [pytest.param("full-disk"), pytest.param("postgres-stopped", marks=pytest.mark.postgres)]
)
async def test_retry_run_of_an_exhausted_run_under_a_fault_changes_nothing_and_works_once_healed(
    fault: str, request: pytest.FixtureRequest
) -> None:
    """The fresh budget is one UPDATE of the run's row: under a fault it is one StoreError naming
    the action, the database is as before (the run still ``failed``: run() still refuses it without
    dispatching B), and once healed the same call gives B its fresh budget."""
    f = Fault(fault, request)
    calls: list[str] = []
    await exhausted(f.url, calls)
    before = rows(f.url)
    with Store(f.url) as store:
        try:
            if f.kind == "full-disk":
                f.strike()
                with pytest.raises(StoreError) as raised:
                    store.retry_run("retried")
            else:
                with (
                    Strike(r"UPDATE graphflow_runs", stop(f.server)) as strike,
                    pytest.raises(StoreError) as raised,
                ):
                    store.retry_run("retried")
                assert strike.fired
                f._down = True
        finally:
            f.heal()
        one_store_error(raised.value, "retrying run retried")
        assert rows(f.url) == before
    refused = retry_team(f.url, calls, "next", fail=False)
    with pytest.raises(NodeFailedError):
        await asyncio.wait_for(refused.run(), 30)
    assert calls == ["A", "B", "B", "B"]  # no budget given: B is not dispatched
    close_stores()
    with Store(f.url) as store:
        assert store.retry_run("retried").status == "interrupted"
    again = retry_team(f.url, calls, "again", fail=False)
    await asyncio.wait_for(again.run(), 30)
    assert calls == ["A", "B", "B", "B", "B", "C"]  # B once more with its fresh budget, then C
    assert stored_transcript(again) == await reference_transcript(f.url)
    failed = [(kind, node) for kind, node, _ in steps(f.url, "retried") if kind == "attempt_failed"]
    assert failed == [("attempt_failed", "B")] * 3  # each failure stored once, none for the fault
