"""Expected control flow stays out of the ERROR log: what AutoGen and psycopg log about it.

A lost lease is a normal event in a worker pool, and a database outage one a pool rides out; the
package says what happened in one line of its own (``run X: lease lost to OWNER; stopped
dispatching``) and the run raises the error to its caller. Without these filters the same event
also surfaces as tracebacks logged by libraries:

- AutoGen's runtime logs ``Error processing publish message for ...`` at ERROR, with the
  traceback, for every exception a message handler raises: the manager's refused commit
  (:class:`~graphflow_durable.errors.LeaseLostError`), a commit that failed in a database outage,
  a turn cancelled by a halt (``CancelledError``), a message published after the runtime stopped
  while a halted run winds down (``QueueShutDown``), a request's deadline that failed its turn
  (:class:`~graphflow_durable.errors.InputDeadlineError`);
- psycopg logs ``error ignored terminating <Pipeline>: pipeline aborted`` at WARNING when the
  statements of a refused commit fail inside pipeline mode (the commit's own error is raised).

:func:`install` puts a filter on each of those two loggers that drops such records (they are
logged again at DEBUG on ``graphflow_durable.flow``, traceback included). Every other record passes
unchanged: an agent's own error is still logged by AutoGen at ERROR with its traceback.
"""

from __future__ import annotations

import asyncio
import logging

from graphflow_durable.errors import (
    ConflictError,
    InputDeadlineError,
    StoreCorruptError,
    StoreError,
    UsageError,
)

__all__ = ["expected", "install"]

logger = logging.getLogger("graphflow_durable.flow")


def expected(exc: BaseException) -> bool:
    """Whether ``exc`` is control flow the package handles and reports itself.

    Another driver took the run (:class:`ConflictError` and its subclasses); the database failed
    (a plain :class:`StoreError`: the run raises it, a worker logs it as a database problem); a
    cancellation (a halt or an interrupt); AutoGen's runtime queue shut down under a turn; a request
    for a person past its deadline (:class:`InputDeadlineError`, wrapped by ``UserProxyAgent``: the
    run raises it and records it as its last error).
    """
    if isinstance(exc, (asyncio.CancelledError, ConflictError)):
        return True
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, InputDeadlineError):
            return True
        cause = cause.__cause__
    if isinstance(exc, StoreError):
        return not isinstance(exc, (UsageError, StoreCorruptError))
    # asyncio.QueueShutDown (Python 3.13) or autogen_core's own copy of it before 3.13.
    return any(cls.__name__ == "QueueShutDown" for cls in type(exc).__mro__)


class _HandledByUs(logging.Filter):
    """On ``autogen_core``: drop a handler-exception record whose exception is :func:`expected`."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.levelno < logging.WARNING or not expected(exc):
            return True
        logger.debug(
            "AutoGen logged %r at %s for %s (expected; the run reports it)",
            record.getMessage(),
            record.levelname,
            type(exc).__name__,
            exc_info=record.exc_info,
        )
        return False


class _PipelineAborted(logging.Filter):
    """On ``psycopg``: drop "error ignored ... pipeline aborted" (a consequence of the error raised)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("error ignored") and any(
            type(arg).__name__ == "PipelineAborted" for arg in args
        ):
            logger.debug("psycopg: %s", record.getMessage())
            return False
        return True


def install() -> None:
    """Put the filters on the ``autogen_core`` and ``psycopg`` loggers (once; idempotent)."""
    for name, kind in (("autogen_core", _HandledByUs), ("psycopg", _PipelineAborted)):
        target = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in target.filters):
            target.addFilter(kind())
