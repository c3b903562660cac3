"""The exception tree of graphflow-durable.

Every error the package raises on purpose derives from :class:`GraphflowDurableError`.
Where plain ``GraphFlow`` raised ``ValueError`` or ``RuntimeError`` for the same situation,
the matching class also derives from that built-in, so existing ``except`` clauses keep working.

Each error carries the facts its message states as keyword attributes (``run_id``, ``node``,
``owner``, ``expires_at``, ``expected_head``/``actual_head``...), ``None`` where the raiser did not
know them; ``str(exc)`` is the message. The categories are exact, so a caller (the worker pool, a
CLI) can act on the class alone:

- :class:`UsageError`: the caller asked for something wrong (an argument, an option, a run id, a
  graph); retrying the same call fails the same way.
- :class:`StoreError` (not one of its subclasses below): the database failed (unreachable, locked,
  a driver error); the same call may succeed later.
- :class:`ConflictError` / :class:`LeaseLostError` / :class:`RunLockedError`: another writer got
  there first or holds the run; nothing of this call was written.
- :class:`StoreCorruptError`: the stored rows contradict each other; retrying does not help.

The classes are defined by category in ``_errors`` (``base``, ``store``, ``runs``, ``values``) and
belong here: their ``__module__`` is this module, so tracebacks, ``help()`` and pickles name
``graphflow_durable.errors``. Neither imports anything else from the package.
"""

from __future__ import annotations

from graphflow_durable._errors.base import GraphflowDurableError, StoreError, UsageError
from graphflow_durable._errors.runs import (
    GraphMismatchError,
    InputDeadlineError,
    NotWaitingError,
    RunExistsError,
    RunStateError,
)
from graphflow_durable._errors.store import (
    ConflictError,
    LeaseLostError,
    RunLockedError,
    RunNotFoundError,
    SchemaVersionError,
    StoreConfigError,
    StoreCorruptError,
)
from graphflow_durable._errors.values import (
    NotSerializableError,
    ReplayError,
    StateFormatError,
    UnrepairableStateError,
)

__all__ = [
    "ConflictError",
    "GraphMismatchError",
    "GraphflowDurableError",
    "InputDeadlineError",
    "LeaseLostError",
    "NotSerializableError",
    "NotWaitingError",
    "ReplayError",
    "RunExistsError",
    "RunLockedError",
    "RunNotFoundError",
    "RunStateError",
    "SchemaVersionError",
    "StateFormatError",
    "StoreConfigError",
    "StoreCorruptError",
    "StoreError",
    "UnrepairableStateError",
    "UsageError",
]

# Each class is named by its public path (tracebacks, help(), pickles), not by its _errors module.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
