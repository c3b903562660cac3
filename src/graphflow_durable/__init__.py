"""graphflow-durable: durable execution for AutoGen's GraphFlow."""

from __future__ import annotations

from .errors import (
    ConflictError,
    GraphflowDurableError,
    GraphMismatchError,
    LeaseLostError,
    NotSerializableError,
    ReplayError,
    RunLockedError,
    RunNotFoundError,
    SchemaVersionError,
    StateFormatError,
    StoreError,
    UnrepairableStateError,
)

__version__ = "0.1.0"

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
    "StoreError",
    "UnrepairableStateError",
    "__version__",
]
