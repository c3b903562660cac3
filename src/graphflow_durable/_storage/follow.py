"""Follow a run's thread as it grows, from any process: what :meth:`Store.follow` iterates.

A follower reads the messages after its offset (and the run's status, in the same read
transaction: see :func:`_read`), then takes the run's *feed*: one reader per run and event loop in
this process (held by the store's :class:`Feeds`), which reads each new commit once and hands it to
every follower of the run, so twenty followers in a web server cost one reader. While the run is
``running`` the feed waits for the next commit; any other status (the round stopped or finished,
the run parked ``waiting`` for a person, or it ended interrupted, failed or cancelled) ends it and
every follower: the run is not being driven, nothing more comes without a new attach.

A follower follows one *incarnation* of the run: the one its first read found, known by the row's
``created_at`` (a new run, an import, a fork each write their own time, a reset or a resume keeps
it). A run deleted meanwhile, or deleted and made again under its id, ends every follower of the
incarnation with :class:`RunNotFoundError`: the messages of the run made again are another run's,
never spliced into the stream (a feed is shared by the followers of one incarnation only).

Waiting: on PostgreSQL every commit that moves a run's head notifies channel :data:`CHANNEL` (the
run id as payload) right after its transaction (``writer.CommitWriter._notify``, which says why
not inside it: a refused or rolled back commit notifies nobody); a feed listens on a connection of
its own, outside the pool, and falls back to polling if that connection fails (or the event loop
cannot watch a socket); its poll every :data:`LISTEN_POLL` catches a lost notification. On SQLite, and as PostgreSQL's fallback, it polls with a back-off: every
50 ms while commits come (read in batches), up to 0.5 s while the run is quiet. Followers take no
lease and write nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunRecord, StoredMessage
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.checksum import MESSAGES, Damage, corrupt, message_sum
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.lease import iso
from graphflow_durable._storage.schema import messages, runs
from graphflow_durable.errors import RunNotFoundError, UsageError

__all__ = ["CHANNEL", "Feeds", "Follow", "check_after"]

logger = logging.getLogger(__name__)

#: The PostgreSQL notification channel of commits (payload: the run id).
CHANNEL = S.COMMIT_CHANNEL

#: Polling back-off: the wait after a read that found something, and the longest wait. A watcher
#: reads at most every FIRST_WAIT (also when notified): a run committing every millisecond is read
#: in batches, so each watcher costs its reads' CPU and not one read per commit.
FIRST_WAIT = 0.05
LONGEST_WAIT = 0.5
#: PostgreSQL, listening: the poll that catches what no commit notifies (a status changed by an
#: operator on a run nobody drives, a lost notification connection noticed late).
LISTEN_POLL = 2.0

#: What a poll reads of the run's row: cheap (no JSON), enough to know whether to read messages.
_SELECT_POSITION = sa.select(runs.c.status, runs.c.message_count, runs.c.head_seq, runs.c.created_at).where(
    runs.c.run_id == sa.bindparam("p_run_id")
)
_SELECT_AFTER = (
    sa.select(messages.c.seq, messages.c.step_seq, messages.c.published, messages.c.body, messages.c.checksum)
    .where(messages.c.run_id == sa.bindparam("p_run_id"), messages.c.seq > sa.bindparam("p_after"))
    .order_by(messages.c.seq)
)


def check_after(after_seq: object) -> int:
    """``after_seq`` as the last seq already seen (``-1`` for ``None``: from the task on); a bad
    value is a one-line :class:`UsageError`."""
    if after_seq is None:
        return -1
    if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
        raise UsageError(
            f"after_seq must be a message seq (a whole number >= 0, the task is 0) or None, not {after_seq!r}",
            option="after_seq",
        )
    return after_seq


class Follow:
    """An async iterator of a run's :class:`StoredMessage` after an offset, then of its new commits
    until the run is no longer driven; :attr:`run` is the run's row once the iteration ended (its
    status and stored result, read with the last messages)."""

    def __init__(self, feeds: Feeds, run_id: str, after_seq: int | None, *, wait: bool) -> None:
        self._feeds = feeds
        self._run_id = run_id
        self._after = check_after(after_seq)
        self._wait = wait
        self.run: RunRecord | None = None
        self._messages = self._iterate()

    def __aiter__(self) -> Follow:
        return self

    async def __anext__(self) -> StoredMessage:
        return await self._messages.__anext__()

    async def aclose(self) -> None:
        """Stop following."""
        await self._messages.aclose()

    async def _iterate(self) -> AsyncGenerator[StoredMessage, None]:
        # Catch up with a read of its own, then take the run's shared feed, which reads each new
        # commit once for every follower of the run in this process (subscribed before any read
        # that could miss what the feed delivers: see Feeds.subscribe).
        read = self._feeds.reader(self._run_id)
        run, batch, born = await asyncio.to_thread(read, self._after, not self._wait, None)
        for message in self._seen(batch):
            yield message
        if run is not None:
            self.run = run
            return
        feed, queue = self._feeds.subscribe(self._run_id, self._after, born)
        try:
            if feed.cursor > self._after:  # the feed was ahead of this follower's read
                run, batch, _ = await asyncio.to_thread(read, self._after, False, born)
                for message in self._seen(batch):
                    yield message
                if run is not None:
                    self.run = run
                    return
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, RunRecord):
                    self.run = item
                    return
                for message in self._seen(item):
                    yield message
        finally:
            feed.unsubscribe(queue)

    def _seen(self, batch: list[StoredMessage]) -> list[StoredMessage]:
        """The messages of ``batch`` after this follower's offset, which moves past them."""
        new = [m for m in batch if m.seq > self._after]
        if new:
            self._after = new[-1].seq
        return new


#: What a feed hands its followers: a batch of messages; at the end, the run's row; or the error
#: that stopped it (each follower raises it).
_Item = list[StoredMessage] | RunRecord | Exception


class Feeds:
    """The store's live feeds: one per run followed (and event loop), shared by its followers in this
    process, so twenty followers of a run cost one reader of it. Held by the store."""

    def __init__(self, engines: Engines) -> None:
        self._e = engines
        self._feeds: dict[tuple[asyncio.AbstractEventLoop, str, float], _Feed] = {}
        self._lock = threading.Lock()  # a store may serve several threads' event loops

    def reader(self, run_id: str) -> Callable[[int, bool, float | None], _Read]:
        """A blocking read of ``run_id``'s messages after an offset, of the incarnation created at
        the time given (``None``: whichever is there): ``(run row if the run is not driven or
        ``final``, else None; the messages; the incarnation's creation time)``."""
        return functools.partial(_read, self._e, run_id)

    def subscribe(self, run_id: str, after: int, born: float) -> tuple[_Feed, asyncio.Queue[_Item]]:
        """The feed on this loop of the run's incarnation created at ``born`` (a new one reads the
        messages after ``after``: what the caller read last), and a queue of its batches and, at the
        end, the run's row. The feed's ``cursor`` is the last seq it read: a follower behind it
        reads up to it itself."""
        loop = asyncio.get_running_loop()
        with self._lock:
            feed = self._feeds.get((loop, run_id, born))
            if feed is None:
                feed = self._feeds[(loop, run_id, born)] = _Feed(self, run_id, after, born)
            queue: asyncio.Queue[_Item] = asyncio.Queue()
            feed.subscribers.append(queue)
        feed.start()
        return feed, queue

    def remove(self, feed: _Feed) -> None:
        with self._lock:
            key = next((k for k, v in self._feeds.items() if v is feed), None)
            if key is not None:
                del self._feeds[key]


class _Feed:
    """One run's new commits, read once for all its followers in this process and loop."""

    def __init__(self, feeds: Feeds, run_id: str, cursor: int, born: float) -> None:
        self._feeds = feeds
        self._run_id = run_id
        self._born = born  # the incarnation followed (the run row's created_at)
        self.cursor = cursor
        self.subscribers: list[asyncio.Queue[_Item]] = []
        self._task: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def unsubscribe(self, queue: asyncio.Queue[_Item]) -> None:
        if queue in self.subscribers:
            self.subscribers.remove(queue)
        if not self.subscribers:
            self._feeds.remove(self)
            if self._task is not None:
                self._task.cancel()

    def _send(self, item: _Item) -> None:
        for queue in self.subscribers:
            queue.put_nowait(item)

    async def _run(self) -> None:
        engines = self._feeds._e
        read = self._feeds.reader(self._run_id)
        listener = _Listener(engines, self._run_id) if engines.dialect == "postgresql" else None
        loop = asyncio.get_running_loop()
        pause = FIRST_WAIT
        try:
            if listener is not None:
                await listener.start()
            while True:
                # Listening from before this read (or polling): no commit falls between the two.
                read_at = loop.time()
                try:
                    run, batch, _ = await asyncio.to_thread(read, self.cursor, False, self._born)
                except Exception as exc:  # noqa: BLE001 -- a StoreError, the run deleted...: every follower raises it
                    self._feeds.remove(self)
                    self._send(exc)
                    return
                if batch:
                    self.cursor = batch[-1].seq
                    self._send(batch)
                    pause = FIRST_WAIT
                if run is not None:
                    self._feeds.remove(self)  # a later follower starts a feed of its own
                    self._send(run)
                    return
                if listener is not None and listener.listening:
                    await listener.wait(LISTEN_POLL)
                    # A burst of commits is read in batches: at most one read per FIRST_WAIT.
                    await asyncio.sleep(max(0.0, read_at + FIRST_WAIT - loop.time()))
                else:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, LONGEST_WAIT)
        finally:
            if listener is not None:
                listener.close()


#: What a read gives: the run's row if it is not driven (or the read is final), the messages, and
#: the incarnation's creation time.
_Read = tuple[RunRecord | None, list[StoredMessage], float]


def _read(engines: Engines, run_id: str, after: int, final: bool, born: float | None) -> _Read:
    """The messages of ``run_id`` after seq ``after``, read in one transaction with the run's status
    (read first: in PostgreSQL's snapshot and SQLite's alike, a status that says the round ended is
    read with every message committed with it), every row checked; the run's whole row when the run
    is not ``running`` (or ``final``), else ``None``; and its creation time. With ``born``, the run
    must be the incarnation created then: one deleted (and maybe made again) raises
    :class:`RunNotFoundError`."""
    with guarded(engines, f"following run {run_id}", run_id=run_id), engines.read.begin() as conn:
        position = conn.execute(_SELECT_POSITION, {"p_run_id": run_id}).first()
        if position is None:
            if born is not None:
                raise gone(run_id, born, None)
            raise S.not_found(run_id)
        if born is not None and position.created_at != born:
            raise gone(run_id, born, float(position.created_at))
        run = S.run_row(conn, run_id, engines.sealer) if final or position.status != "running" else None
        if position.message_count - 1 <= after:
            return run, [], float(position.created_at)
        found = _after_offset(conn, engines, run_id, after, position)
        return run, found, float(position.created_at)


def gone(run_id: str, born: float, now_born: float | None) -> RunNotFoundError:
    """The end of a follower whose run (created at ``born``) was deleted; ``now_born``: the creation
    time of the run made again under its id since, if one was."""
    if now_born is None:
        said = f"run {run_id} does not exist any more: it (created {iso(born)}) was deleted while it was followed"
    else:
        said = (
            f"run {run_id} (created {iso(born)}) was deleted while it was followed, and another run was "
            f"made under its id (created {iso(now_born)})"
        )
    return RunNotFoundError(
        f"{said}; follow the run again to read what is stored under its id now", run_id=run_id
    )


def _after_offset(
    conn: sa.Connection, engines: Engines, run_id: str, after: int, run: Any
) -> list[StoredMessage]:
    found: list[StoredMessage] = []
    url, opened = engines.url, engines.sealer.open
    for m in conn.execute(_SELECT_AFTER, {"p_run_id": run_id, "p_after": after}):
        if m.seq >= run.message_count:
            break  # not counted by the row read: a later commit's (not in a snapshot)
        if m.checksum is not None and m.checksum != message_sum(
            run_id, m.seq, m.step_seq, m.published, m.body
        ):
            raise corrupt(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq), url)
        expected = after + 1 + len(found)
        if m.seq != expected:
            raise corrupt(_gap(run_id, expected, m.seq, m.step_seq), url)
        body = opened(m.body, MESSAGES, run_id, m.seq, "body", seq=m.seq)
        found.append(
            StoredMessage(seq=m.seq, step_seq=m.step_seq, body=loads(body), published=bool(m.published))
        )
    if after + len(found) != run.message_count - 1:
        step = found[-1].step_seq if found else run.head_seq
        raise corrupt(_gap(run_id, after + len(found) + 1, run.message_count, step), url)
    return found


def _gap(run_id: str, first: int, after: int, step: int) -> Damage:
    what = f"message {first} is" if after - first == 1 else f"messages {first}..{after - 1} are"
    return Damage(run_id, MESSAGES, step, seq=first, problem=f"{what} missing (the run row counts them)")


class _Listener:
    """PostgreSQL: a connection of its own (out of the pool's count) that LISTENs on
    :data:`CHANNEL`; :meth:`wait` returns when this run's commit is notified or after ``timeout``."""

    def __init__(self, engines: Engines, run_id: str) -> None:
        self._e = engines
        self._run_id = run_id
        self._raw: Any = None
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None

    @property
    def listening(self) -> bool:
        return self._fd is not None

    async def start(self) -> None:
        try:
            self._raw = await asyncio.to_thread(self._connect)
            self._loop = asyncio.get_running_loop()
            fd = int(self._raw.dbapi_connection.pgconn.socket)
            self._loop.add_reader(fd, self._readable)
            self._fd = fd
        except (NotImplementedError, sa.exc.SQLAlchemyError, self._e.driver_error) as exc:
            logger.info("run %s: not listening for commits (%s); polling", self._run_id, exc)
            self.close()

    def _connect(self) -> Any:
        raw = self._e.engine.raw_connection()
        try:
            raw.detach()  # a LISTENing connection never goes back to the pool
            connection: Any = raw.dbapi_connection
            connection.rollback()
            connection.autocommit = True
            connection.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            raw.close()
            raise
        return raw

    def _readable(self) -> None:
        pgconn = self._raw.dbapi_connection.pgconn
        try:
            pgconn.consume_input()
        except self._e.driver_error as exc:  # the connection broke: poll from now on
            logger.info("run %s: the commit notifications stopped (%s); polling", self._run_id, exc)
            self.close()
            self._event.set()
            return
        while (note := pgconn.notifies()) is not None:
            if note.extra.decode("utf-8", "replace") == self._run_id:
                self._event.set()
        if pgconn.status != 0:  # CONNECTION_BAD: a closed socket is always readable
            self.close()
            self._event.set()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()

    def close(self) -> None:
        if self._fd is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # a closed loop: nothing to remove
                self._loop.remove_reader(self._fd)
        self._fd = None
        if self._raw is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError, self._e.driver_error):  # a broken one is gone
                self._raw.close()
            self._raw = None
