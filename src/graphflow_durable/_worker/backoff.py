"""The worker's claim pause after database problems: it doubles with each problem in a row, is not
lengthened by problems during it, and ends (with one log line) when the database answers again."""

from __future__ import annotations

import logging
import time

from graphflow_durable.errors import SchemaVersionError, StoreCorruptError, StoreError, UsageError

__all__ = ["DatabaseBackoff", "one_line", "passing"]

_log = logging.getLogger("graphflow_durable.worker")  # the pool's logger, wherever its parts live


class DatabaseBackoff:
    """Database errors in a row (claims and runs) of one worker, and the claim pause they set.

    Args:
        owner: the worker's id, for the log lines.
        backoff_seconds, max_backoff_seconds: the first pause, and the longest.
    """

    def __init__(self, owner: str, backoff_seconds: float, max_backoff_seconds: float) -> None:
        self._owner = owner
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._failures = 0  # database errors in a row
        self._since = 0.0  # monotonic time of the first of them
        self.resume_at = 0.0  # monotonic time before which nothing is claimed

    def problem(self, action: str, exc: StoreError) -> float:
        """Log a database error (not any run's fault) in one line and pause claiming; return the pause.

        The pause doubles with each problem in a row; problems during a pause (the other runs in
        flight hitting the same outage) do not lengthen it.
        """
        now = time.monotonic()
        if now < self.resume_at:
            pause = self.resume_at - now
        else:
            if self._failures == 0:
                self._since = now
            self._failures += 1
            pause = min(self._backoff * 2.0 ** (self._failures - 1), self._max_backoff)
            self.resume_at = now + pause
        _log.error(
            "worker %s: database problem while %s (claims paused %.3g s): %s",
            self._owner,
            action,
            pause,
            one_line(exc),
        )
        return pause

    def back(self) -> None:
        """The database answered: after problems, say so once and reset the back-off."""
        if self._failures:
            _log.warning(
                "worker %s: the database is back after %.1f s of problems; claims resumed",
                self._owner,
                time.monotonic() - self._since,
            )
        self._failures = 0


def passing(exc: StoreError) -> bool:
    """Whether ``exc`` is a database problem that may pass (not a bad URL, a foreign database, a
    newer schema or corrupt rows: those stay until someone acts)."""
    return not isinstance(exc, (UsageError, SchemaVersionError, StoreCorruptError))


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one log line (libpq's messages span several)."""
    return " ".join(str(exc).split())
