"""The write paths outside a run's driver under real faults: ``respond``, ``cancel_run``,
``retry_run``, ``delete_run``, ``prune``, ``fork`` and ``import_run`` (the store's and the flow's
calls, and the ``graphflow-durable runs`` commands over them).

Each is broken for real in the middle of its transaction: a PostgreSQL server stopped (``pg_ctl
stop -m immediate``) or the call's own connection terminated (``pg_terminate_backend``) just before
the transaction's last write, and a SQLite file on a full file system. The caller gets one
:class:`StoreError` naming the action (the CLI: one line on stderr, exit 1, no traceback), the
database is exactly as it was before the call (every row of every table), and the same call
succeeds once the fault is gone.

- the calls (``respond`` and ``fork`` through the flow): PostgreSQL stopped mid-transaction; SQLite
  on a full disk;
- the commands: the connection terminated mid-transaction (in this process, where the fault can
  strike inside the command); a full disk and a stopped server, in real processes;
- ``respond`` through a partition (``tests/netproxy.py``): the error within its bound;
- ``runs export --output FILE`` on a full disk: FILE is kept as it was.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, fail_once
from graphflow_durable.cli.runs import EXIT_ERROR, EXIT_OK, main
from graphflow_durable.errors import StoreError
from graphflow_durable.store import Store
from netproxy import NetProxy
from pgserver import Server
from smalldisk import SmallDisk

from .test_flow_human_input import one
from .test_store_admin import age
from .test_store_partition import _via, proxy  # noqa: F401 (proxy: a fixture used here)

#: A failing call must end within this many seconds (a hang fails the test).
BOUND = 30.0


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


# -- the runs every case starts from ----------------------------------------------------------


async def runs(url: str, direct: str | None = None) -> dict[str, Any]:
    """Three runs, every store closed afterwards; returns the export of ``done``. ``direct``: the
    database's URL for plain SQLAlchemy, when ``url`` carries the store's own options.

    - ``asks``: A -> H -> C waiting for a person (H's request pending);
    - ``done``: A -> B -> C finished, last updated 40 days ago (what ``prune --older-than 30d`` takes);
    - ``halted``: B failed, then cancelled (what ``retry`` queues again).
    """
    asks = one(url, run_id="asks", human_input="wait")
    await asks.run(task="go")
    assert asks._session.opened_store is not None
    asks._session.opened_store.close()
    agents = [Scripted(n) for n in "ABC"]
    await durable(agents, chain(*agents), url, "done").run(task="go")
    agents = [Scripted("A"), Scripted("B", before=fail_once()), Scripted("C")]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), url, "halted").run(task="go")
    close_stores()
    with Store(url) as store:
        store.cancel_run("halted")
        document = store.export_run("done")
    raw = sa.create_engine(direct or url, poolclass=sa.NullPool)
    try:
        age(raw, "done", 40)
    finally:
        raw.dispose()
    return document


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the store, sorted: two equal results are the same database."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return {
                name: sorted(tuple(map(repr, row)) for row in conn.execute(sa.select(table)))
                for name, table in sorted(meta.tables.items())
                if name.startswith("graphflow_")
            }
    finally:
        engine.dispose()


# -- the calls ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One write path: how to call it, the statement the fault hits, how its success shows."""

    name: str
    #: the action its error names
    action: str
    #: the statement (a regex on the SQL) at which the PostgreSQL fault strikes: after the call's
    #: first writes, so a transaction that was not rolled back would show
    statement: str
    call: Callable[[Store, Mapping[str, Any]], Awaitable[Any]]
    done: Callable[[Store], None]
    cli: tuple[str, ...]


async def _respond(store: Store, document: Mapping[str, Any]) -> Any:
    return await one(store, run_id="asks", human_input="wait").respond("yes")  # type: ignore[arg-type]


def _responded(store: Store) -> None:
    request = store.requests.get("asks", "H/3")
    assert request is not None and (request.status, request.answer) == ("answered", "yes")
    assert store.get_run("asks").status == "interrupted"  # type: ignore[union-attr]


async def _cancel(store: Store, document: Mapping[str, Any]) -> Any:
    return store.cancel_run("asks")


def _cancelled(store: Store) -> None:
    assert store.get_run("asks").status == "cancelled"  # type: ignore[union-attr]


async def _retry(store: Store, document: Mapping[str, Any]) -> Any:
    return store.retry_run("halted")


def _retried(store: Store) -> None:
    assert store.get_run("halted").status == "interrupted"  # type: ignore[union-attr]


async def _delete(store: Store, document: Mapping[str, Any]) -> Any:
    return store.delete_run("done")


def _deleted(store: Store) -> None:
    assert store.get_run("done") is None and [r.run_id for r in store.list_runs()] == ["asks", "halted"]


async def _prune(store: Store, document: Mapping[str, Any]) -> Any:
    return store.prune(older_than=30 * 86400, dry_run=False)


async def _fork(store: Store, document: Mapping[str, Any]) -> Any:
    agents = [Scripted(n) for n in "ABC"]
    return durable(agents, chain(*agents), store, "done").fork(2, run_id="branch")


def _forked(store: Store) -> None:
    branch = store.get_run("branch")
    assert branch is not None and (branch.parent_run_id, branch.head_seq) == ("done", 2)
    assert [m.body for m in store.load("branch").messages] == [m.body for m in store.cut("done", 2).messages]


async def _import(store: Store, document: Mapping[str, Any]) -> Any:
    return store.import_run(document, run_id="copy")


def _imported(store: Store) -> None:
    copy = store.get_run("copy")
    assert copy is not None and copy.status == "finished"
    assert [m.body for m in store.load("copy").messages] == [m.body for m in store.load("done").messages]


CALLS = [
    Call("respond", "answering an input request of run asks", r"UPDATE graphflow_runs", _respond,
         _responded, ("respond", "asks", "yes", "--json")),
    Call("cancel", "cancelling run asks", r"UPDATE graphflow_runs", _cancel, _cancelled,
         ("cancel", "asks")),
    Call("retry", "retrying run halted", r"UPDATE graphflow_runs", _retry, _retried,
         ("retry", "halted", "--json")),
    Call("delete", "deleting run done", r"DELETE FROM graphflow_runs", _delete, _deleted,
         ("delete", "done")),
    Call("prune", "pruning runs", r"DELETE FROM graphflow_runs", _prune, _deleted,
         ("prune", "--older-than", "30d", "--json")),
    Call("fork", "forking run done at step 2", r"INSERT INTO graphflow_agent_states", _fork, _forked,
         ("fork", "done", "--at", "2", "--run-id", "branch")),
    Call("import", "importing run copy", r"INSERT INTO graphflow_agent_states", _import, _imported,
         ("import", "{document}", "--run-id", "copy", "--json")),
]  # fmt: skip


# -- the faults --------------------------------------------------------------------------------


class Strike:
    """Runs ``fault`` once, just before the first statement matching ``statement`` is sent (on any
    engine of this process: the store's, or the one a CLI command opens); the statement then runs
    on the broken connection."""

    def __init__(self, statement: str, fault: Callable[[sa.Connection], None]) -> None:
        self._pattern = re.compile(statement)
        self._fault = fault
        self.fired = False

    def _before(self, conn: sa.Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if not self.fired and self._pattern.match(statement.lstrip()):
            self.fired = True
            self._fault(conn)

    def __enter__(self) -> Strike:
        sa.event.listen(sa.Engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sa.event.remove(sa.Engine, "before_cursor_execute", self._before)


def stop(server: Server) -> Callable[[sa.Connection], None]:
    """The fault: the server stops at once (as in a crash); the test starts it again."""
    return lambda _conn: server.down()


def terminate(server: Server) -> Callable[[sa.Connection], None]:
    """The fault: the server ends the call's own connection (``pg_terminate_backend``)."""

    def fault(conn: sa.Connection) -> None:
        pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        libpq = sa.make_url(server.url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(libpq, autocommit=True) as admin:
            ended = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
        assert ended == (True,)

    return fault


def one_store_error(error: BaseException, action: str) -> str:
    assert type(error) is StoreError, repr(error)  # not a subclass: not a conflict, not "not found"
    assert isinstance(error.__cause__, sa.exc.SQLAlchemyError | psycopg.Error), repr(error.__cause__)
    message = str(error)
    assert "\n" not in message and message.startswith(f"{action} failed on "), message
    return message


@pytest.mark.postgres
@pytest.mark.parametrize("call", CALLS, ids=[c.name for c in CALLS])
async def test_a_write_path_whose_postgres_stops_mid_transaction_is_one_store_error_changes_nothing_and_works_once_back(
    call: Call, server: Server, database: str
) -> None:
    """(The commands' test below breaks the same calls by terminating their connection.)"""
    document = await runs(database)
    with Store(database) as store:
        before = rows(database)
        strike = Strike(call.statement, stop(server))
        try:
            with strike, pytest.raises(StoreError) as raised:
                await asyncio.wait_for(call.call(store, document), BOUND)
        finally:
            server.up()
        assert strike.fired
        one_store_error(raised.value, call.action)
        assert rows(database) == before
        await call.call(store, document)  # the same call, once the server is back
        call.done(store)


@pytest.mark.parametrize("call", CALLS, ids=[c.name for c in CALLS])
async def test_a_write_path_on_a_full_disk_is_one_store_error_changes_nothing_and_works_once_space_is_back(
    call: Call, small_disk: SmallDisk
) -> None:
    url = f"sqlite:///{small_disk.path / 'runs.db'}"
    document = await runs(url)
    with Store(url) as store:  # its open connection keeps the new, empty write-ahead log
        before = rows(url)
        small_disk.fill()
        try:
            with pytest.raises(StoreError) as raised:
                await asyncio.wait_for(call.call(store, document), BOUND)
        finally:
            small_disk.free()
        one_store_error(raised.value, call.action)
        assert "database or disk is full" in str(raised.value)
        assert rows(url) == before
        await call.call(store, document)
        call.done(store)


def _cli(
    capsys: pytest.CaptureFixture[str], url: str, call: Call, export: Path, *, process: bool = False
) -> tuple[int, list[str], list[str]]:
    """``graphflow-durable runs ...`` of ``call``: exit code, stdout lines, stderr lines; in this
    process (where a fault can strike mid-command) or, ``process``, in a process of its own."""
    argv = ["runs", *(str(export) if a == "{document}" else a for a in call.cli), "--store", url]
    if process:
        done = subprocess.run(
            [sys.executable, "-m", "graphflow_durable.cli.runs", *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        return done.returncode, done.stdout.splitlines(), done.stderr.splitlines()
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


#: The commands on SQLite on a full disk: those that write rows (the others share their error path).
_ON_A_FULL_DISK = ("respond", "retry", "fork", "import")


@pytest.mark.parametrize(
    ("call", "backend"),
    [
        *(pytest.param(c, "sqlite (full disk)", id=f"{c.name}-sqlite") for c in CALLS if c.name in _ON_A_FULL_DISK),
        *(pytest.param(c, "postgres (connection terminated)", id=f"{c.name}-postgres", marks=pytest.mark.postgres)
          for c in CALLS),
    ],
)  # fmt: skip
async def test_a_runs_command_under_a_fault_prints_one_line_exits_1_changes_nothing_and_works_once_healed(
    call: Call,
    backend: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    export = tmp_path / "done.json"
    if backend.startswith("sqlite"):
        disk: SmallDisk = request.getfixturevalue("small_disk")
        url = f"sqlite:///{disk.path / 'runs.db'}"
    else:
        server: Server = request.getfixturevalue("server")
        url = str(request.getfixturevalue("database"))
    export.write_text(json.dumps(await runs(url)))
    with Store(url) as store:  # (SQLite: holds the new, empty write-ahead log open)
        before = rows(url)
        if backend.startswith("sqlite"):
            disk.fill()
            try:  # a real process: its real stderr, logging included
                code, out, err = _cli(capsys, url, call, export, process=True)
            finally:
                disk.free()
        else:
            with Strike(call.statement, terminate(server)) as strike:
                code, out, err = _cli(capsys, url, call, export)
            assert strike.fired
        assert (code, out) == (EXIT_ERROR, [])
        assert len(err) == 1 and err[0].startswith(f"graphflow-durable: {call.action} failed on "), err
        assert rows(url) == before
        code, out, err = _cli(capsys, url, call, export)
        assert (code, err) == (EXIT_OK, []) and out
        call.done(store)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(120)  # a call blocking past asyncio.wait_for would escape it
async def test_a_partition_in_the_middle_of_a_respond_is_one_store_error_within_its_bound_and_changes_nothing(
    proxy: NetProxy,  # noqa: F811
    postgres_database: str,
) -> None:
    """The representative call through a blackholing proxy: the server cancels a statement after
    1 s, the client gives a silent server up 5 s later."""
    url = _via(proxy, postgres_database, statement_timeout="1", connect_timeout="2")
    call = next(c for c in CALLS if c.name == "respond")
    document = await runs(url, postgres_database)
    with Store(url) as store:
        before = rows(postgres_database)
        started = time.monotonic()
        strike = Strike(call.statement, lambda _conn: proxy.blackhole())
        with strike, pytest.raises(StoreError) as raised:
            await asyncio.wait_for(call.call(store, document), BOUND)
        took = time.monotonic() - started
        assert strike.fired
        message = one_store_error(raised.value, call.action)
        assert "s3cr3t-pw" not in message and "***" in message, message
        assert took < 15.0, took  # the answer bound (1 s + 5 s), not a hang
        print(f"respond through a partition failed after {took:.1f} s: {message}")
        proxy.heal()
        assert rows(postgres_database) == before
        await asyncio.wait_for(call.call(store, document), BOUND)
        call.done(store)


async def test_an_export_to_a_file_on_a_full_disk_is_one_line_exit_1_and_leaves_the_file_as_it_was(
    small_disk: SmallDisk, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runs export --output FILE``: the document is written whole or not at all; an older export
    in FILE is kept, and no temporary file is left behind."""
    agents = [Scripted(n) for n in "AB"]
    await durable(agents, chain(*agents), sqlite_url, "long").run(task="a long task " * 1000)
    close_stores()
    target = small_disk.path / "long.json"
    target.write_text("the previous export\n")  # one block of the file system, freed by a rewrite
    argv = ["runs", "export", "long", "--output", str(target), "--store", sqlite_url]
    small_disk.fill()
    try:
        capsys.readouterr()
        code = main(argv)
        captured = capsys.readouterr()
    finally:
        small_disk.free()
    err = captured.err.splitlines()
    assert (code, captured.out) == (EXIT_ERROR, "")
    assert len(err) == 1 and f"--output {target}: cannot write it (No space left on device)" in err[0], err
    assert target.read_text() == "the previous export\n"
    assert sorted(p.name for p in small_disk.path.iterdir()) == ["long.json"]
    assert main(argv) == EXIT_OK
    with Store(sqlite_url) as store:
        assert json.loads(target.read_text()) == store.export_run("long")


@pytest.mark.postgres
async def test_a_runs_command_with_postgres_down_prints_one_line_exits_1_and_works_once_it_is_up(
    server: Server, database: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Real processes, so their whole stderr is seen (logging included)."""
    export = tmp_path / "done.json"
    export.write_text(json.dumps(await runs(database)))
    before = rows(database)
    server.down()
    try:
        failed = {  # the store is opened before any command runs: two stand for all
            call.name: _cli(capsys, database, call, export, process=True)
            for call in CALLS
            if call.name in ("respond", "fork")
        }
    finally:
        server.up()
    for name, (code, out, err) in failed.items():
        assert (code, out) == (EXIT_ERROR, []), (name, out)
        assert len(err) == 1 and err[0].startswith("graphflow-durable: opening the store failed on "), err
        assert "Connection refused" in err[0], err
    assert rows(database) == before
    with Store(database) as store:
        for call in CALLS[:3] + CALLS[5:]:  # (delete and prune remove the same run)
            assert _cli(capsys, database, call, export)[0] == EXIT_OK
            call.done(store)
