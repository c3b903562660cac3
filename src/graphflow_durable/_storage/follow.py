"""Follow a run's thread as it grows, from any process: what :meth:`Store.follow` iterates.

A watcher reads the messages after its offset and the run's status in one read transaction (the
status first: on PostgreSQL's snapshot and SQLite's alike, a status that says the round ended is read
with every message committed with it), yields them, and then waits for the next commit while the
run is ``running``. Every other status (the round stopped or finished, the run parked ``waiting``
for a person, or it ended interrupted, failed or cancelled) ends the iteration: the run is not being
driven, so nothing more will come without a new attach.

Waiting: on PostgreSQL every commit that moves a run's head notifies channel :data:`CHANNEL` (the
run id as payload) from inside its transaction (``statements.HotPath``: part of the head's
``UPDATE``, so a refused or rolled back commit notifies nobody); a watcher listens on a connection
of its own, outside the pool, and falls back to polling if that connection fails (or the event
loop cannot watch a socket). On SQLite, and as PostgreSQL's fallback, it polls with a back-off:
quick while commits come, slower while the run is quiet. A watcher takes no lease and writes
nothing; any number of them may follow a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunRecord, StoredMessage
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.checksum import MESSAGES, Damage, corrupt, message_sum
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.schema import messages, runs
from graphflow_durable.errors import UsageError

__all__ = ["CHANNEL", "Follow", "check_after"]

logger = logging.getLogger(__name__)

#: The PostgreSQL notification channel of commits (payload: the run id).
CHANNEL = S.COMMIT_CHANNEL

#: Polling back-off: the first wait after a read that found something, and the longest wait.
FIRST_WAIT = 0.01
LONGEST_WAIT = 0.5
#: PostgreSQL, listening: the poll that catches what no commit notifies (a status changed by an
#: operator on a run nobody drives, a lost notification connection noticed late).
LISTEN_POLL = 2.0

#: What a poll reads of the run's row: cheap (no JSON), enough to know whether to read messages.
_SELECT_POSITION = sa.select(runs.c.status, runs.c.message_count, runs.c.head_seq).where(
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
    until the run is no longer driven; :attr:`run` is the run's row as last read (after the
    iteration: as it ended, with its status and stored result)."""

    def __init__(self, engines: Engines, run_id: str, after_seq: int | None, *, wait: bool) -> None:
        self._e = engines
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
        """Stop following (the notification connection is closed)."""
        await self._messages.aclose()

    async def _iterate(self) -> AsyncGenerator[StoredMessage, None]:
        listener = (
            _Listener(self._e, self._run_id) if self._wait and self._e.dialect == "postgresql" else None
        )
        try:
            if listener is not None:
                await listener.start()  # before the first read: no commit falls between the two
            pause = FIRST_WAIT
            while True:
                ended, batch = await asyncio.to_thread(self._read)
                for message in batch:
                    self._after = message.seq
                    yield message
                if ended:
                    return
                if batch:
                    pause = FIRST_WAIT
                if listener is not None and listener.listening:
                    await listener.wait(LISTEN_POLL)
                else:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, LONGEST_WAIT)
        finally:
            if listener is not None:
                listener.close()

    def _read(self) -> tuple[bool, list[StoredMessage]]:
        """Whether the iteration ends after these messages, and the messages after the offset, read
        in one transaction with the run's status (first), every row checked. At the end, the run's
        whole row (:attr:`run`) is read in the same transaction."""
        run_id = self._run_id
        with guarded(self._e, f"following run {run_id}", run_id=run_id), self._e.read.begin() as conn:
            run = conn.execute(_SELECT_POSITION, {"p_run_id": run_id}).first()
            if run is None:
                raise S.not_found(run_id)
            ended = not self._wait or run.status != "running"
            if ended:
                self.run = S.run_row(conn, run_id)
            found = [] if run.message_count - 1 <= self._after else self._after_offset(conn, run)
            return ended, found

    def _after_offset(self, conn: sa.Connection, run: Any) -> list[StoredMessage]:
        run_id, url = self._run_id, self._e.url
        found: list[StoredMessage] = []
        for m in conn.execute(_SELECT_AFTER, {"p_run_id": run_id, "p_after": self._after}):
            if m.seq >= run.message_count:
                break  # not counted by the row read: a later commit's (not in a snapshot)
            if m.checksum is not None and m.checksum != message_sum(
                run_id, m.seq, m.step_seq, m.published, m.body
            ):
                raise corrupt(Damage(run_id, MESSAGES, m.step_seq, seq=m.seq), url)
            expected = self._after + 1 + len(found)
            if m.seq != expected:
                raise corrupt(_gap(run_id, expected, m.seq, m.step_seq), url)
            found.append(
                StoredMessage(seq=m.seq, step_seq=m.step_seq, body=loads(m.body), published=bool(m.published))
            )
        if self._after + len(found) != run.message_count - 1:
            step = found[-1].step_seq if found else run.head_seq
            raise corrupt(_gap(run_id, self._after + len(found) + 1, run.message_count, step), url)
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
