"""Engine set-up per backend: SQLite pragmas and ``BEGIN IMMEDIATE``, PostgreSQL over psycopg 3.

:func:`open_engines` returns a :class:`Engines` bundle: one pool, two views of it. ``write`` starts
transactions that take the write lock at once (SQLite ``BEGIN IMMEDIATE``, so a transaction never
fails half-way with "database is locked" when upgrading a read lock); ``read`` starts plain,
consistent read transactions (SQLite deferred ``BEGIN`` under WAL; PostgreSQL ``REPEATABLE READ``);
``migrate`` starts the migration's transactions, which PostgreSQL runs without the store's time
limits (a migration may wait on the migration lock, or rewrite a big table, for long).

A PostgreSQL connection is bounded in time, so that a network partition is an error within seconds
instead of a hang: ``connect_timeout``, TCP keepalives and ``tcp_user_timeout`` (libpq, defaults in
``urls``), ``statement_timeout`` and ``lock_timeout`` set on each new connection, and a client-side
bound on each wait for the server's answer (:func:`_bounded_connection`).

That last bound is for a peer the TCP settings miss: one that still acknowledges the bytes but never
answers (a pooler or proxy such as PgBouncer, HAProxy or a cloud SQL proxy cut off from the server,
or a frozen server host whose kernel still runs). A connection waits at most ``statement_timeout``
plus :data:`GRACE` seconds for the server (the server cancels a slow statement itself, and says so,
before the client gives up), then closes and raises :class:`psycopg.OperationalError`; SQLAlchemy
sees a closed connection, so the pool drops it.
"""

from __future__ import annotations

import functools
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from selectors import DefaultSelector
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool, StaticPool

from graphflow_durable._storage.sealing import PLAIN, Sealer
from graphflow_durable._storage.urls import (
    PG_NETWORK_DEFAULTS,
    StoreUrl,
    libpq_keywords,
    parse_store_url,
    safe_url,
)
from graphflow_durable.errors import StoreError

__all__ = [
    "GRACE",
    "Engines",
    "describe",
    "guarded",
    "open_engines",
    "peek_sqlite",
    "read_row",
    "safe_url",
    "store_error",
]

_log = logging.getLogger(__name__)

#: Execution option carrying the SQLite BEGIN mode ("IMMEDIATE" for writers).
_BEGIN_OPTION = "graphflow_sqlite_begin"
#: Execution option of the PostgreSQL migration view: no statement/lock timeout, no answer bound.
_UNBOUNDED_OPTION = "graphflow_unbounded"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Engines:
    """One engine (one pool) seen two ways, plus what the store needs to know about it.

    Attributes:
        engine: the underlying engine (dispose it to close the pool).
        write: begins write transactions (SQLite ``BEGIN IMMEDIATE``).
        read: begins read transactions with one snapshot for all their statements.
        migrate: begins the migration's write transactions (PostgreSQL: without the store's
            statement/lock timeouts and answer bound; SQLite: ``write``).
        dialect: ``"sqlite"`` or ``"postgresql"``.
        url: the URL with its password hidden, for messages.
        serial: a lock every operation must hold (a real lock only for in-memory SQLite, where all
            threads share one connection; otherwise a no-op).
        target: the parsed store URL (options in effect, the config URL).
        sealer: the store's codec applied to its content columns (a no-op without a codec);
            every component seals what it writes and opens what it reads through it.
    """

    engine: Engine
    write: Engine
    read: Engine
    migrate: Engine
    dialect: str
    url: str
    serial: AbstractContextManager[Any]
    target: StoreUrl
    sealer: Sealer = PLAIN

    @property
    def driver_error(self) -> type[Exception]:
        """The base class of the DBAPI driver's errors (``sqlite3.Error``, ``psycopg.Error``)."""
        error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        return error


class _PoolFaults(logging.Filter):
    """Puts SQLAlchemy's pool errors about a dropped connection on one WARNING line.

    When the pool cannot roll back or close a connection the database dropped (a restart
    terminates every backend: psycopg's ``AdminShutdown``; a crash or a cut network), it logs an
    ERROR with the driver's traceback, discards the connection, and the next checkout connects
    again: nothing failed that a caller sees. A database fault is one line in this package's logs
    (the caller's own operation, if it failed, raises its :class:`StoreError`), so such a record
    becomes a WARNING naming the error, without the traceback.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: tuple[type[BaseException], ...] = ()

    def watch(self, logger: logging.Logger, error: type[BaseException]) -> None:
        if error not in self.errors:
            self.errors = (*self.errors, error)
        if self not in logger.filters:
            logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR and isinstance(exc, self.errors):
            said = record.getMessage()  # the pool's own message, its arguments applied: read first
            record.msg = "%s (the pool discards the connection; the next use connects again): %s"
            record.args = (said, describe(exc))
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.exc_info, record.exc_text = None, None
        return True


_POOL_FAULTS = _PoolFaults()


def _quiet_pool_faults(engine: Engine) -> None:
    """Attach :class:`_PoolFaults` to the logger of ``engine``'s pool (the pool class's own logger:
    a filter on a parent logger does not see the records it propagates)."""
    logger = getattr(engine.pool.logger, "logger", engine.pool.logger)  # an echoing pool wraps it
    if isinstance(logger, logging.Logger):
        _POOL_FAULTS.watch(logger, engine.dialect.loaded_dbapi.Error)


@contextmanager
def guarded(engines: Engines, action: str, *, run_id: str | None = None) -> Iterator[None]:
    """Serialise (in-memory SQLite only) and turn database and driver errors into :class:`StoreError`.

    ``action`` says what was being done (``"claiming work"``); it, ``run_id`` and the password-free
    URL become the error's message and attributes, the driver's error its chained cause. The
    package's own errors (a conflict, a lost lease...) pass through unchanged.
    """
    with engines.serial:
        try:
            yield
        except (sa.exc.SQLAlchemyError, engines.driver_error) as exc:
            raise store_error(engines, action, exc, run_id=run_id) from exc


def read_row(engines: Engines, sql: str, params: Any) -> dict[str, Any] | None:
    """The first row of one driver-SQL statement as a dict (``None``: no row), read on a raw pooled
    connection: one statement is its own consistent read, so SQLAlchemy's connection and
    transaction machinery (~0.07 ms on SQLite, more than the read) is skipped. Run it under
    :func:`guarded`: a driver error is raised as it is, its connection never reused if broken."""
    dbapi = engines.engine.raw_connection()
    try:
        cursor = dbapi.cursor()
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([column[0] for column in cursor.description], row, strict=True))
    except engines.driver_error as exc:
        error: Any = exc  # the dialect's own driver error
        if engines.engine.dialect.is_disconnect(error, dbapi.dbapi_connection, None):
            dbapi.invalidate(exc)
        raise
    finally:
        dbapi.close()  # back to the pool, which ends the read (PostgreSQL: its implicit transaction)


def store_error(
    engines: Engines, action: str, exc: BaseException, *, run_id: str | None = None
) -> StoreError:
    """The :class:`StoreError` :func:`guarded` raises for a database or driver error ``exc``
    (for code that reports an error instead of raising it, such as the commit writer's thread)."""
    error = StoreError(
        f"{action} failed on {engines.url}: {describe(exc)}", url=engines.url, run_id=run_id, action=action
    )
    error.__cause__ = exc
    return error


def describe(exc: BaseException) -> str:
    """A short description of a database error (the driver's message, not the SQL or values), on
    one line: the server's ``CONTEXT:`` line and libpq's indented continuations are joined to it."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = ""
    for line in str(exc).strip().splitlines():
        if line.strip():
            words = " ".join(line.split())
            text += (" " if line[:1].isspace() else "; ") + words if text else words
    return f"{type(exc).__name__}: {text}"


def open_engines(
    url: str,
    *,
    synchronous: str | None = None,
    pool_pre_ping: bool | None = None,
    shared: bool | None = None,
) -> Engines:
    """Create the engine for ``url``.

    Args:
        url: ``sqlite:///path``, ``sqlite://`` (in memory), ``postgresql://...`` (rewritten to
            psycopg 3) or ``postgresql+psycopg://...``; its query may carry the options
            ``_storeurl`` describes (``?synchronous=NORMAL``, ``?connect_timeout=5``...).
        synchronous: SQLite ``PRAGMA synchronous`` (``FULL``, ``NORMAL``, ``OFF`` or ``EXTRA``);
            ``None``: the URL's, else ``FULL``.
        pool_pre_ping: PostgreSQL only: test each connection as it leaves the pool; ``None``: the
            URL's, else true.
        shared: allow the store's tables beside other tables (see ``migrations.refuse_unowned``);
            ``None``: the URL's ``shared``, else false.

    Raises:
        StoreConfigError: the URL is malformed, names a backend/driver this package does not
            support, or carries an option that is unknown, refused, or disagrees with an argument.
    """
    target = parse_store_url(url, synchronous=synchronous, pool_pre_ping=pool_pre_ping, shared=shared)
    if target.dialect == "sqlite":
        return _sqlite(target)
    return _postgresql(target)


def _sqlite(target: StoreUrl) -> Engines:
    url, mode, timeout = target.engine_url, target.synchronous, target.timeout
    in_memory = url.database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"timeout": timeout, "check_same_thread": False}}
    if in_memory:
        kwargs["poolclass"] = StaticPool
    engine = sa.create_engine(url, hide_parameters=True, **kwargs)
    busy_ms = int(timeout * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        # SQLAlchemy's documented recipe: stop sqlite3 from emitting BEGIN itself; we emit it in
        # the "begin" hook below, so SELECTs are transactional and writers can BEGIN IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                mode_row = _enter_wal(cursor, timeout)
                if mode_row is None or str(mode_row[0]).lower() != "wal":
                    _log.warning("SQLite refused WAL mode for %s (journal_mode=%s)", url.database, mode_row)
            cursor.execute(f"PRAGMA synchronous={mode}")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
            # The group writer's savepoints keep their statement journal in memory, not a temp file.
            cursor.execute("PRAGMA temp_store=MEMORY")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        begin = conn.get_execution_options().get(_BEGIN_OPTION, "BEGIN")
        conn.exec_driver_sql(begin)

    write = engine.execution_options(**{_BEGIN_OPTION: "BEGIN IMMEDIATE"})
    return Engines(
        engine=engine,
        write=write,
        read=engine,
        migrate=write,
        dialect="sqlite",
        url=safe_url(url),
        serial=threading.RLock() if in_memory else nullcontext(),
        target=target,
    )


def peek_sqlite(target: StoreUrl, look: Callable[[Connection], _T]) -> _T | None:
    """``look`` at an existing SQLite file through a connection that only reads; else ``None``.

    The connection is a plain one (not the engine's), so ``look`` runs before the engine's
    connections switch the file to WAL: a database that is then refused keeps its journal mode,
    gets no ``-wal``/``-shm`` files, and stays byte for byte as it was. ``None`` for PostgreSQL,
    in-memory SQLite, a file that does not exist yet, or one this cannot read (the engine then
    opens it and reports the problem; the check under the migration lock still runs).
    """
    path = target.engine_url.database
    if target.dialect != "sqlite" or path in (None, "", ":memory:") or not Path(path).is_file():
        return None
    # sqlite3's own transaction handling: a read begins no transaction, so nothing is written.
    engine = sa.create_engine(
        "sqlite://", creator=lambda: sqlite3.connect(path, timeout=target.timeout), poolclass=NullPool
    )
    try:
        with engine.connect() as conn:
            return look(conn)
    except (sa.exc.SQLAlchemyError, sqlite3.Error):
        return None
    finally:
        engine.dispose()


def _enter_wal(cursor: sqlite3.Cursor, timeout: float) -> Any:
    """Switch a new connection's database to WAL; return the resulting ``journal_mode`` row.

    Several processes opening a new database at once race to switch it, and SQLite answers the
    losers "database is locked" at once, without waiting on the busy timeout: retry until then.
    """
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            row = cursor.execute("PRAGMA journal_mode").fetchone()
            if row is not None and str(row[0]).lower() == "wal":
                return row  # already WAL: the mode is persistent, nothing to switch
            return cursor.execute("PRAGMA journal_mode=WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _postgresql(target: StoreUrl) -> Engines:
    # psycopg is optional (SQLite needs none): imported only for a PostgreSQL store.
    bounded = _bounded_connection()
    url = target.engine_url
    # The URL's own libpq parameters win; the defaults go in connect_args, so messages show the URL.
    known = libpq_keywords()
    network = {k: v for k, v in PG_NETWORK_DEFAULTS.items() if k not in url.query and k in known}
    engine = sa.create_engine(
        url, pool_pre_ping=target.pool_pre_ping, hide_parameters=True, connect_args=network
    )
    # The client's bound exceeds the server's statement_timeout, so a slow statement is cancelled
    # by the server, which says why, and only a silent server meets the bound.
    answer_within = target.statement_timeout + GRACE if target.statement_timeout > 0 else None
    settings = {  # whole milliseconds, rounded up: a positive timeout must not become 0 (none)
        "statement_timeout": math.ceil(target.statement_timeout * 1000),
        "lock_timeout": math.ceil(target.lock_timeout * 1000),
    }

    _quiet_pool_faults(engine)

    @event.listens_for(engine, "do_connect")
    def _do_connect(_dialect: object, _record: object, cargs: Any, cparams: Any) -> Any:
        return bounded.connect(*cargs, **cparams)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.answer_within = answer_within
        with dbapi_connection.cursor() as cursor:
            for name, milliseconds in settings.items():
                cursor.execute(f"SET {name} = {milliseconds}")
        dbapi_connection.commit()

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_connection: Any, _record: object) -> None:
        if dbapi_connection is not None:  # back from a migration: bounded again
            dbapi_connection.answer_within = answer_within

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_UNBOUNDED_OPTION):
            conn.connection.dbapi_connection.answer_within = None  # type: ignore[union-attr]
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            conn.exec_driver_sql("SET LOCAL lock_timeout = 0")

    return Engines(
        engine=engine,
        write=engine,
        read=engine.execution_options(isolation_level="REPEATABLE READ"),
        migrate=engine.execution_options(**{_UNBOUNDED_OPTION: True}),
        dialect="postgresql",
        url=safe_url(url),
        serial=nullcontext(),
        target=target,
    )


#: Seconds the client waits past ``statement_timeout`` before it gives a silent server up.
GRACE = 5.0
#: How often a bounded wait wakes up (lets a signal handler, e.g. Ctrl+C, run in the main thread).
_INTERVAL = 0.1


@functools.cache
def _bounded_connection() -> Any:
    """The psycopg connection class whose waits for the server end after ``answer_within`` seconds.

    Made on first use: psycopg is an optional dependency, imported only for a PostgreSQL store.
    ``answer_within`` is ``None`` for no bound (the psycopg wait); the engine sets it on connect
    and lifts it for a migration (which may legitimately wait long on the migration lock).
    """
    import psycopg
    from psycopg.abc import PQGen

    class BoundedConnection(psycopg.Connection[Any]):
        answer_within: float | None = None

        def wait(self, gen: PQGen[_T], *args: Any, **kwargs: Any) -> _T:
            """Consume ``gen`` like psycopg does, within :attr:`answer_within` seconds."""
            bound = self.answer_within
            if bound is None:
                return super().wait(gen, *args, **kwargs)
            try:
                result: _T = _wait(gen, self.pgconn.socket, time.monotonic() + bound)
                return result
            except TimeoutError:
                self.pgconn.finish()  # the protocol state is unknown: this connection is done
                raise psycopg.OperationalError(
                    f"no answer from the server within {bound:g} s (statement_timeout + {GRACE:g} s); "
                    "the connection is given up as lost (a network partition, or a proxy or server "
                    "that stopped answering)"
                ) from None

    return BoundedConnection


def _wait(gen: Any, fileno: int, deadline: float) -> Any:
    """psycopg's selector wait with a deadline (:class:`TimeoutError` when it passes).

    ``gen`` yields the events it waits for (psycopg's ``Wait``: 1 read, 2 write, 3 both, the
    selector's own flags) and is sent the events that are ready. (psycopg 3.2 has a ``timeout=``
    of its own, but the package still supports psycopg 3.1.)
    """
    try:
        waiting = next(gen)
        with DefaultSelector() as selector:
            selector.register(fileno, waiting)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                ready = selector.select(timeout=min(left, _INTERVAL))
                if not ready:
                    continue
                now = gen.send(ready[0][1])  # the selector's events are psycopg's Ready flags
                if now != waiting:
                    waiting = now
                    selector.modify(fileno, waiting)
    except StopIteration as done:
        return done.value
