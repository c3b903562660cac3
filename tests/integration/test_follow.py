"""Following a run from another process, read-only: ``Store.follow``, ``attach_stream`` (module
level and on the team) and ``graphflow-durable runs follow``, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from autogen_agentchat.base import TaskResult
from autogen_agentchat.ui import Console

from graphflow_durable import DurableGraphFlow, HumanInput, RunNotFoundError, Store, UsageError, attach_stream
from graphflow_durable._storage import follow as follow_module
from graphflow_durable._storage.driver import CommitRequest
from graphflow_durable.cli import timeline
from graphflow_durable.cli.runs import EXIT_USAGE, main
from graphflow_durable.errors import ConflictError, LeaseLostError
from graphflow_durable.store import RunUpdate, Step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain

from .test_group_writer import _create, _step

DRIVER = Path(__file__).with_name("follow_driver.py")
SEQ = "graphflow_durable.seq"


class Driver:
    """The run ``r`` driven by another process, held at B's turn until :meth:`open` (step 3, the
    completion of A, is then the run's head)."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.gate = tmp_path / "gate"
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), url, "r", str(self.gate)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_held(self, store: Store) -> int:
        """Wait until B's turn waits at the gate; the run's head then."""
        deadline = time.monotonic() + 60
        while not self.gate.with_suffix(".waiting").exists():
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the driver never reached B's turn"
            time.sleep(0.02)
        run = store.get_run("r")
        assert run is not None
        return run.head_seq

    def open(self) -> None:
        self.gate.touch()

    def result(self) -> dict[str, object]:
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return dict(json.loads(out.splitlines()[-1]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()  # reaped, its pipes closed (also when it ended by itself)


@pytest.fixture
def driver(store_url: str, tmp_path: Path) -> Iterator[Driver]:
    d = Driver(store_url, tmp_path)
    try:
        yield d
    finally:
        d.stop()


async def collect(stream: object) -> list[object]:
    return [item async for item in stream]  # type: ignore[attr-defined]


async def test_a_watcher_attached_mid_run_gets_every_later_message_once_in_order_then_the_result(
    store: Store, driver: Driver
) -> None:
    head = driver.wait_held(store)
    assert head == 3  # created, the round's start (the task), A's answer
    run = store.get_run("r")
    assert run is not None and run.status == "running"
    after = run.message_count - 1  # the last message of step 3
    watcher = asyncio.ensure_future(collect(attach_stream(store, "r", after_seq=after)))
    raw = asyncio.ensure_future(collect(store.follow("r", after)))
    await asyncio.sleep(0.3)
    assert not watcher.done() and not raw.done()  # the round goes on: they wait for its commits
    driver.open()
    items = await asyncio.wait_for(watcher, 60)
    stored_after = await asyncio.wait_for(raw, 60)
    returned = driver.result()

    transcript = store.transcript("r")
    expected = [m for m in transcript if m.seq > after]
    assert expected[0].step_seq == 4
    messages, result = items[:-1], items[-1]
    assert [int(m.metadata[SEQ]) for m in messages] == [m.seq for m in expected]  # type: ignore[attr-defined]
    assert [m.id for m in messages] == [m.body["id"] for m in expected]  # type: ignore[attr-defined]
    assert [m.source for m in messages] == ["B", "C", "D", "E", "F"]  # type: ignore[attr-defined]
    assert [(m.seq, m.body) for m in stored_after] == [(m.seq, m.body) for m in expected]
    assert isinstance(result, TaskResult)
    assert result.stop_reason == returned["stop_reason"] and result.stop_reason is not None
    assert [m.id for m in result.messages] == returned["ids"]


async def test_runs_follow_prints_the_messages_as_they_come_and_ctrl_c_exits_0(
    store: Store, store_url: str, driver: Driver
) -> None:
    driver.wait_held(store)
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", "follow", "r", "--store", store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()  # flushed as printed
        assert first.startswith("[0] user: go") and second.startswith("[1] A: ")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # its pipes closed, whatever happened
    assert proc.returncode == 0, err
    assert "Traceback" not in err


async def test_a_watcher_of_a_finished_run_gets_its_messages_and_result_at_once(store_url: str) -> None:
    agents = [Scripted(n) for n in "ABC"]
    team = DurableGraphFlow(agents, chain(*agents), store=store_url, run_id="done")
    returned = await team.run(task="go")
    watched = await asyncio.wait_for(collect(team.attach_stream()), 30)
    messages, result = watched[:-1], watched[-1]
    assert [m.id for m in messages] == [m.id for m in returned.messages]  # type: ignore[attr-defined]
    assert [m.metadata[SEQ] for m in messages] == ["0", "1", "2", "3"]  # type: ignore[attr-defined]
    assert isinstance(result, TaskResult)
    assert result.stop_reason == returned.stop_reason
    assert [m.id for m in result.messages] == [m.id for m in returned.messages]
    later = await asyncio.wait_for(collect(team.attach_stream(after_seq=2)), 30)
    assert [m.metadata[SEQ] for m in later[:-1]] == ["3"]  # type: ignore[attr-defined]
    assert [m.seq for m in await collect(team.store.follow("done", 1, wait=False))] == [2, 3]


async def test_a_watcher_of_a_run_that_parks_for_a_person_gets_the_waiting_stop_reason(
    store_url: str,
) -> None:
    from autogen_agentchat.agents import UserProxyAgent
    from autogen_agentchat.teams import DiGraphBuilder

    started = asyncio.Event()

    async def hold(agent: Scripted, messages: object) -> None:
        started.set()
        await asyncio.sleep(0.3)  # the watcher attaches while the round runs

    a, c = Scripted("A", before=hold), Scripted("C")
    h = UserProxyAgent("H", input_func=lambda prompt: "typed")
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    team = DurableGraphFlow([a, h, c], graph, store=store_url, run_id="park", human_input=HumanInput("wait"))
    running = asyncio.ensure_future(team.run(task="go"))
    await started.wait()
    with Store(store_url) as other:  # another store object, as another process would have
        watched = await asyncio.wait_for(collect(attach_stream(other, "park")), 30)
    parked = await running
    result = watched[-1]
    assert isinstance(result, TaskResult)
    assert parked.stop_reason is not None and parked.stop_reason.startswith("waiting for input: H")
    assert result.stop_reason == parked.stop_reason
    assert [m.source for m in watched[:-1]] == ["user", "A"]  # type: ignore[attr-defined]


async def test_console_prints_an_attached_stream(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = DurableGraphFlow(agents, chain(*agents), store=store_url, run_id="c")
    await team.run(task="go")
    result = await Console(team.attach_stream())
    assert isinstance(result, TaskResult)
    out = capsys.readouterr().out
    assert "---------- TextMessage (A) ----------" in out and "B#1 saw" in out


def test_a_bad_offset_is_refused_at_the_call(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (-1, "3", 1.5, True):
        with pytest.raises(UsageError, match="after_seq must be a message seq"):
            store.follow("r", bad)  # type: ignore[arg-type]
    assert main(["runs", "follow", "r", "--after", "-2", "--store", store.url]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--after" in err and "Traceback" not in err
    assert main(["runs", "follow", "nope", "--store", store.url]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run nope does not exist" in err


def test_runs_follow_under_a_closed_pipe_exits_cleanly(store_url: str, tmp_path: Path) -> None:
    agents = [Scripted(n) for n in "ABCDEF"]
    team = DurableGraphFlow(agents, chain(*agents), store=store_url, run_id="p")
    asyncio.run(team.run(task="go"))
    team.store.close()
    command = (
        f"{sys.executable} -m graphflow_durable.cli.runs runs follow p --store '{store_url}' 2>{tmp_path}/err"
        " | head -3; echo ${PIPESTATUS[0]}"
    )
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, env=os.environ)
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("[0] user: go"), out
    assert lines[-1] in ("0", "141")
    assert "Traceback" not in (tmp_path / "err").read_text()


async def test_on_postgresql_a_watcher_is_woken_by_the_commits_notification(
    store: Store, store_url: str, driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not store_url.startswith("postgresql"):
        pytest.skip("LISTEN/NOTIFY: PostgreSQL only (SQLite polls)")
    monkeypatch.setattr(follow_module, "LISTEN_POLL", 3600.0)  # no poll would ever wake it in time
    driver.wait_held(store)
    run = store.get_run("r")
    assert run is not None
    watcher = asyncio.ensure_future(collect(store.follow("r", run.message_count - 1)))
    await asyncio.sleep(0.3)
    driver.open()
    messages = await asyncio.wait_for(watcher, 60)
    assert [m.body["source"] for m in messages] == ["B", "C", "D", "E", "F"]
    driver.result()


async def test_watchers_of_one_run_in_one_process_each_get_exactly_their_messages_whenever_they_attach(
    store: Store, driver: Driver
) -> None:
    driver.wait_held(store)
    offsets = [None, 0, 1, 3, 5, None, 2, 4]
    watchers = []
    for i, after in enumerate(offsets):
        watchers.append(asyncio.ensure_future(collect(store.follow("r", after))))
        if i == 1:
            driver.open()  # the others attach while the commits land
        await asyncio.sleep(0.07)
    got = await asyncio.wait_for(asyncio.gather(*watchers), 60)
    driver.result()
    transcript = store.transcript("r")
    for after, messages in zip(offsets, got, strict=True):
        start = -1 if after is None else after
        assert [(m.seq, m.body) for m in messages] == [(m.seq, m.body) for m in transcript if m.seq > start]


async def test_watchers_of_a_run_deleted_under_them_get_run_not_found(store: Store, driver: Driver) -> None:
    driver.wait_held(store)
    watchers = [asyncio.ensure_future(collect(store.follow("r"))) for _ in range(3)]
    await asyncio.sleep(0.3)
    store.delete_run("r", force=True)
    for watcher in watchers:
        with pytest.raises(RunNotFoundError, match="run r does not exist"):
            await asyncio.wait_for(watcher, 30)


def _listen(url: str) -> psycopg.Connection[Any]:
    """A connection LISTENing on the commits' channel of ``url``'s database."""
    listener = psycopg.connect(
        sa.make_url(url).set(drivername="postgresql").render_as_string(False), autocommit=True
    )
    listener.execute(f"LISTEN {follow_module.CHANNEL}")
    return listener


@pytest.mark.postgres
async def test_on_postgresql_each_written_commit_of_a_group_notifies_its_run_and_a_refused_one_nobody(
    postgres_database: str,
) -> None:
    store = Store(postgres_database)
    tokens = {run_id: _create(store, run_id).fencing_token for run_id in ("a", "b", "stale", "fenced")}
    await _step(store, "stale", 0, tokens["stale"])  # at head 1: a commit expecting head 0 is refused
    listener = _listen(postgres_database)
    try:
        with store._writer.together():  # one group: one transaction, a savepoint per commit
            futures = [
                _step(store, "a", 0, tokens["a"]),
                _step(store, "stale", 0, tokens["stale"]),
                _step(store, "b", 0, tokens["b"]),
                _step(store, "fenced", 0, token=0),  # 0: no token the store issues
            ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert outcomes[0] == 1 and outcomes[2] == 1
        assert isinstance(outcomes[1], ConflictError) and isinstance(outcomes[3], LeaseLostError)
        notes = sorted(n.payload for n in listener.notifies(timeout=1.0, stop_after=10))
        assert notes == ["a", "b"]
    finally:
        listener.close()
        store.close()


@pytest.mark.postgres
async def test_on_postgresql_a_commit_stands_when_its_followers_cannot_be_notified(
    postgres_database: str, postgres_admin: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    url = sa.make_url(postgres_database)
    schema = str(url.query["options"]).removeprefix("-csearch_path=")
    role = f"gfd_no_notify_{os.getpid()}"
    with postgres_admin.connect() as conn:  # a role that may not notify (a superuser always may)
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        conn.exec_driver_sql(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO "{role}"')
        conn.exec_driver_sql("REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC")
    agents = [Scripted(n) for n in "ABC"]
    team = DurableGraphFlow(
        agents, chain(*agents), store=url.set(username=role).render_as_string(False), run_id="r"
    )
    try:
        with caplog.at_level(logging.WARNING, logger="graphflow_durable"):
            await team.run(task="go")
        assert [m.body["source"] for m in team.store.transcript("r")] == ["user", "A", "B", "C"]
        assert "could not notify their followers (they poll instead)" in caplog.text
    finally:
        team.store.close()
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql("GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO PUBLIC")
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')


@pytest.mark.postgres
async def test_a_watchers_listen_connection_terminated_by_the_server_is_one_whole_warning_line(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends the connection a feed LISTENs on (``pg_terminate_backend``): the feed polls
    from then on, and the pool's error on closing the dead connection is one WARNING that says
    what the pool said, what failed and what the pool does."""
    caplog.set_level(logging.DEBUG)
    store = Store(postgres_database)
    try:
        _create(store, "r")  # running: its watcher waits for commits
        watcher = asyncio.ensure_future(collect(store.follow("r")))
        listening = "SELECT pid FROM pg_stat_activity WHERE query = :q AND pid <> pg_backend_pid()"
        with store._e.engine.connect() as conn:
            deadline = time.monotonic() + 30
            while not (
                pids := conn.execute(sa.text(listening), {"q": f"LISTEN {follow_module.CHANNEL}"}).all()
            ):
                assert time.monotonic() < deadline, "the watcher never listened"
                conn.rollback()  # the statistics are a snapshot per transaction
                await asyncio.sleep(0.05)
            ((pid,),) = pids
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid}).scalar()
        deadline = time.monotonic() + 30
        while not [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")]:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.05)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    finally:
        store.close()
    (pool,) = [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")]
    assert (pool.levelname, pool.exc_info) == ("WARNING", None)
    message = pool.getMessage()
    assert "%s" not in message and "\n" not in message
    assert message.count("the pool discards the connection") == 1
    # SQLAlchemy's own words first, then the driver's error.
    assert message.startswith("Exception ") and message.endswith(
        "OperationalError: the connection is lost"
    ), message


async def _replace(store: Store, messages: int) -> None:
    """Delete run ``r`` and make another run under its id, with ``messages`` messages, finished."""
    store.delete_run("r", force=True)
    again = _create(store, "r")
    for head in range(messages):
        await _step(store, "r", head, again.fencing_token)
    await store._driver.submit_commit(
        CommitRequest(
            "r",
            expected_head=messages,
            fencing_token=again.fencing_token,
            step=Step("complete", "A", {}),
            update=RunUpdate(status="finished", release_lease=True),
        )
    )


async def test_followers_of_a_run_deleted_and_made_again_under_its_id_end_with_an_error_not_its_messages(
    store: Store, store_url: str
) -> None:
    first = _create(store, "r")
    for head in range(2):
        await _step(store, "r", head, first.fencing_token)
    followers = [store.follow("r") for _ in range(2)]
    seen: list[list[int]] = [[], []]

    async def follow(index: int) -> None:
        async for message in followers[index]:
            seen[index].append(message.seq)

    watchers = [asyncio.ensure_future(follow(i)) for i in range(2)]
    watchers.append(asyncio.ensure_future(collect(attach_stream(store, "r"))))
    cli = subprocess.Popen(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", "follow", "r", "--store", store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stdout is not None
        printed = [await asyncio.to_thread(cli.stdout.readline) for _ in range(2)]
        assert [line.split()[0] for line in printed] == ["[0]", "[1]"]
        deadline = time.monotonic() + 30
        while seen != [[0, 1], [0, 1]]:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.01)
        await _replace(store, 4)  # another run, under the same id, with more messages than the first
        for watcher in watchers:
            with pytest.raises(
                RunNotFoundError,
                match=r"run r \(created .*\) was deleted while it was followed, and another run was made",
            ):
                await asyncio.wait_for(watcher, 30)
        assert seen == [[0, 1], [0, 1]]  # nothing of the run made again
        out, err = await asyncio.to_thread(cli.communicate, timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
        await asyncio.to_thread(cli.communicate)  # its pipes closed, whatever happened
    assert out == "" and cli.returncode != 0, (out, err)
    assert "was deleted while it was followed" in err and "Traceback" not in err
    # Followed again, the run under the id now is read from its start.
    assert [m.seq for m in await collect(store.follow("r"))] == [0, 1, 2, 3]


async def test_a_follower_of_a_run_deleted_between_its_reads_ends_with_run_not_found(store: Store) -> None:
    first = _create(store, "r")
    await _step(store, "r", 0, first.fencing_token)
    follow = store.follow("r")
    assert (await follow.__anext__()).seq == 0
    store.delete_run("r", force=True)
    with pytest.raises(
        RunNotFoundError,
        match=r"run r does not exist any more: it .* was deleted while it was followed; follow the run again",
    ):
        await asyncio.wait_for(follow.__anext__(), 30)


async def test_runs_follow_says_once_on_stderr_that_the_driver_is_gone_and_it_waits_for_a_takeover(
    store: Store, store_url: str, driver: Driver
) -> None:
    driver.wait_held(store)
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", "follow", "r", "--store", store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("[0] user: go")
        driver.proc.send_signal(signal.SIGKILL)  # the driver dies, its lease still unexpired
        driver.proc.communicate()  # reaped, its pipes closed
        await asyncio.sleep(3 * timeline.DRIVER_CHECK)  # it looks several times meanwhile
        assert proc.poll() is None  # still following: a takeover would go on with the run
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # its pipes closed, whatever happened
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "waiting for a driver to take it over" in line]
    assert len(said) == 1, err
    assert said[0].startswith("graphflow-durable: run r is running but its driver ")
    assert " is gone; " in said[0]
