"""A blocking store call made off the event loop, in a thread the loop never waits for.

A pool worker's store calls (its claim, reading a run's status, giving a claim back, recording a
failure) may wait on the database, on SQLite up to its busy timeout while another process writes.
Made on the event loop, that wait holds off the lease renewals of every run the worker drives and
its SIGTERM handling. :func:`off_loop` runs such a call in a daemon thread of its own: the loop
runs on meanwhile, a caller that stops waiting (a cancellation) is not held up by it, and neither
is the process's exit (``asyncio.to_thread``'s executor is joined at exit: the busy timeout again).
A result nobody awaits any more is handed to ``orphan`` (a claim to give back), in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["off_loop"]

_log = logging.getLogger("graphflow_durable.worker")

T = TypeVar("T")


def _settle_orphan(orphan: Callable[[T], object] | None, result: T) -> None:
    """Hand a result nobody awaits to ``orphan`` (best effort: it is logged if that fails)."""
    if orphan is None:
        return
    try:
        orphan(result)
    except Exception as exc:  # noqa: BLE001 -- nobody is left to raise it to
        _log.warning("a store call's late result could not be given back: %s", exc)


async def off_loop(call: Callable[[], T], *, orphan: Callable[[T], object] | None = None) -> T:
    """``call()`` in a daemon thread; its result or error. Cancelled, it stops waiting at once (the
    call runs on to its end; a result it still returns goes to ``orphan``)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(result: T | None, error: BaseException | None) -> None:  # on the loop
        if future.done():  # the caller stopped waiting
            if error is None:
                threading.Thread(target=_settle_orphan, args=(orphan, result), daemon=True).start()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # noqa: BLE001 -- handed to the awaiting caller
            error = exc
        try:
            loop.call_soon_threadsafe(deliver, result, error)
        except RuntimeError:  # the loop is closed: nobody awaits it any more
            if error is None:
                _settle_orphan(orphan, result)  # type: ignore[arg-type]

    threading.Thread(target=work, name="graphflow-durable-store-call", daemon=True).start()
    return await future
