"""Model-provider rate limits shared by every process (schema version 16): :class:`RateBudgets`,
held by a store as ``store.limits``.

One row per key holds the key's budget as two schedules (the generic cell rate algorithm, GCRA):
``request_at``, the earliest time the key's next call may start, and ``token_at``, the same for
tokens. Taking a call's turn (:meth:`RateBudgets.reserve`) is ONE statement on both backends, an
``INSERT ... ON CONFLICT (key) DO UPDATE ... RETURNING``: the call starts at the latest of both
schedules, now, and the key's pause; the schedules move on from there by the call's share of a
minute (``spacing`` seconds, and its estimated tokens' ``token_seconds``). The row is locked by the
statement itself (SQLite: the write lock; PostgreSQL: the row's), so concurrent callers of every
process each get a distinct turn: none is ever given a start a spacing closer to another's.

The ``window_*`` columns count the calls and tokens taken since ``window_start`` (reset on the
first call a minute or more after it): what ``graphflow-durable limits list`` shows as the use of
the current window. Times are the callers' ``time.time()`` (hosts' clocks must agree, as leases
need).
"""

from __future__ import annotations

import builtins
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.schema import rate_limits

__all__ = ["LimitState", "RateBudgets"]

_C = rate_limits.c
#: The window the ``window_*`` columns count over, in seconds.
WINDOW = 60.0


@dataclass(frozen=True)
class LimitState:
    """A key's row: its limits (as the last caller gave them), the next free turn of its calls and
    tokens, its pause, and the calls and tokens taken in the window that began at ``window_start``."""

    key: str
    requests_per_minute: float | None
    tokens_per_minute: float | None
    request_at: float
    token_at: float
    paused_until: float
    window_start: float
    window_requests: int
    window_tokens: int
    updated_at: float

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The state as ``limits list --json`` prints it (``now``: default ``time.time()``)."""
        now = time.time() if now is None else now
        current = now - self.window_start < WINDOW
        return {
            "key": self.key,
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "window_start": self.window_start if current else None,
            "requests_in_window": self.window_requests if current else 0,
            "tokens_in_window": self.window_tokens if current else 0,
            "requests_left": _left(self.requests_per_minute, self.window_requests if current else 0),
            "tokens_left": _left(self.tokens_per_minute, self.window_tokens if current else 0),
            "next_free_in_s": round(max(self.request_at, self.token_at, self.paused_until, now) - now, 3),
            "paused_until": self.paused_until if self.paused_until > now else None,
        }


def _left(limit: float | None, used: int) -> float | None:
    """What the current window has left of ``limit`` (``None``: no such limit)."""
    return None if limit is None else max(limit - used, 0)


def _greatest(dialect: str, *values: Any) -> Any:
    return sa.func.greatest(*values) if dialect == "postgresql" else sa.func.max(*values)


def _upsert(dialect: str) -> Any:
    return (postgresql if dialect == "postgresql" else sqlite).insert(rate_limits)


class RateBudgets:
    """The rate-limit budgets of a store: ``store.limits``. Each method is one statement in one
    transaction; database errors are raised as :class:`StoreError`."""

    def __init__(self, engines: Engines) -> None:
        self._e = engines
        dialect = engines.dialect
        now: Any = sa.bindparam("now", type_=sa.Double)
        spacing: Any = sa.bindparam("spacing", type_=sa.Double)
        token_seconds: Any = sa.bindparam("tseconds", type_=sa.Double)
        tokens: Any = sa.bindparam("tokens", type_=sa.BigInteger)
        start = _greatest(dialect, _C.request_at, _C.token_at, _C.paused_until, now)
        stale = _C.window_start <= now - WINDOW
        insert = _upsert(dialect).values(
            key=sa.bindparam("p_key"),
            requests_per_minute=sa.bindparam("rpm"),
            tokens_per_minute=sa.bindparam("tpm"),
            request_at=now + spacing,
            token_at=now + token_seconds,
            paused_until=0.0,
            window_start=now,
            window_requests=1,
            window_tokens=tokens,
            updated_at=now,
        )
        self._reserve = insert.on_conflict_do_update(
            index_elements=[_C.key],
            set_={
                "requests_per_minute": insert.excluded.requests_per_minute,
                "tokens_per_minute": insert.excluded.tokens_per_minute,
                "request_at": start + spacing,
                "token_at": start + token_seconds,
                "window_start": sa.case((stale, now), else_=_C.window_start),
                "window_requests": sa.case((stale, 1), else_=_C.window_requests + 1),
                "window_tokens": sa.case((stale, tokens), else_=_C.window_tokens + tokens),
                "updated_at": now,
            },
        ).returning(_C.request_at, _C.token_at)
        until: Any = sa.bindparam("until", type_=sa.Double)
        pause = _upsert(dialect).values(
            key=sa.bindparam("p_key"),
            request_at=0.0,
            token_at=0.0,
            paused_until=until,
            window_start=0.0,
            window_requests=0,
            window_tokens=0,
            updated_at=sa.bindparam("now"),
        )
        self._pause = pause.on_conflict_do_update(
            index_elements=[_C.key],
            set_={"paused_until": _greatest(dialect, _C.paused_until, until), "updated_at": now},
        )
        self._correct = (
            sa.update(rate_limits)
            .where(_C.key == sa.bindparam("p_key"))
            .values(
                token_at=_C.token_at + token_seconds,
                window_tokens=sa.case(
                    (_C.window_start <= now - WINDOW, _C.window_tokens), else_=_C.window_tokens + tokens
                ),
            )
        )

    def _guard(self, action: str) -> AbstractContextManager[None]:
        return guarded(self._e, action)

    def reserve(
        self,
        key: str,
        *,
        spacing: float,
        tokens: int = 0,
        token_seconds: float = 0.0,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        now: float | None = None,
    ) -> float:
        """Take the key's next turn for one call (``tokens`` estimated, worth ``token_seconds`` of
        the token schedule; ``spacing``: the seconds its request is worth); return the time it may
        start (epoch seconds; ``now`` or earlier: at once). One statement."""
        params = {
            "p_key": key,
            "now": time.time() if now is None else now,
            "spacing": spacing,
            "tseconds": token_seconds,
            "tokens": tokens,
            "rpm": requests_per_minute,
            "tpm": tokens_per_minute,
        }
        with self._guard(f"taking a turn of rate limit {key!r}"), self._e.write.begin() as conn:
            request_at, token_at = conn.execute(self._reserve, params).one()
        return max(float(request_at) - spacing, float(token_at) - token_seconds)

    def correct(self, key: str, *, tokens: int, token_seconds: float, now: float | None = None) -> None:
        """A call's reported tokens differed from its estimate by ``tokens`` (worth
        ``token_seconds``; either may be negative): move the key's token schedule by as much."""
        params = {
            "p_key": key,
            "tokens": tokens,
            "tseconds": token_seconds,
            "now": time.time() if now is None else now,
        }
        with self._guard(f"correcting the tokens of rate limit {key!r}"), self._e.write.begin() as conn:
            conn.execute(self._correct, params)

    def pause(self, key: str, until: float, *, now: float | None = None) -> None:
        """No call of ``key`` starts before ``until`` (epoch seconds), in any process (a provider's
        ``Retry-After``); a later pause already set is kept."""
        params = {"p_key": key, "until": until, "now": time.time() if now is None else now}
        with self._guard(f"pausing rate limit {key!r}"), self._e.write.begin() as conn:
            conn.execute(self._pause, params)

    def paused_until(self, key: str) -> float:
        """The end of ``key``'s pause (epoch seconds; 0: never paused, or no row)."""
        query = sa.select(_C.paused_until).where(_C.key == key)
        with self._guard(f"reading rate limit {key!r}"), self._e.read.begin() as conn:
            found = conn.execute(query).scalar()
        return 0.0 if found is None else float(found)

    def list(self) -> builtins.list[LimitState]:
        """Every key's state, by key."""
        with self._guard("listing the rate limits"), self._e.read.begin() as conn:
            rows = conn.execute(sa.select(rate_limits).order_by(_C.key)).mappings().all()
        return [
            LimitState(
                key=r["key"],
                requests_per_minute=r["requests_per_minute"],
                tokens_per_minute=r["tokens_per_minute"],
                request_at=float(r["request_at"]),
                token_at=float(r["token_at"]),
                paused_until=float(r["paused_until"]),
                window_start=float(r["window_start"]),
                window_requests=int(r["window_requests"]),
                window_tokens=int(r["window_tokens"]),
                updated_at=float(r["updated_at"]),
            )
            for r in rows
        ]
