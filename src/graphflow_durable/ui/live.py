"""Live updates of a run's page: ``GET /runs/{run_id}/events``, Server-Sent Events from
:meth:`Store.follow`.

Events: ``message`` (one new message: seq, source, type, time, text) and ``state`` (the run's
status, head and, when the pictures can be drawn, each node's state), sent once a burst of messages
settled and whenever the run's row changes; ``gone`` (the run was deleted) and ``refused`` (a row
is sealed under a key the console was not given, or damaged: one line) end the stream.

The browsers that follow one run share one reader of it in this process (:class:`Followers`): one
:meth:`Store.follow` while the run is driven (the store's feed: PostgreSQL LISTEN/NOTIFY, SQLite
polling with back-off; its reads run in threads, never on the event loop), then, while nobody drives
it, a look at its row every :data:`IDLE_POLL` seconds until a driver takes it. Each batch of new
messages is encoded once and put in each stream's queue, the run's state drawn once for all. A
stream reads what came before it joined from the store itself; a stream whose browser reads slower
than the run commits (more than :data:`QUEUED` batches behind) is never waited for: its queue is
emptied and it reads what it missed from the store. A browser that leaves ends its stream at once
(the response watches for the disconnect); the reader stops when the run's last stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage.sealing import openable
from graphflow_durable.errors import (
    RunNotFoundError,
    StoreConfigError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.store import RunRecord, Store, StoredMessage
from graphflow_durable.ui.pictures import run_pictures, run_states

__all__ = [
    "IDLE_POLL",
    "PING",
    "QUEUED",
    "SETTLE",
    "EventStream",
    "Followers",
    "events",
    "message_view",
    "pictures",
]

logger = logging.getLogger(__name__)

#: What no retry mends: a row sealed under a key this console was not given, or a damaged one.
UNREADABLE = (StoreConfigError, StoreCorruptError)

#: How often a stream looks at a run nobody drives (seconds).
IDLE_POLL = 1.0
#: How long the stream lets a burst of messages settle before it sends the run's state (seconds).
SETTLE = 0.3
#: How many runs' latest state events are kept for the browsers that follow them.
STATES_KEPT = 256
#: A comment line this often keeps proxies from closing a quiet stream (seconds).
PING = 15.0
#: How many batches a stream may lag behind its run's reader before it is told to read what it
#: missed from the store (a slow browser never holds the others back).
QUEUED = 64


def _refused(exc: BaseException) -> bytes:
    return _event("refused", {"error": " ".join(str(exc).split())})


def _event(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class EventStream(Response):
    """A ``text/event-stream`` response that ends as soon as the client disconnects (whatever the
    ASGI server's spec version), cancelling its source."""

    media_type = "text/event-stream"

    def __init__(self, source: Callable[[], AsyncIterator[bytes]]) -> None:
        super().__init__(content=None, headers={"cache-control": "no-store", "x-accel-buffering": "no"})
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]  # a stream
        self.source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                with contextlib.suppress(OSError):
                    async for chunk in self.source():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()

            async def disconnected() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(stream)
            group.start_soon(disconnected)


def message_view(m: StoredMessage) -> dict[str, Any]:
    """A message as the transcript shows it: seq, source, type, time, its text (a tool call's or
    result's content as indented JSON)."""
    body = m.body
    content = body.get("content")
    text = content if isinstance(content, str) else json.dumps(content, indent=2, ensure_ascii=False)
    created = body.get("created_at")
    return {
        "seq": m.seq,
        "step": m.step_seq,
        "source": str(body.get("source", "")),
        "type": str(body.get("type", "")),
        "time": created if isinstance(created, str) else "",
        "text": text,
    }


def pictures(store: Store, run_id: str) -> Any:
    """The run's graph and timeline (``pictures.py``), or ``None`` when they cannot be drawn."""
    try:
        found = run_pictures(store, run_id)
    except StoreError:
        raise
    except Exception:
        logger.warning("console: the pictures of run %s could not be drawn", run_id, exc_info=True)
        return None
    return {
        "states": dict(found.states),
        "graph_svg": Markup(found.graph_svg),
        "timeline_svg": Markup(found.timeline_svg),
    }


class _States:
    """The state events of the runs followed, one per run and head, each node's state read from the
    run's steps only (:func:`run_states`: no messages, no agent states, no pictures drawn)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._made: dict[tuple[str, str, int, float], dict[str, Any]] = {}

    def of(self, run: RunRecord) -> dict[str, Any]:
        key = (run.run_id, run.status, run.head_seq, run.updated_at)
        found = self._made.get(key)
        if found is None:
            try:
                states: dict[str, str] | None = run_states(self._store, run.run_id)
            except StoreError:
                raise
            except Exception:
                logger.warning(
                    "console: the node states of run %s could not be read", run.run_id, exc_info=True
                )
                states = None
            found = {
                "status": run.status,
                "head": run.head_seq,
                "messages": run.message_count,
                "states": states,
            }
            if len(self._made) >= STATES_KEPT:
                self._made.clear()
            self._made[key] = found
        return found


class _Batch:
    """A batch of new messages as every stream sends it: encoded once for all of them."""

    __slots__ = ("chunk", "events", "first", "last")

    def __init__(self, messages: list[StoredMessage]) -> None:
        self.events = [
            (m.seq, f"id: {m.seq}\n".encode() + _event("message", message_view(m))) for m in messages
        ]
        self.first, self.last = messages[0].seq, messages[-1].seq
        self.chunk = b"".join(e for _, e in self.events)

    def after(self, seq: int) -> bytes:
        """The events of the messages after ``seq``."""
        if seq < self.first:
            return self.chunk
        return b"".join(e for s, e in self.events if s > seq)


#: What a stream's queue holds: a batch, a state event, a resync order, or the end (with the
#: event to send last, if any).
_RESYNC = object()


class _End:
    __slots__ = ("event",)

    def __init__(self, event: bytes | None) -> None:
        self.event = event


_Item = _Batch | bytes | _End | object


class _Stream:
    """One browser's stream of a run: a bounded queue its run's reader fills. ``mark``: the last seq
    the reader had sent the others when this stream (re)joined: the stream reads what it lacks up to
    it from the store itself."""

    __slots__ = ("behind", "mark", "queue")

    def __init__(self, mark: int) -> None:
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(QUEUED)
        self.mark = mark
        self.behind = False


class _Reader:
    """The one reader of a run in this console process: one :meth:`Store.follow` at a time (then,
    while nobody drives the run, a look at its row every :data:`IDLE_POLL`), each batch encoded once
    and put in every stream's queue; the run's state drawn once for all of them. A stream whose
    queue is full is never waited for: its queue is emptied and it is told to read what it missed
    from the store. Stops when its last stream leaves."""

    def __init__(self, followers: Followers, run_id: str, cursor: int) -> None:
        self._followers = followers
        self._store = followers.store
        self.run_id = run_id
        self.cursor = cursor  # the last seq handed to the streams
        self.state: bytes | None = None  # the latest state event
        self.streams: set[_Stream] = set()
        self._pending: list[StoredMessage] = []
        self._flushing = False
        self._settle: asyncio.TimerHandle | None = None
        self._drawing: asyncio.Task[None] | None = None
        self._seen: tuple[str, int] | None = None
        self._task = asyncio.ensure_future(self._run())

    def join(self) -> _Stream:
        stream = _Stream(self.cursor)
        self.streams.add(stream)
        return stream

    def leave(self, stream: _Stream) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self._forget()
            self._task.cancel()
            if self._drawing is not None:
                self._drawing.cancel()
            if self._settle is not None:
                self._settle.cancel()

    def _put(self, item: _Item) -> None:
        for stream in self.streams:
            if stream.behind:
                continue
            try:
                stream.queue.put_nowait(item)
            except asyncio.QueueFull:  # a slow browser: it reads what it missed from the store
                stream.behind = True
                while not stream.queue.empty():
                    stream.queue.get_nowait()
                stream.queue.put_nowait(_RESYNC)

    def _forget(self) -> None:
        if self._followers.readers.get(self.run_id) is self:
            del self._followers.readers[self.run_id]

    def _end(self, event: bytes | None) -> None:
        self._forget()  # a later stream starts a reader of its own
        for stream in self.streams:
            while not stream.queue.empty():
                stream.queue.get_nowait()
            stream.queue.put_nowait(_End(event))

    async def _run(self) -> None:
        try:
            while True:
                await self._follow()
                await self._idle()
        except RunNotFoundError:
            self._end(_event("gone", {"run_id": self.run_id}))
        except UNREADABLE as exc:
            self._end(_refused(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning("console: following run %s failed", self.run_id, exc_info=True)
            self._end(None)

    async def _follow(self) -> None:
        """The run's new commits while it is driven, handed on in batches."""
        follow = self._store.follow(self.run_id, None if self.cursor < 0 else self.cursor)
        try:
            async for message in follow:  # a batch arrives without a pause between its messages
                self._pending.append(message)
                if not self._flushing:
                    self._flushing = True
                    asyncio.get_running_loop().call_soon(self._flush)
        except (RunNotFoundError, *UNREADABLE):
            raise
        except StoreError as exc:  # the database is down: watch the row until it is back
            logger.info("console: following run %s: %s", self.run_id, exc)
        finally:
            await follow.aclose()
            self._flush()
            if self._settle is not None:
                self._settle.cancel()

    def _flush(self) -> None:
        self._flushing = False
        if not self._pending:
            return
        batch, self._pending = _Batch(self._pending), []
        self.cursor = batch.last
        self._put(batch)
        self.later()

    def later(self) -> None:
        """Draw the state once the messages settle (:data:`SETTLE` without one)."""
        if self._settle is not None:
            self._settle.cancel()
        self._settle = asyncio.get_running_loop().call_later(SETTLE, self._draw_soon)

    def _draw_soon(self) -> None:
        if self._drawing is None or self._drawing.done():
            self._drawing = asyncio.ensure_future(self._draw(None))

    async def _draw(self, run: RunRecord | None) -> None:
        try:
            if run is None:
                run = await run_in_threadpool(self._store.get_run, self.run_id)
            if run is None:
                return  # deleted: the reader says so
            self._seen = (run.status, run.head_seq)
            self.state = _event("state", await run_in_threadpool(self._followers.states.of, run))
            self._put(self.state)
        except UNREADABLE as exc:
            self._end(_refused(exc))
        except StoreError as exc:
            logger.info("console: the state of run %s: %s", self.run_id, exc)

    async def _idle(self) -> None:
        """The run is not driven now: watch its row until it is (or has messages not handed on)."""
        while True:
            try:
                run = await run_in_threadpool(self._store.get_run, self.run_id)
                if run is None:
                    raise RunNotFoundError(f"run {self.run_id} does not exist", run_id=self.run_id)
                if (run.status, run.head_seq) != self._seen:
                    await self._draw(run)
                if run.status == "running" or run.message_count - 1 > self.cursor:
                    return
            except (RunNotFoundError, *UNREADABLE):
                raise
            except StoreError as exc:
                logger.info("console: following run %s: %s", self.run_id, exc)
            await asyncio.sleep(IDLE_POLL)


class Followers:
    """The live streams of this console: one :class:`_Reader` per run followed (``readers``), shared
    by every browser that follows the run, so fifty browsers on one run cost one reader of it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.states = _States(store)
        self.readers: dict[str, _Reader] = {}

    async def endpoint(self, request: Request) -> Response:
        """``GET /runs/{run_id}/events``: the run's messages after ``?after=SEQ`` (or the
        ``Last-Event-ID`` header), then each new one and each change of its state."""
        run_id = check_run_id(request.path_params["run_id"], option="run id")
        given = request.headers.get("last-event-id") or request.query_params.get("after") or "-1"
        try:
            after = int(given)
        except ValueError:
            raise UsageError(f"after={given!r} is not a message seq", option="after") from None
        run = await run_in_threadpool(self.store.get_run, run_id)
        if run is None:
            raise RunNotFoundError(f"run {run_id} does not exist", run_id=run_id)
        openable(run, self.store._e.url)  # its messages are content: refused without the run's keys
        return EventStream(lambda: self.stream(run_id, after))

    async def stream(self, run_id: str, after: int) -> AsyncIterator[bytes]:
        """The event stream of ``run_id`` after seq ``after``."""
        yield b"retry: 2000\n\n"
        reader = self.readers.get(run_id)
        if reader is None:
            run = await run_in_threadpool(self.store.get_run, run_id)
            if run is None:
                yield _event("gone", {"run_id": run_id})
                return
            reader = self.readers.get(run_id)  # another stream may have made it meanwhile
            if reader is None:
                reader = self.readers[run_id] = _Reader(self, run_id, run.message_count - 1)
        stream = reader.join()
        try:
            last = after
            while True:
                if last < stream.mark:  # what the reader handed on before this stream (re)joined
                    caught = last
                    missed = self.store.follow(run_id, None if last < 0 else last, wait=False)
                    try:
                        async for m in missed:
                            if m.seq > stream.mark:
                                break  # the reader hands it on
                            last = m.seq
                            yield f"id: {m.seq}\n".encode() + _event("message", message_view(m))
                    except RunNotFoundError:
                        yield _event("gone", {"run_id": run_id})
                        return
                    except UNREADABLE as exc:
                        yield _refused(exc)
                        return
                    finally:
                        await missed.aclose()
                    if reader.state is not None:
                        yield reader.state
                    elif last > caught:
                        reader.later()  # the state after the messages it read, once they settle
                while True:
                    try:
                        item = await asyncio.wait_for(stream.queue.get(), PING)
                    except asyncio.TimeoutError:
                        yield b": ping\n\n"
                        continue
                    if isinstance(item, _Batch):
                        if item.last > last:
                            yield item.after(last)
                            last = item.last
                    elif isinstance(item, bytes):
                        yield item
                    elif isinstance(item, _End):
                        if item.event is not None:
                            yield item.event
                        return
                    else:  # fell behind: read what was missed from the store
                        stream.behind, stream.mark = False, reader.cursor
                        break
        finally:
            reader.leave(stream)


def events(store: Store) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of the run's live events (see :class:`Followers`)."""
    return Followers(store).endpoint
