"""Worker PROCESSES survive PostgreSQL outages and never lose a claimed run.

A throw-away PostgreSQL cluster of this module's own is stopped (``pg_ctl -m immediate``: every
connection cut, as in a crash) and started again on the same port, while real
``graphflow-durable worker`` processes drive runs of the pool test team (tests/pool/poolteam.py)
and while they poll with nothing to do; one worker is even started while the server is down.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker
from pgserver import Server

POOL = Path(__file__).resolve().parents[1] / "pool"
sys.path.insert(0, str(POOL))

from poolteam import EXPECTED_COMPLETIONS  # noqa: E402

from agents import Scripted, chain  # noqa: E402

pytestmark = pytest.mark.slow

LEASE = 3.0  # renewed every 1 s; a driver that cannot renew for 2 s stops dispatching


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from Server.serve()


@pytest.fixture
def database(server: Server) -> Iterator[str]:
    """A new database in the module's cluster (dropped afterwards)."""
    yield from server.database()


class Workers:
    """``graphflow-durable worker`` processes; their stdout/stderr in files under ``tmp``."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(POOL), os.environ.get("PYTHONPATH", "")]),
            "GFD_AGENT_DELAY": "0.15",
            "GFD_EXEC_LOG": str(self.tmp / "exec.log"),
        }
        args = [
            sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", self.url,
            "--team", "t=poolteam:team", "--concurrency", "2", "--lease-seconds", str(LEASE),
            "--poll-interval", "0.05", "--grace-seconds", "10",
        ]  # fmt: skip
        with open(self.tmp / f"worker-{n}.out", "wb") as out, open(self.tmp / f"worker-{n}.err", "wb") as err:
            proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)
        self.procs.append(proc)
        return proc

    def stderr(self, n: int) -> str:
        return (self.tmp / f"worker-{n}.err").read_text(errors="replace")

    def wait_for(self, n: int, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr(n):
            assert self.procs[n].poll() is None, f"worker {n} exited:\n{self.stderr(n)}"
            assert time.monotonic() < deadline, f"worker {n} never logged {text!r}:\n{self.stderr(n)}"
            time.sleep(0.05)

    def wait_up(self, n: int, timeout: float = 30) -> None:
        """Until worker ``n`` printed its first stdout line: from then on it handles SIGTERM (its
        store may be opened, and fail, before that: in the Worker's constructor)."""
        deadline = time.monotonic() + timeout
        out = self.tmp / f"worker-{n}.out"
        while not out.read_text(errors="replace").endswith("\n"):
            assert self.procs[n].poll() is None, f"worker {n} exited:\n{self.stderr(n)}"
            assert time.monotonic() < deadline, f"worker {n} never printed its first line:\n{self.stderr(n)}"
            time.sleep(0.05)

    def alive(self) -> None:
        for n, proc in enumerate(self.procs):
            assert proc.poll() is None, f"worker {n} exited with {proc.returncode}:\n{self.stderr(n)}"

    def terminate(self) -> list[int | None]:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=40))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
        return codes

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def workers(database: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(database, tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def outage(server: Server, seconds: float) -> None:
    server.down()
    time.sleep(seconds)
    server.up()


def finished(url: str) -> int:
    with Store(url) as store:
        return len(store.list_runs("finished"))


def in_flight(url: str) -> int:
    with Store(url) as store:
        return len([r for r in store.list_runs("running") if r.lease_owner is not None])


def check_every_run_once(url: str, run_ids: list[str]) -> None:
    """Every run finished, each node's completion recorded once per activation, no lease left."""
    with Store(url) as store:
        for run_id in run_ids:
            run = store.get_run(run_id)
            assert run is not None and run.status == "finished", (run_id, run)
            assert run.lease_owner is None, (run_id, run.lease_owner)
            done = Counter(s.node for s in store.load(run_id).steps if s.kind == "complete")
            assert done == EXPECTED_COMPLETIONS, (run_id, done)
        assert store.list_runs("running") == [] and store.list_runs("interrupted") == []


@pytest.mark.postgres
def test_worker_processes_survive_postgres_outages_and_finish_every_run_once(
    server: Server, database: str, workers: Workers
) -> None:
    runs = [f"run-{i}" for i in range(8)]
    with Store(database) as store:
        for run_id in runs:
            store.queue.submit(run_id, task=f"task {run_id}", team="t")
    workers.start()
    workers.start()
    workers.wait_for(0, "started (teams")
    workers.wait_for(1, "started (teams")
    wait_until(lambda: in_flight(database) >= 3, 30, "the runs were not claimed")

    outage(server, 2.0)  # shorter than the lease: runs in flight, renewals and commits fail
    workers.alive()
    wait_until(lambda: in_flight(database) >= 1, 30, "no run in flight after the first outage")
    outage(server, LEASE + 2.0)  # longer than the lease: the drivers stop dispatching
    workers.alive()
    wait_until(lambda: finished(database) == len(runs), 120, "not every run finished")

    outage(server, 2.0)  # the workers poll with nothing to do
    workers.alive()
    # A worker started while the database is down waits for it.
    server.down()
    try:
        late = len(workers.procs)
        workers.start()
        workers.wait_for(late, "database problem while opening the store")
        workers.alive()
    finally:
        server.up()
    workers.wait_for(late, "started (teams")
    more = ["after-0", "after-1", "after-2"]
    with Store(database) as store:
        for run_id in more:
            store.queue.submit(run_id, task=f"task {run_id}", team="t")
    wait_until(lambda: finished(database) == len(runs) + len(more), 60, "runs submitted after the outages")
    workers.alive()
    codes = workers.terminate()
    logs = [workers.stderr(n) for n in range(len(workers.procs))]
    assert codes == [0] * len(workers.procs), (codes, logs)

    check_every_run_once(database, runs + more)
    everything = "\n".join(logs)
    assert "Traceback" not in everything, everything
    for n, log in enumerate(logs):
        problems = [line for line in log.splitlines() if "database problem while" in line]
        assert problems, f"worker {n} logged no database problem:\n{log}"
        assert any("(claims paused" in line for line in problems), problems
        assert "database is back" in log, f"worker {n} logged no recovery:\n{log}"


@pytest.mark.postgres
def test_a_worker_started_while_postgres_is_down_stops_on_sigterm(
    server: Server, database: str, workers: Workers
) -> None:
    server.down()
    try:
        proc = workers.start()
        workers.wait_for(0, "database problem while opening the store")
        workers.wait_up(0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, workers.stderr(0)
    finally:
        server.up()
    assert "Traceback" not in workers.stderr(0)


class _Outage:
    """Makes the database unusable for ``seconds``: PostgreSQL stopped and started again; a SQLite
    file locked by another connection (the store's busy timeout is short: every write fails)."""

    def __init__(self, backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.backend = backend
        if backend == "postgres":
            self.server: Server = request.getfixturevalue("server")
            self.url = str(request.getfixturevalue("database"))
        else:
            self.path = tmp_path / "runs.db"
            self.url = f"sqlite:///{self.path}?timeout=0.2"

    def __call__(self, seconds: float) -> None:
        if self.backend == "postgres":
            outage(self.server, seconds)
            return
        lock = sqlite3.connect(self.path, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            lock.execute("ROLLBACK")
        finally:
            lock.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_single_worker_resumes_the_run_it_drove_through_a_short_outage(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """One worker (lease 3 s) drives A -> B -> C; while B runs (1.5 s) the database is gone for 2 s:
    B's commit, the run's end bookkeeping and the claim's release all fail, and the lease is left
    under the worker's own id. Once that lease expired the same worker claims the run again (a new
    fencing token) and finishes it: B runs again, its completion and C's are recorded once."""
    cut = _Outage(backend, request, tmp_path)
    calls: list[str] = []
    b_started = threading.Event()

    async def slow_b(agent: Scripted, messages: Sequence[Any]) -> None:
        if agent.turn == 1:  # the first driver's B: the outage falls into it
            b_started.set()
            await asyncio.sleep(1.5)

    def make_team(run_id: str, **durable: Any) -> DurableGraphFlow:
        agents = [Scripted(n, calls=calls, before=slow_b if n == "B" else None) for n in "ABC"]
        return DurableGraphFlow(agents, chain(*agents), run_id=run_id, **durable)

    with Store(cut.url) as store:
        store.queue.submit("r", task="go", team="t")
    worker = Worker(cut.url, {"t": make_team}, lease_seconds=LEASE, poll_interval=0.05)
    running = asyncio.ensure_future(worker.run_forever())
    try:
        assert await asyncio.to_thread(b_started.wait, 30)
        # SQLite fails each write after its 0.2 s busy timeout: a longer lock covers the three.
        await asyncio.to_thread(cut, 2.0 if backend == "postgres" else 2.5)
        back = time.monotonic()
        deadline = back + 20
        with Store(cut.url) as store:
            while (run := store.get_run("r")) is None or run.status != "finished":
                assert time.monotonic() < deadline, (run, worker.outcomes)
                await asyncio.sleep(0.1)
            assert run.lease_owner is None
            steps = store.load("r").steps
            assert [s.node for s in steps if s.kind == "complete"] == ["A", "B", "C"]
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)
    assert calls == ["A", "B", "B", "C"]  # B's turn was cut by the outage and ran once more
    outcomes = [(o.outcome, o.claim.fencing_token) for o in worker.outcomes]
    assert [o for o, _ in outcomes] == ["deferred", "finished"], worker.outcomes
    assert outcomes[1][1] > outcomes[0][1]  # the second claim fenced off the first driver
    assert worker.outcomes[1].claim.reason == "expired"


@pytest.mark.postgres
def test_a_pooled_connection_killed_by_a_postgres_restart_is_one_warning_line(
    server: Server, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool rolls back a connection as it comes back; a restart (``-m fast``) killed it
    meanwhile (AdminShutdown): SQLAlchemy's ERROR with a traceback becomes one WARNING line."""
    with Store(database) as store:
        conn = store._e.engine.raw_connection()
        conn.cursor().execute("SELECT 1")  # a transaction is open on the pooled connection
        server.restart()
        conn.close()  # back to the pool: its ROLLBACK fails on the dead connection
        assert store.get_run("none") is None  # the next use connects again
    pool = [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")]
    assert [(r.levelname, r.exc_info) for r in pool] == [("WARNING", None)], caplog.text
    assert "the pool discards the connection" in pool[0].getMessage()
    assert "\n" not in pool[0].getMessage()


@pytest.mark.postgres
def test_a_worker_logs_no_traceback_through_postgres_restarts(
    server: Server, database: str, workers: Workers
) -> None:
    runs = [f"run-{i}" for i in range(4)]
    with Store(database) as store:
        for run_id in runs:
            store.queue.submit(run_id, task=f"task {run_id}", team="t")
    workers.start()
    workers.wait_for(0, "started (teams")
    for _ in range(4):  # pooled connections in use and idle are terminated by each restart
        time.sleep(0.7)
        server.restart()
    wait_until(lambda: finished(database) == len(runs), 120, "not every run finished")
    assert workers.terminate() == [0], workers.stderr(0)
    log = workers.stderr(0)
    assert "Traceback" not in log, log
    pool = [line for line in log.splitlines() if "sqlalchemy.pool" in line]
    assert all(" WARNING " in line and "the pool discards" in line for line in pool), pool
    check_every_run_once(database, runs)
