"""The commit hot path: a writer thread per store that commits in groups.

:class:`CommitWriter` is held by the :class:`~graphflow_durable.store.Store`. It owns one thread
(started when it is first needed) and the connection that thread keeps between commits. Callers
hand it encoded commits (:class:`CommitParams`) and get a future; the thread takes every commit that is
waiting when it is free and writes them as one group: one transaction, so one fsync (SQLite) or one
``COMMIT`` (PostgreSQL) for the whole group. While it writes, the callers' event loops run on, and
the commits that arrive meanwhile form the next group.

In a group of several, each commit runs after a ``SAVEPOINT``: one refused by its run's guard (a
stale head, a lost lease) or failing on its own rows is rolled back to it, and the group's other
commits are written (a group of one needs no savepoint: its transaction is rolled back). A future
resolves only after the group's transaction committed: a caller never sees its commit before it is
durable. A new run (its row, first step and agent states) is an item of the queue like a commit.
Commits are written in the order they were handed over, so one run's commits stay ordered: a run
hands over the answers of a parallel batch without waiting for each (they join one group), and
waits for them all before its next dispatch. Items handed over :meth:`~CommitWriter.together`
always share a group (a new run and its first commit: one transaction), and one of them after a
failed one of the same run is not written: it fails with that item's error. A coroutine's futures
are set on its own event loop (no second future chained to it).

It runs a group's transaction on a raw DBAPI connection; what each item of the group writes (a
commit's guarded head move and rows, or a new run's row with its first step) is
:class:`GroupItems`'s, on the group's connection, with precompiled statements
(``statements.HotPath``); on PostgreSQL each commit's head move and inserts go in one round trip
(psycopg's pipeline mode). An item arrives encoded (:class:`CommitParams`, :class:`CreateParams`:
``driver.py`` encodes them); a refused one is told why (:func:`refusal`). On PostgreSQL the
followers of the group's runs are notified after its commit (:meth:`CommitWriter._notify` says why
not inside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from graphflow_durable._storage.engine import Engines, store_error
from graphflow_durable._storage.lease import lease_lost
from graphflow_durable._storage.statements import (
    NOTIFY_COMMITS,
    HotPath,
    LeaseTuple,
    Prepared,
    not_found,
    run_record,
)
from graphflow_durable.errors import ConflictError, StoreError, UsageError

__all__ = [
    "CancelRequested",
    "CommitParams",
    "CommitWriter",
    "CreateParams",
    "GroupItems",
    "Item",
    "Outcome",
    "refusal",
    "run_exists",
]

logger = logging.getLogger(__name__)

#: At most this many commits go in one group (bounds a group's transaction and its latency).
MAX_GROUP = 64


class Outcome(asyncio.Future[Any]):
    """A coroutine's commit outcome, on its event loop: an asyncio future that refuses to be
    cancelled (``cancel()`` returns ``False``), as the commit it stands for lands or fails all the
    same. A task awaiting it directly that is cancelled meanwhile gets its ``CancelledError`` once
    the outcome is in (asyncio's own rule for an awaited future that refuses the cancellation), so
    the caller learns what became of the commit without a second future between the writer and it
    (each costs a turn of the event loop per commit: ``commits._settled``)."""

    def cancel(self, msg: Any | None = None) -> bool:
        return False


@dataclass(frozen=True)
class CommitParams:
    """Bind parameters of one commit: the head update, the step row, message and state rows;
    whether it changes the run's lifecycle (status, task, result)."""

    run: dict[str, Any]
    step: dict[str, Any]
    messages: list[dict[str, Any]]
    states: list[dict[str, Any]]
    updates_run: bool


@dataclass(frozen=True)
class CreateParams:
    """Bind parameters of a new run: its row (without the lease's expiry, which the INSERT takes
    from the lease clock: ``p_now``, ``p_seconds``) and, for a run that starts at head 1, its first
    step with the agent states (``first``)."""

    run: dict[str, Any]
    first: CommitParams | None


class CancelRequested(int):
    """A commit's new head that found a cancel of its run pending (``Store.cancel_run``), read by
    the head move's ``RETURNING`` (no statement of its own); otherwise a commit gives a plain int."""

    cancel_requested_at: float

    def __new__(cls, head: int, cancel_requested_at: float) -> CancelRequested:
        made = super().__new__(cls, head)
        made.cancel_requested_at = cancel_requested_at
        return made


def run_exists(run_id: str, url: str) -> ConflictError:
    """The refusal of a new run whose id is taken."""
    return ConflictError(
        f"run {run_id} already exists in {url}; choose a new run_id to start a new run, or resume the "
        "existing one (acquire its lease and load it)",
        run_id=run_id,
        url=url,
    )


def refusal(
    run_id: str,
    row: Any,
    expected_head: int,
    fencing_token: int,
    first_seq: int | None,
) -> StoreError | UsageError:
    """Why the guarded head update matched no row, given the run's lease row (``None``: no run)."""
    if row is None:
        return not_found(run_id)
    if row.fencing_token != fencing_token:
        return lease_lost(run_id, fencing_token, row)
    if row.head_seq != expected_head:
        return ConflictError(
            f"run {run_id}: expected head {expected_head} but the store is at {row.head_seq}; "
            "another writer committed first; nothing was written; reload the run",
            run_id=run_id,
            expected_head=expected_head,
            actual_head=row.head_seq,
        )
    # The head was the expected one, so no other writer intervened: the caller numbered its
    # messages wrongly.
    return UsageError(
        f"run {run_id}: the new messages start at seq {first_seq} but the run has {row.message_count} "
        "messages; message seqs must continue the thread without gaps; nothing was written; reload the run",
        run_id=run_id,
        option="messages",
    )


@dataclass
class Item:
    """One commit (or a new run: :class:`CreateParams`) handed to the writer, and what became of
    it: ``waiter`` (a coroutine's, on ``loop``) or ``future`` (a thread's) gives ``result`` (a
    commit's new head, a new run's record) or the error. An item handed over together with others
    (``CommitWriter.together``) after a failed one of the same run (``after``) is not written: it
    fails with that error (a run's first commit must never land on a run its failed creation did
    not make)."""

    params: CommitParams | CreateParams
    loop: asyncio.AbstractEventLoop | None = None
    after: Item | None = None  # handed over together before this one, of the same run
    created_token: int | None = None  # the token its run's creation drew, in this group (see follow)
    future: Future[Any] | None = None  # a thread's (a coroutine's item has a waiter instead)
    waiter: Outcome | None = None
    result: Any = None
    error: BaseException | None = None

    @property
    def run_id(self) -> str:
        if isinstance(self.params, CreateParams):
            return str(self.params.run["run_id"])
        return str(self.params.run["p_run_id"])

    def follow(self, before: Item) -> None:
        """Write this item after ``before`` (of the same run, handed over together): a commit
        after its run's creation is written under the fencing token that creation drew in this
        same transaction, which its driver could not know when it handed the commit over (whatever
        token it named: nobody else can hold a run created in the transaction that writes it)."""
        if before.created_token is not None and isinstance(self.params, CommitParams):
            self.params.run["p_token"] = self.created_token = before.created_token

    @property
    def action(self) -> str:
        if isinstance(self.params, CreateParams):
            return f"creating run {self.run_id}"
        return f"committing step {int(self.params.run['p_expected']) + 1} of run {self.run_id}"


class GroupItems:
    """Writes the items of a group on its connection, with the statements compiled for its dialect."""

    def __init__(self, engines: Engines) -> None:
        dialect = engines.engine.dialect
        self._url = engines.url
        self._integrity_error: type[Any] = dialect.loaded_dbapi.IntegrityError
        self._hot = HotPath.for_dialect(dialect)
        # psycopg's pipeline mode (libpq >= 14): one round trip for the statements of a commit.
        self._pipeline = engines.dialect == "postgresql" and _pipeline_supported(dialect.loaded_dbapi)

    def apply(self, dbapi: Any, cursor: Any, item: Item, *, savepoint: bool) -> BaseException | None:
        """One commit of the group: ``None`` when it was written, else why not. With ``savepoint``
        it runs after one and a refused or failed commit is rolled back to it, the group's other
        commits untouched; without (a group of one), the transaction is rolled back."""
        params = item.params
        if isinstance(params, CreateParams):
            return self._create(dbapi, cursor, item, params, savepoint)
        update_head = self._hot.update_head[bool(params.messages), params.updates_run]
        try:
            if self._pipeline:
                moved = self._apply_pipelined(dbapi, cursor, update_head, params, savepoint)
            else:
                if savepoint:
                    cursor.execute("SAVEPOINT graphflow_commit")
                cursor.execute(update_head.sql, update_head.bind(params.run))
                moved = cursor.fetchone()  # the row's pending cancel request, if the head moved
                if moved is not None:
                    self._insert_rows(cursor, params)
        except self._integrity_error as exc:  # the head moved, so the rows themselves are wrong
            self._undo(dbapi, cursor, savepoint)
            failed: BaseException = exc
            return failed
        if moved is not None:
            cancel = moved[0]
            head = int(params.run["p_new_head"])
            item.result = head if cancel is None else CancelRequested(head, float(cancel))
            return None
        self._undo(dbapi, cursor, savepoint)
        select = self._hot.select_lease
        cursor.execute(select.sql, select.bind(params.run))
        found = cursor.fetchone()
        row = None if found is None else LeaseTuple(*found)
        first_seq = params.messages[0]["seq"] if params.messages else None
        return refusal(item.run_id, row, int(params.run["p_expected"]), int(params.run["p_token"]), first_seq)

    def _create(
        self, dbapi: Any, cursor: Any, item: Item, params: CreateParams, savepoint: bool
    ) -> BaseException | None:
        """A new run's row, under a fencing token drawn from the store's counter, and its first step
        and agent states; refused if the id is taken."""
        insert, draw = self._hot.insert_run, self._hot.draw_token
        try:
            if savepoint:
                cursor.execute("SAVEPOINT graphflow_commit")
            cursor.execute(draw.sql, draw.bind({}))
            (token,) = cursor.fetchone()
            run = {**params.run, "fencing_token": int(token)}
            cursor.execute(insert.sql, insert.bind(run))
            (expires,) = cursor.fetchone()
            if params.first is not None:
                self._insert_rows(cursor, params.first)
        except self._integrity_error:  # the primary key: the run exists
            self._undo(dbapi, cursor, savepoint)
            return run_exists(item.run_id, self._url)
        item.created_token = run["fencing_token"]
        item.result = run_record({**run, "lease_expires_at": float(expires)})
        return None

    @staticmethod
    def _undo(dbapi: Any, cursor: Any, savepoint: bool) -> None:
        if savepoint:
            cursor.execute("ROLLBACK TO SAVEPOINT graphflow_commit")
        else:
            dbapi.rollback()

    def _insert_rows(self, cursor: Any, params: CommitParams) -> None:
        hot = self._hot
        cursor.execute(hot.insert_step.sql, hot.insert_step.bind(params.step))
        # One statement per table, whatever the number of rows (not executemany: one per row).
        if params.messages:
            for sql, bound in hot.insert_message.statements(params.messages):
                cursor.execute(sql, bound)
        if params.states:
            for sql, bound in hot.insert_state.statements(params.states):
                cursor.execute(sql, bound)

    def _apply_pipelined(
        self, dbapi: Any, cursor: Any, update_head: Prepared, params: CommitParams, savepoint: bool
    ) -> Any:
        """PostgreSQL: the savepoint, the head move and the inserts in one round trip; the head
        move's row (its pending cancel request) if the head moved, else ``None``. If it did not, the
        inserts ran for nothing (or failed on a key that the winner already wrote): the caller rolls
        them back."""
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
            return None
        return head.fetchone() if head.rowcount == 1 else None


def _pipeline_supported(driver: Any) -> bool:
    pipeline = getattr(driver, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())


class _Busy(Exception):
    """An inline commit found SQLite's write lock taken: the writer thread writes it instead."""


class CommitWriter:
    """Writes encoded commits on the store's engines, from one thread, in groups."""

    def __init__(self, engines: Engines) -> None:
        self._e = engines
        dialect = engines.engine.dialect
        self._driver_error: type[Any] = dialect.loaded_dbapi.Error
        self._items = GroupItems(engines)
        self._kept: Any = None  # SQLite: the writer thread's connection, kept between groups
        self._kept_timeout = 0  # its busy timeout now (ms)
        self._busy_ms = int(engines.target.timeout * 1000) if engines.dialect == "sqlite" else 0
        # sqlite3 runs with isolation_level=None (see engine): the commit path must BEGIN itself.
        self._begin = "BEGIN IMMEDIATE" if engines.dialect == "sqlite" else None
        self._inbox: queue.SimpleQueue[list[Item] | None] = queue.SimpleQueue()
        # Hand-overs queued for the thread and not written yet (under _start_lock): an empty inbox
        # is not enough to write inline, as the thread may hold what it took off it, unwritten.
        self._queued = 0
        self._held = threading.local()  # .items: what this thread hands over at the end of together()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None  # the process the thread runs in
        self._start_lock = threading.Lock()
        self._writing = threading.Lock()  # held while a group's transaction runs (thread or inline)
        # SQLite without a sync per commit (NORMAL, OFF): a commit costs ~0.1 ms of CPU and no
        # fsync, less than handing it to the thread and back; it is written inline when the
        # writer is idle (FULL's fsync, and PostgreSQL's round trips, always leave the loop).
        self._inline = engines.dialect == "sqlite" and engines.target.synchronous in ("NORMAL", "OFF")
        self._closed = False
        self._notify_failed = False  # a notification failed already (logged once as a warning)
        self.groups = 0  # groups written (for tests and benchmarks: commits per group)
        self.commits = 0

    def submit(self, params: CommitParams | CreateParams) -> Future[Any]:
        """Hand one encoded commit (or new run) to the writer thread (or, SQLite NORMAL/OFF with the
        writer idle, write it here); the future gives the new head (a new run: its record) once it
        is durable, or raises why not: a :class:`StoreError` (a database error, its driver error
        chained) or the guard's refusal (``LeaseLostError``, ``ConflictError``...)."""
        if getattr(self._held, "items", None) is not None:
            raise UsageError(
                "a blocking commit inside together() would wait for itself: use submit_commit() "
                "or submit_create_run() there, or commit outside the block",
                option="together",
            )
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()  # handed over: it can no longer be cancelled
        self._hand_over([Item(params, future=future)])
        return future

    def submit_async(
        self, params: CommitParams | CreateParams, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[Any]:
        """:meth:`submit` for a coroutine on ``loop``: an asyncio future, set on that loop by the
        writer thread (no concurrent future chained to it), which refuses to be cancelled: the
        commit is handed over (:class:`Outcome`)."""
        item = Item(params, loop, waiter=Outcome(loop=loop))
        held: list[Item] | None = getattr(self._held, "items", None)
        if held is not None:
            held.append(item)
        else:
            self._hand_over([item])
        assert item.waiter is not None
        return item.waiter

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Hold what this thread hands over to :meth:`submit_async` inside the block, and hand it
        over as one unit when the block ends: written in one group (one transaction). Nested
        blocks join the outermost one."""
        if getattr(self._held, "items", None) is not None:
            yield
            return
        held: list[Item] = []
        self._held.items = held
        try:
            yield
        finally:
            self._held.items = None
            last: dict[str, Item] = {}
            for item in held:
                item.after = last.get(item.run_id)
                last[item.run_id] = item
            if held:
                self._hand_over(held)

    def _hand_over(self, items: list[Item]) -> None:
        with self._start_lock:
            if self.closed:
                raise RuntimeError("the store is closed; open a new Store to write")
            if self._pid != os.getpid():  # first use, or a child of a fork: its own queue and thread
                self._pid, self._inbox, self._queued = os.getpid(), queue.SimpleQueue(), 0
                self._kept = self._thread = None
            # Inline only behind nothing: a commit must not overtake an earlier one of its run.
            inline = self._inline and not self._queued and self._writing.acquire(blocking=False)
            if not inline:
                self._queue(items)
                return
        try:
            self._write_group(items, nowait=True)
            return
        except _Busy:  # another connection holds SQLite's write lock: the thread waits for it
            pass
        finally:
            self._writing.release()
        self._requeue(items)

    def _requeue(self, items: list[Item]) -> None:
        """Hand inline commits that found the database locked to the thread after all."""
        with self._start_lock:
            if self._closed:  # closed meanwhile: the thread may have stopped already
                for item in items:
                    item.error = RuntimeError("the store is closed; open a new Store to write")
                    _settle(item)
            else:
                self._queue(items)

    def _queue(self, items: list[Item]) -> None:
        """Put ``items`` (written in one group) in the thread's queue, starting the thread if it is
        not running yet (a short run on SQLite NORMAL may never need it). Called with
        ``_start_lock`` held."""
        if self._thread is None:
            thread = threading.Thread(target=self._work, args=(self._inbox,), daemon=True)
            thread.name = "graphflow-durable-writer"
            thread.start()
            self._thread = thread
        self._queued += 1
        self._inbox.put(items)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Write what was handed over, stop the thread, close its connection."""
        with self._start_lock:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            if thread is not None:
                self._inbox.put(None)
        if thread is not None:
            thread.join()
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    # -- the writer thread -------------------------------------------------------------------

    def _work(self, inbox: queue.SimpleQueue[list[Item] | None]) -> None:
        while True:
            first = inbox.get()
            if first is None:
                return
            group = list(first)
            taken = 1
            stop = False
            while len(group) < MAX_GROUP:
                try:
                    items = inbox.get_nowait()
                except queue.Empty:
                    break
                if items is None:
                    stop = True
                    break
                group.extend(items)
                taken += 1
            with self._writing:
                self._write_group(group)
            with self._start_lock:
                self._queued -= taken
            if stop:
                return

    def _write_group(self, group: list[Item], *, nowait: bool = False) -> None:
        try:
            with self._e.serial:  # in-memory SQLite: one connection for every thread
                self._transaction(group, nowait)
        except _Busy:
            raise
        except BaseException as exc:  # noqa: BLE001 -- every caller learns it; the thread lives on
            for item in group:
                if item.error is None:
                    item.error = exc
        self.groups += 1
        self.commits += len(group)
        for item in group:
            if isinstance(item.error, (self._driver_error, sa.exc.SQLAlchemyError)):  # e.g. connecting
                item.error = store_error(self._e, item.action, item.error, run_id=item.run_id)
        for item in group:
            if item.loop is None or _running_here(item.loop):
                _settle(item)
            else:
                # One call per commit, not one for the group: the runs it wakes then resume over
                # several turns of their loop instead of all in one (which lengthens that turn:
                # one call per loop and group raised the loop lag p99 at 50 runs from 23-24 ms to
                # 37-52 ms, for no throughput).
                try:
                    item.loop.call_soon_threadsafe(_settle, item)
                except RuntimeError:  # that loop is closed: nobody waits for this any more
                    pass

    def _transaction(self, group: list[Item], nowait: bool = False) -> None:
        """Write the group in one transaction; note each refused or failed commit on its item.

        ``nowait`` (SQLite, inline): raise :class:`_Busy` at once, instead of waiting the busy
        timeout on the event loop, when another connection holds the write lock."""
        dbapi, timeout, self._kept = self._kept, self._kept_timeout, None
        if dbapi is None:
            dbapi, timeout = self._e.engine.raw_connection(), self._busy_ms
        committed = False
        try:
            cursor = dbapi.cursor()
            if self._begin is not None:
                # The busy timeout only matters when BEGIN IMMEDIATE waits for the write lock; the
                # kept connection keeps the last one set (inline commits in a row set none).
                wanted = 0 if nowait else self._busy_ms
                if timeout != wanted:
                    cursor.execute(f"PRAGMA busy_timeout={wanted}")
                    timeout = wanted
                self._begin_immediate(cursor, nowait)
            alone = len(group) == 1  # no savepoint: the transaction itself is the commit's
            for item in group:
                after = item.after
                if after is not None and after.error is not None:
                    item.error = after.error  # it followed from that one: not written
                else:
                    if after is not None:
                        item.follow(after)  # after its run's creation: under the token it drew
                    item.error = self._items.apply(dbapi, cursor, item, savepoint=not alone)
            dbapi.commit()
            committed = True
            if self._e.dialect == "postgresql":
                self._notify(dbapi, group)
        except self._driver_error as exc:
            if self._e.engine.dialect.is_disconnect(exc, dbapi.dbapi_connection, None):
                dbapi.invalidate(exc)  # never hand this connection out again
            raise
        finally:
            if committed and self._e.dialect == "sqlite":
                self._kept, self._kept_timeout = dbapi, timeout
            else:
                if timeout != self._busy_ms:  # the pool's other users wait for the lock as configured
                    with contextlib.suppress(Exception):
                        dbapi.cursor().execute(f"PRAGMA busy_timeout={self._busy_ms}")
                # Back to the pool, which rolls back whatever is uncommitted. PostgreSQL connections
                # always go back: the pool's pre-ping finds one a server restart broke.
                dbapi.close()

    def _notify(self, dbapi: Any, group: list[Item]) -> None:
        """PostgreSQL, after the group's transaction committed: notify the followers of its runs
        (``_storage/follow.py`` listens; a refused or failed commit notifies nobody) in a short
        transaction of its own on the same connection, which does not wait for its WAL flush
        (``statements.NOTIFY_COMMITS``).

        Not inside the commit's transaction: PostgreSQL serialises every notifying transaction of
        the database cluster on one lock (``PreCommit_Notify`` takes it, the transaction's end
        releases it), held across the commit record's WAL flush (and a synchronous standby's
        answer). Notifying in the commit's head ``UPDATE`` made the commits of a worker pool's
        processes flush one after another instead of together: 8 processes committing on a server
        whose flush takes 5 ms did 158 commits/s against 302 without a notify (0.52x, at the
        ceiling of one flush at a time); notifying here, 221/s (0.73x). On this VM's fast flush
        (4 processes) both cost about the same: 0.81x and 0.85x (benchmarks/README.md, Watchers).
        One statement in autocommit (one round trip). No pipeline: its set-up costs more CPU than
        the round trips it saves on a local server (0.69x there). Best effort: a notification lost (this transaction failing, or a crash
        before its WAL reaches the disk) costs a follower its fallback poll
        (``follow.LISTEN_POLL``), never a commit."""
        run_ids = sorted({i.run_id for i in group if i.error is None and isinstance(i.params, CommitParams)})
        if not run_ids:
            return
        connection = dbapi.dbapi_connection
        try:
            # Autocommit: the statement is its own transaction (one round trip, not BEGIN, the
            # statement and COMMIT); its set_config(..., true) holds until that transaction's end.
            connection.autocommit = True
            try:
                connection.execute(NOTIFY_COMMITS, (run_ids,))
            finally:
                connection.autocommit = False
        except self._driver_error as exc:
            # Once per writer as a warning (the same cause, e.g. a permission, fails every group).
            level, self._notify_failed = (logging.DEBUG if self._notify_failed else logging.WARNING), True
            logger.log(
                level,
                "committed runs %s, but could not notify their followers (they poll instead): %s",
                ", ".join(run_ids),
                str(exc).strip(),
            )
            with contextlib.suppress(Exception):
                dbapi.rollback()

    def _begin_immediate(self, cursor: Any, nowait: bool) -> None:
        try:
            cursor.execute(self._begin)
        except self._driver_error as exc:
            if nowait and ("locked" in str(exc) or "busy" in str(exc)):
                raise _Busy from None
            raise


def _settle(item: Item) -> None:
    """Give the caller its commit's outcome (on the caller's loop for a coroutine's)."""
    outcome = item.future if item.future is not None else item.waiter
    if outcome is None or (isinstance(outcome, asyncio.Future) and outcome.cancelled()):
        return  # nobody waits for it any more
    if item.error is None:
        outcome.set_result(item.result)
    else:
        outcome.set_exception(item.error)


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
