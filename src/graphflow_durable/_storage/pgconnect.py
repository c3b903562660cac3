"""PostgreSQL connections that give up on a server that does not answer.

TCP keepalives and ``tcp_user_timeout`` (the libpq defaults in ``urls``) end a connection whose
packets are dropped. They miss a peer that still acknowledges the bytes but never answers: a
pooler or proxy (PgBouncer, an HAProxy, a cloud SQL proxy) cut off from the server, or a frozen
server host whose kernel still runs. :class:`BoundedConnection` waits at most
:attr:`~BoundedConnection.answer_within` seconds for the server (``statement_timeout`` plus
:data:`GRACE`: the server cancels a slow statement itself, and says so, before the client gives
up), then closes the connection and raises :class:`psycopg.OperationalError`; SQLAlchemy sees a
closed connection, so the pool drops it.

Imported only when a PostgreSQL engine is made: psycopg is an optional dependency.
"""

from __future__ import annotations

import time
from selectors import DefaultSelector
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen

__all__ = ["GRACE", "BoundedConnection"]

#: Seconds the client waits past ``statement_timeout`` before it gives a silent server up.
GRACE = 5.0
#: How often the wait wakes up (lets a signal handler, e.g. Ctrl+C, run in the main thread).
_INTERVAL = 0.1

_R = TypeVar("_R")


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits for the server end after :attr:`answer_within` seconds.

    ``answer_within`` is ``None`` for no bound (the psycopg wait); the engine sets it on connect and
    lifts it for a migration (which may legitimately wait long on the migration lock).
    """

    answer_within: float | None = None

    def wait(self, gen: PQGen[_R], *args: Any, **kwargs: Any) -> _R:
        """Consume ``gen`` like psycopg does, within :attr:`answer_within` seconds."""
        bound = self.answer_within
        if bound is None:
            return super().wait(gen, *args, **kwargs)
        try:
            return _wait(gen, self.pgconn.socket, time.monotonic() + bound)
        except TimeoutError:
            self.pgconn.finish()  # the protocol state is unknown: this connection is done
            raise psycopg.OperationalError(
                f"no answer from the server within {bound:g} s (statement_timeout + {GRACE:g} s); "
                "the connection is given up as lost (a network partition, or a proxy or server that "
                "stopped answering)"
            ) from None


def _wait(gen: PQGen[_R], fileno: int, deadline: float) -> _R:
    """psycopg's selector wait with a deadline (:class:`TimeoutError` when it passes).

    ``gen`` yields the events it waits for (psycopg's ``Wait``: 1 read, 2 write, 3 both, the
    selector's own flags) and is sent the events that are ready.
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
        result: _R = done.value
        return result
