"""The commit hot path: group commit, with a writer thread per store for what blocks.

:class:`CommitWriter` is held by the :class:`~graphflow_durable.store.Store`. Callers hand it
encoded commits (:class:`CommitParams`) and get a future. Commits that arrive while the database
connection is busy wait together and are written as one *group*: one transaction, so one fsync
(SQLite) or one ``COMMIT`` (PostgreSQL) for the whole group. A future resolves only after its
group's transaction committed: a caller never sees its commit before it is durable.

Who does what depends on what blocks:

- **SQLite file** (the usual case). The statements of a group are fast (pages in memory) and run
  on the caller's thread, an event loop's included; only what waits on the disk leaves it: with
  ``synchronous=FULL`` (or ``EXTRA``) the ``COMMIT`` and its fsync run on the writer thread, with
  ``NORMAL``/``OFF`` (no fsync per commit) the ``COMMIT`` runs where the statements ran. Commits
  handed over meanwhile are written next, as one group, on a loop of one of their callers. So the
  writer thread holds the GIL for one call per group, not one per statement: a thread that
  executes statements under a busy event loop waits for the GIL at every one of them (measured:
  13.6 ms for a group of 13 commits, 1.7 ms of it CPU). A group that finds the write lock taken by
  another connection goes to the thread, which waits for it as long as the busy timeout allows.
- **PostgreSQL** (every statement is a round trip) and **in-memory SQLite** (one connection shared
  by every thread, under the engines' ``serial`` lock): the writer thread writes each group whole;
  on PostgreSQL a commit's head move and inserts go in one round trip (psycopg's pipeline mode).

Results reach an event loop with one wake-up per group and loop, not one per commit. In a group of
several, each commit runs after a ``SAVEPOINT``: one refused by its run's guard (a stale head, a
lost lease) or failing on its own rows is rolled back to it, and the group's other commits are
written (a group of one needs no savepoint: its transaction is rolled back). Commits are written
in the order they were handed over, so one run's commits (a run hands over one at a time anyway)
stay ordered.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from concurrent.futures import Future
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._storage.commit import CommitParams, refusal
from graphflow_durable._storage.engine import Engines, store_error
from graphflow_durable._storage.statements import HotPath, LeaseTuple, Prepared

__all__ = ["CommitWriter"]

#: At most this many commits go in one group (bounds a group's transaction and its latency).
MAX_GROUP = 64

#: The writer thread's tasks: write a group whole; ``COMMIT`` a group whose statements ran; take
#: what waits and write it; stop (after writing what was handed over).
_WRITE, _COMMIT, _DRAIN, _STOP = "write", "commit", "drain", "stop"

#: Key in a pooled SQLite connection's ``info``: the busy timeout (ms) it has now.
_BUSY_MS = "graphflow_busy_ms"


@dataclass(eq=False)
class _Commit:
    """One commit handed to the writer, its caller's future, and what became of it."""

    params: CommitParams
    loop: asyncio.AbstractEventLoop | None  # the caller's event loop; None: a blocking caller
    future: asyncio.Future[int] | Future[int] = field(init=False)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.future = Future() if self.loop is None else self.loop.create_future()

    @property
    def run_id(self) -> str:
        return str(self.params.run["p_run_id"])

    @property
    def expected_head(self) -> int:
        return int(self.params.run["p_expected"])

    @property
    def action(self) -> str:
        return f"committing step {self.expected_head + 1} of run {self.run_id}"

    def settle(self) -> None:
        """Give the caller the outcome (on the caller's loop, for a loop's future)."""
        if self.future.done():  # a caller that cancelled its future: the commit went on anyway
            return
        if self.error is None:
            self.future.set_result(self.expected_head + 1)
        else:
            self.future.set_exception(self.error)


class CommitWriter:
    """Writes encoded commits on the store's engines, in groups (see the module's docstring)."""

    def __init__(self, engines: Engines) -> None:
        self._e = engines
        dialect = engines.engine.dialect
        self._driver_error: type[Any] = dialect.loaded_dbapi.Error
        self._integrity_error: type[Any] = dialect.loaded_dbapi.IntegrityError
        self._hot = HotPath.for_dialect(dialect)
        sqlite = engines.dialect == "sqlite"
        # A SQLite file: statements on the caller's thread (see the module's docstring).
        self._here = sqlite and not engines.shared_connection
        # ... and the COMMIT too when it does not fsync.
        self._commit_here = self._here and engines.target.synchronous in ("NORMAL", "OFF")
        self._busy_ms = int(engines.target.timeout * 1000) if sqlite else 0
        # psycopg's pipeline mode (libpq >= 14): one round trip for the statements of a commit.
        self._pipeline = engines.dialect == "postgresql" and _pipeline_supported(dialect.loaded_dbapi)
        self._kept: Any = None  # SQLite: the connection kept between groups
        self._lock = threading.Lock()  # guards the fields below
        self._busy = False  # a group holds the connection (from taking its commits to settling them)
        self._waiting: list[_Commit] = []  # handed over while busy: the next group
        self._closed = False
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None  # the process the thread runs in
        self.groups = 0  # groups written (for tests and benchmarks: commits per group)
        self.commits = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def submit(self, params: CommitParams, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """Hand one encoded commit over; return its future: an :class:`asyncio.Future` of ``loop``
        (pass the caller's running loop) or, without ``loop``, a :class:`concurrent.futures.Future`
        to block on. It gives the new head once the commit is durable, or raises why not: a
        :class:`StoreError` (a database error, its driver error chained) or the guard's refusal
        (``LeaseLostError``, ``ConflictError``...). On a SQLite file the commit's statements may run
        before this returns, its ``COMMIT`` too with ``synchronous=NORMAL``/``OFF``."""
        item = _Commit(params, loop)
        with self._lock:
            if self._closed:
                raise RuntimeError("the store is closed; open a new Store to write")
            if self._pid != os.getpid():  # first use, or a child of a fork: its own thread
                self._start_thread()
            self._waiting.append(item)
            if self._busy:
                return item.future  # written with the next group
            if not self._here:
                self._inbox.put((_DRAIN, None))
                return item.future
            group = self._take()
        self._write_here(group)
        return item.future

    def close(self) -> None:
        """Write what was handed over, stop the thread, close its connection."""
        with self._lock:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            if thread is not None:
                self._inbox.put((_STOP, None))
        if thread is not None:
            thread.join()
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    # -- taking turns at the connection ---------------------------------------------------------

    def _start_thread(self) -> None:
        self._pid, self._inbox, self._kept = os.getpid(), queue.SimpleQueue(), None
        self._busy, self._waiting = False, []  # a forked child's: the parent's are not its own
        thread = threading.Thread(target=self._work, args=(self._inbox,), daemon=True)
        thread.name = "graphflow-durable-writer"
        thread.start()
        self._thread = thread

    def _take(self) -> list[_Commit]:
        """Under the lock: take the connection and the next group."""
        self._busy = True
        group, self._waiting = self._waiting[:MAX_GROUP], self._waiting[MAX_GROUP:]
        return group

    def _take_waiting(self) -> list[_Commit]:
        """The next group, if the connection is free and commits wait; else nothing."""
        with self._lock:
            if self._busy or not self._waiting:
                return []
            return self._take()

    def _drain_here(self) -> None:
        """On a caller's loop: write what waits, unless someone took it or holds the connection."""
        if self._closed:
            return  # close() hands what waits to the thread
        group = self._take_waiting()
        if group:
            self._write_here(group)

    def _finish(self, group: list[_Commit]) -> None:
        """The group's outcome is known: let the connection go, tell its callers (one wake-up per
        event loop), and have what waits meanwhile written: on a loop of its callers (a SQLite
        file) or by the thread."""
        self.groups += 1
        self.commits += len(group)
        with self._lock:
            self._busy = False
            waiting = {item.loop for item in self._waiting}
        if self._closed or (waiting and (not self._here or None in waiting)):
            self._inbox.put((_DRAIN, None))  # closing: the thread writes the rest
        drains = waiting if self._here else set()
        by_loop: dict[asyncio.AbstractEventLoop, list[_Commit]] = {}
        for item in group:
            if item.loop is None:
                item.settle()
            else:
                by_loop.setdefault(item.loop, []).append(item)
        for loop in by_loop.keys() | drains:
            if loop is not None:
                self._on_loop(loop, by_loop.get(loop, []), loop in drains)

    def _on_loop(self, loop: asyncio.AbstractEventLoop, items: list[_Commit], drain: bool) -> None:
        if _running_loop() is loop:  # written inline: no wake-up needed
            for item in items:
                item.settle()
            if drain:
                loop.call_soon(self._drain_here)
            return

        def settle_and_drain() -> None:
            for item in items:
                item.settle()
            if drain:
                self._drain_here()

        try:
            loop.call_soon_threadsafe(settle_and_drain)
        except RuntimeError:  # the loop is closed: nobody waits there; what waits goes to the thread
            if drain:
                self._inbox.put((_DRAIN, None))

    # -- writing a group -------------------------------------------------------------------------

    def _write_here(self, group: list[_Commit]) -> None:
        """A SQLite file, on the caller's thread: the group's statements, then its ``COMMIT`` here
        (no fsync) or on the thread."""
        dbapi = None
        try:
            dbapi = self._connection()
            locked = not self._begin(dbapi, wait=False)
            if not locked:
                self._apply_all(dbapi, group)
        except BaseException as exc:  # noqa: BLE001 -- every commit of the group learns it
            self._failed(dbapi, group, exc)
            self._finish(group)
            return
        if locked:  # another connection writes: the thread waits for it instead of this loop
            self._kept = dbapi
            self._inbox.put((_WRITE, group))
        elif self._commit_here:
            self._commit(dbapi, group)
        else:
            self._inbox.put((_COMMIT, (dbapi, group)))

    def _write(self, group: list[_Commit]) -> None:
        """On the thread: the whole transaction, waiting for locks as long as the timeouts allow."""
        with self._e.serial:  # in-memory SQLite: one connection for every thread
            dbapi = None
            try:
                dbapi = self._connection()
                self._begin(dbapi, wait=True)
                self._apply_all(dbapi, group)
            except BaseException as exc:  # noqa: BLE001 -- every commit of the group learns it
                self._failed(dbapi, group, exc)
                self._finish(group)
                return
            self._commit(dbapi, group)

    def _commit(self, dbapi: Any, group: list[_Commit]) -> None:
        """``COMMIT`` the group's transaction, then tell its callers."""
        try:
            dbapi.commit()
        except BaseException as exc:  # noqa: BLE001 -- every commit of the group learns it
            self._failed(dbapi, group, exc)
        else:
            self._keep(dbapi)
        self._finish(group)

    def _work(self, inbox: queue.SimpleQueue[tuple[str, Any]]) -> None:
        stopping = False
        while True:
            task, arg = inbox.get()
            if task == _WRITE:
                self._write(arg)
            elif task == _COMMIT:
                self._commit(*arg)
            elif task == _DRAIN:
                group = self._take_waiting()
                if group:
                    self._write(group)
            else:  # _STOP
                stopping = True
            if stopping and self._write_rest():
                return

    def _write_rest(self) -> bool:
        """Closing: write what waits; whether all is written (else a group holds the connection,
        and its end wakes the thread again)."""
        while True:
            with self._lock:
                if self._busy:
                    return False
                if not self._waiting:
                    return True
                group = self._take()
            self._write(group)

    # -- one transaction -------------------------------------------------------------------------

    def _connection(self) -> Any:
        dbapi, self._kept = self._kept, None
        return dbapi if dbapi is not None else self._e.engine.raw_connection()

    def _keep(self, dbapi: Any) -> None:
        if self._e.dialect == "sqlite":
            self._kept = dbapi
        else:
            # PostgreSQL connections always go back: the pool's pre-ping finds one a server
            # restart broke.
            dbapi.close()

    def _begin(self, dbapi: Any, *, wait: bool) -> bool:
        """Open the transaction; whether it is open. SQLite: ``BEGIN IMMEDIATE``, waiting the busy
        timeout or, without ``wait``, not at all: ``False`` when another connection holds the
        write lock (the connection's busy timeout is set only when it changes). PostgreSQL:
        implicit."""
        if self._e.dialect != "sqlite":
            return True
        busy_ms = self._busy_ms if wait else 0
        # Closed here, on this thread: a cursor collected later takes the connection's mutex,
        # which the writer thread may hold while it waits for the lock on the same connection.
        with closing(dbapi.cursor()) as cursor:
            if dbapi.info.get(_BUSY_MS, self._busy_ms) != busy_ms:
                cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
                dbapi.info[_BUSY_MS] = busy_ms
            try:
                cursor.execute("BEGIN IMMEDIATE")
            except self._driver_error as exc:
                if not wait and ("locked" in str(exc) or "busy" in str(exc)):
                    dbapi.rollback()  # a refused BEGIN may leave the read half of it open
                    return False
                raise
        return True

    def _failed(self, dbapi: Any, group: list[_Commit], exc: BaseException) -> None:
        """The transaction failed (or its connection could not be had: ``dbapi`` is ``None``): give
        the connection back (rolled back) or drop it, and note the error on every commit of the
        group not refused already."""
        if dbapi is not None:
            if isinstance(exc, self._driver_error) and self._e.engine.dialect.is_disconnect(
                exc, dbapi.dbapi_connection, None
            ):
                dbapi.invalidate(exc)  # never hand this connection out again
            elif dbapi.info.get(_BUSY_MS, self._busy_ms) != self._busy_ms:
                dbapi.invalidate(exc)  # its busy timeout is not the pool's: no one else gets it
            dbapi.close()  # back to the pool, which rolls back whatever is uncommitted
        if isinstance(exc, (self._driver_error, sa.exc.SQLAlchemyError)):  # SQLAlchemy's: connecting
            for item in group:
                if item.error is None:
                    item.error = store_error(self._e, item.action, exc, run_id=item.run_id)
        else:
            for item in group:
                if item.error is None:
                    item.error = exc

    def _apply_all(self, dbapi: Any, group: list[_Commit]) -> None:
        cursor = dbapi.cursor()
        alone = len(group) == 1  # no savepoint: the transaction itself is the commit's
        for item in group:
            item.error = self._apply(dbapi, cursor, item, savepoint=not alone)

    def _apply(self, dbapi: Any, cursor: Any, item: _Commit, *, savepoint: bool) -> BaseException | None:
        """One commit of the group: ``None`` when it was written, else why not. With ``savepoint``
        it runs after one and a refused or failed commit is rolled back to it, the group's other
        commits untouched; without (a group of one), the transaction is rolled back."""
        params = item.params
        update_head = self._hot.update_head[bool(params.messages), params.updates_run]
        try:
            if self._pipeline:
                moved = self._apply_pipelined(dbapi, cursor, update_head, params, savepoint)
            else:
                if savepoint:
                    cursor.execute("SAVEPOINT graphflow_commit")
                cursor.execute(update_head.sql, update_head.bind(params.run))
                moved = cursor.rowcount == 1
                if moved:
                    self._insert_rows(cursor, params)
        except self._integrity_error as exc:  # the head moved, so the rows themselves are wrong
            self._undo(dbapi, cursor, savepoint)
            failed: BaseException = exc
            return failed
        if moved:
            return None
        self._undo(dbapi, cursor, savepoint)
        select = self._hot.select_lease
        cursor.execute(select.sql, select.bind(params.run))
        found = cursor.fetchone()
        row = None if found is None else LeaseTuple(*found)
        first_seq = params.messages[0]["seq"] if params.messages else None
        return refusal(item.run_id, row, item.expected_head, int(params.run["p_token"]), first_seq)

    @staticmethod
    def _undo(dbapi: Any, cursor: Any, savepoint: bool) -> None:
        if savepoint:
            cursor.execute("ROLLBACK TO SAVEPOINT graphflow_commit")
        else:
            dbapi.rollback()  # the group's COMMIT then ends no transaction: nothing is written

    def _insert_rows(self, cursor: Any, params: CommitParams) -> None:
        hot = self._hot
        cursor.execute(hot.insert_step.sql, hot.insert_step.bind(params.step))
        if params.messages:
            insert = hot.insert_message
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.messages])
        if params.states:
            insert = hot.insert_state
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.states])

    def _apply_pipelined(
        self, dbapi: Any, cursor: Any, update_head: Prepared, params: CommitParams, savepoint: bool
    ) -> bool:
        """PostgreSQL: the savepoint, the head move and the inserts in one round trip; whether the
        head moved. If it did not, the inserts ran for nothing (or failed on a key that the winner
        already wrote): the caller rolls them back."""
        connection = dbapi.dbapi_connection
        head = connection.cursor()
        try:
            with connection.pipeline():
                if savepoint:
                    cursor.execute("SAVEPOINT graphflow_commit")
                head.execute(update_head.sql, update_head.bind(params.run))
                self._insert_rows(cursor, params)
        except self._integrity_error:
            if head.rowcount == 1:
                raise
            return False
        return bool(head.rowcount == 1)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _pipeline_supported(driver: Any) -> bool:
    pipeline = getattr(driver, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())
