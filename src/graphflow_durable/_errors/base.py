"""The root of the tree and the two roots of its categories: the caller's mistake
(:class:`UsageError`) and the database's failure (:class:`StoreError`)."""

from __future__ import annotations

__all__ = ["GraphflowDurableError", "StoreError", "UsageError"]


class GraphflowDurableError(Exception):
    """Root of every error raised by graphflow-durable. ``str(exc)`` is the message."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)


class UsageError(GraphflowDurableError, ValueError):
    """The caller's mistake: a bad argument, option or run id for this call; nothing was done.

    Retrying the same call fails the same way: fix the call (or the configuration). A ``ValueError``.

    Attributes:
        run_id: the run the call named, if any.
        option: the argument or option at fault, if one is.
    """

    def __init__(self, message: str, *, run_id: str | None = None, option: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.option = option


class StoreError(GraphflowDurableError, RuntimeError):
    """The database could not do what was asked (the cause is chained with ``raise ... from``).

    A plain ``StoreError`` (none of the subclasses) is a database problem -- the server is
    unreachable, the file is locked, the driver failed -- not the caller's mistake: the same call
    may succeed later.

    Attributes:
        url: the database URL, password hidden.
        run_id: the run the store was working on, if one.
        action: what the store was doing (``"committing step 4 of run r1"``).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        run_id: str | None = None,
        action: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.url = url
        self.run_id = run_id
        self.action = action
