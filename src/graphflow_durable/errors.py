"""The exception tree of graphflow-durable.

Every error the package raises on purpose derives from :class:`GraphflowDurableError`.
Where plain ``GraphFlow`` raised ``ValueError`` or ``RuntimeError`` for the same situation,
the matching class also derives from that built-in, so existing ``except`` clauses keep working.

This module imports nothing from the package.
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "GraphMismatchError",
    "GraphflowDurableError",
    "LeaseLostError",
    "NotSerializableError",
    "ReplayError",
    "RunLockedError",
    "RunNotFoundError",
    "SchemaVersionError",
    "StateFormatError",
    "StoreConfigError",
    "StoreError",
    "UnrepairableStateError",
]


class GraphflowDurableError(Exception):
    """Root of every error raised by graphflow-durable."""


class StoreError(GraphflowDurableError, RuntimeError):
    """The database could not do what was asked (the cause is chained with ``raise ... from``)."""


class StoreConfigError(StoreError, ValueError):
    """A store URL or store argument is invalid; nothing was opened.

    An unknown or refused option in the URL's query, a bad value, an unsupported backend, or a
    keyword argument and the same option in the URL disagreeing. A ``ValueError`` (the caller gave a
    wrong value) and a :class:`StoreError` (so ``except StoreError`` keeps catching bad URLs).
    """


class SchemaVersionError(StoreError):
    """The database was written by a newer graphflow-durable than the one running."""


class ConflictError(StoreError):
    """A commit expected a head sequence number that is no longer the run's head.

    Another writer committed first; nothing of this commit was written.
    """


class RunNotFoundError(StoreError, LookupError):
    """No run with the given id exists in the store."""


class RunLockedError(StoreError):
    """The run is being driven by another live worker (its lease has not expired)."""


class LeaseLostError(ConflictError):
    """This worker's lease on the run was taken over; it may not write another step."""


class NotSerializableError(GraphflowDurableError, TypeError, ValueError):
    """A value that must be stored is not JSON-serialisable; the message names where it is."""


class GraphMismatchError(GraphflowDurableError, ValueError):
    """The graph given to a team differs from the graph the stored run was started with."""


class StateFormatError(GraphflowDurableError, ValueError):
    """A saved team state has the wrong shape or an unknown format version."""


class ReplayError(GraphflowDurableError, ValueError):
    """A message thread cannot be explained by the graph (names the first message that does not fit)."""


class UnrepairableStateError(GraphflowDurableError, ValueError):
    """A saved state is corrupt in a way repair cannot fix without inventing progress."""
