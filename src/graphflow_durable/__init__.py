"""graphflow-durable: durable execution for AutoGen's GraphFlow.

Swap ``GraphFlow`` for :class:`DurableGraphFlow`, add ``store=`` and ``run_id=``, and every agent
completion is committed to a database; a new process with the same run id resumes exactly where
the last commit left off.
"""

from __future__ import annotations

from .context import ExecutionContext, current_execution
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
    StoreConfigError,
    StoreError,
    UnrepairableStateError,
)
from .flow import DurableGraphFlow, DurableGraphFlowConfig, default_store_url
from .integrity import Finding, RepairResult, ValidationReport, repair_state, validate_state
from .store import RunRecord, Store
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "DurableGraphFlow",
    "DurableGraphFlowConfig",
    "ExecutionContext",
    "Finding",
    "GraphMismatchError",
    "GraphflowDurableError",
    "LeaseLostError",
    "NotSerializableError",
    "RepairResult",
    "ReplayError",
    "RunLockedError",
    "RunNotFoundError",
    "RunRecord",
    "SchemaVersionError",
    "StateFormatError",
    "Store",
    "StoreConfigError",
    "StoreError",
    "UnrepairableStateError",
    "ValidationReport",
    "Worker",
    "__version__",
    "current_execution",
    "default_store_url",
    "repair_state",
    "validate_state",
]
