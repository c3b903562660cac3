"""Live updates of a run's page: ``GET /runs/{run_id}/events``, Server-Sent Events from
:meth:`Store.follow`.

Events: ``message`` (one new message: seq, source, type, time, text) and ``state`` (the run's
status, head and, when the pictures can be drawn, each node's state), sent after each batch of
messages and whenever the run's row changes; ``gone`` (the run was deleted) and ``refused`` (a
row is sealed under a key the console was not given, or damaged: one line) end the stream. While the run is driven the follower waits on the
store's shared feed (PostgreSQL: LISTEN/NOTIFY; SQLite: polling with back-off; the store's reads
run in threads, never on the event loop); once the run is no longer driven, the stream looks at the
run's row every :data:`IDLE_POLL` seconds and follows again when a driver takes it. A browser that
leaves ends the stream at once (the response watches for the disconnect), and the follower is
closed with it.
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
from graphflow_durable.errors import (
    RunNotFoundError,
    StoreConfigError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.store import RunRecord, Store, StoredMessage
from graphflow_durable.ui.pictures import run_pictures

__all__ = ["IDLE_POLL", "PING", "SETTLE", "EventStream", "events", "message_view", "pictures"]

logger = logging.getLogger(__name__)

#: How often a stream looks at a run nobody drives (seconds).
IDLE_POLL = 1.0
#: How long the stream lets a burst of messages settle before it sends the run's state (seconds).
SETTLE = 0.3
#: How many runs' latest state events are kept for the browsers that follow them.
STATES_KEPT = 256
#: A comment line this often keeps proxies from closing a quiet stream (seconds).
PING = 15.0


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
    """The state events of the runs followed, one per run and head: fifty browsers watching one run
    draw its pictures once per commit, not fifty times."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._made: dict[tuple[str, str, int, float], dict[str, Any]] = {}

    def of(self, run: RunRecord) -> dict[str, Any]:
        key = (run.run_id, run.status, run.head_seq, run.updated_at)
        found = self._made.get(key)
        if found is None:
            drawn = pictures(self._store, run.run_id)
            found = {
                "status": run.status,
                "head": run.head_seq,
                "messages": run.message_count,
                "states": None if drawn is None else drawn["states"],
            }
            if len(self._made) >= STATES_KEPT:
                self._made.clear()
            self._made[key] = found
        return found


def events(store: Store) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint: the run's messages after ``?after=SEQ`` (or the ``Last-Event-ID`` header), then
    each new one and each change of its state."""
    states = _States(store)

    async def endpoint(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"], option="run id")
        given = request.headers.get("last-event-id") or request.query_params.get("after") or "-1"
        try:
            after = int(given)
        except ValueError:
            raise UsageError(f"after={given!r} is not a message seq", option="after") from None
        if await run_in_threadpool(store.get_run, run_id) is None:
            raise RunNotFoundError(f"run {run_id} does not exist", run_id=run_id)

        async def source() -> AsyncIterator[bytes]:
            nonlocal after
            seen: tuple[str, int] | None = None

            async def state() -> bytes | None:
                nonlocal seen
                run = await run_in_threadpool(store.get_run, run_id)
                if run is None:
                    return None
                seen = (run.status, run.head_seq)
                return _event("state", await run_in_threadpool(states.of, run))

            yield b"retry: 2000\n\n"
            while True:
                follow = store.follow(run_id, None if after < 0 else after)
                waiting: asyncio.Future[Any] | None = None
                dirty = False
                try:
                    while True:
                        if waiting is None:
                            waiting = asyncio.ensure_future(follow.__anext__())
                        done, _ = await asyncio.wait({waiting}, timeout=SETTLE if dirty else PING)
                        if not done:  # quiet: the state after the last messages, or a ping
                            if dirty:
                                dirty = False
                                said = await state()
                                if said is not None:
                                    yield said
                            else:
                                yield b": ping\n\n"
                            continue
                        task, waiting = waiting, None
                        try:
                            m = task.result()
                        except StopAsyncIteration:
                            break
                        after, dirty = m.seq, True
                        yield f"id: {m.seq}\n".encode() + _event("message", message_view(m))
                except RunNotFoundError:
                    yield _event("gone", {"run_id": run_id})
                    return
                except (StoreConfigError, StoreCorruptError) as exc:  # no key for it, or damaged
                    yield _event("refused", {"error": " ".join(str(exc).split())})
                    return
                except StoreError as exc:  # the database is down: watch the row until it is back
                    logger.info("console: following run %s: %s", run_id, exc)
                finally:
                    if waiting is not None:
                        waiting.cancel()
                        with contextlib.suppress(BaseException):
                            await waiting
                    await follow.aclose()
                idle = 0.0
                while True:  # the run is not driven now: watch its row
                    try:
                        run = await run_in_threadpool(store.get_run, run_id)
                        if run is None:
                            yield _event("gone", {"run_id": run_id})
                            return
                        if (run.status, run.head_seq) != seen:
                            said = await state()
                            if said is not None:
                                yield said
                        if run.status == "running" or run.message_count - 1 > after:
                            break
                    except StoreError as exc:
                        logger.info("console: following run %s: %s", run_id, exc)
                    await asyncio.sleep(IDLE_POLL)
                    idle += IDLE_POLL
                    if idle >= PING:
                        idle = 0.0
                        yield b": ping\n\n"

        return EventStream(source)

    return endpoint
