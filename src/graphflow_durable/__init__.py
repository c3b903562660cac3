"""graphflow-durable: durable execution for AutoGen's GraphFlow.

Swap ``GraphFlow`` for :class:`DurableGraphFlow`, add ``store=`` and ``run_id=``, and every agent
completion is committed to a database; a new process with the same run id resumes exactly where
the last commit left off.
"""

from __future__ import annotations

from graphflow_durable._model import exported as _exported
from graphflow_durable._model.records import SealedValue
from graphflow_durable._storage.admin import use_answer_rule as _use_answer_rule
from graphflow_durable._storage.document import ContentChecks as _ContentChecks
from graphflow_durable._storage.document import use_content_checks as _use_content_checks
from graphflow_durable._version import __version__
from graphflow_durable.context import ExecutionContext, ToolCallContext, current_execution, current_tool_call
from graphflow_durable.errors import (
    ConflictError,
    GraphflowDurableError,
    GraphMismatchError,
    InputDeadlineError,
    LeaseLostError,
    NodeFailedError,
    NodeTimeoutError,
    NotSerializableError,
    NotWaitingError,
    ReplayError,
    RunExistsError,
    RunLockedError,
    RunNotFoundError,
    RunStateError,
    SchemaVersionError,
    StateFormatError,
    StoreConfigError,
    StoreCorruptError,
    StoreError,
    UnrepairableStateError,
    UsageError,
)
from graphflow_durable.flow import (
    DurableGraphFlow,
    DurableGraphFlowConfig,
    HumanInput,
    attach_stream,
    default_store_url,
)
from graphflow_durable.integrity import Finding, RepairResult, ValidationReport, repair_state, validate_state
from graphflow_durable.ratelimit import RateLimit, RateLimitedChatCompletionClient, rate_limited
from graphflow_durable.recorded import (
    RecordedChatCompletionClient,
    RecordedStreamWorkbench,
    RecordedWorkbench,
    recorded,
)
from graphflow_durable.retry import NodeRetryEvent, RetryPolicy, TimeoutPolicy
from graphflow_durable.store import InputRequest, RunRecord, StepInfo, Store
from graphflow_durable.worker import Worker

# Storage never imports AutoGen: the package hands the store's import its AutoGen-side checks here,
# where both are loaded, before any store can be used (``Store.import_run``, ``runs import``), and
# the scheduler's rule for an operator's answer (``Store.supply_output``, ``runs supply``).
_use_content_checks(
    _ContentChecks(message=_exported.check_message, graph=_exported.check_graph, head=_exported.check_head)
)
_use_answer_rule(_exported.supplied_answer)

__all__ = [
    "ConflictError",
    "DurableGraphFlow",
    "DurableGraphFlowConfig",
    "ExecutionContext",
    "Finding",
    "GraphMismatchError",
    "GraphflowDurableError",
    "HumanInput",
    "InputDeadlineError",
    "InputRequest",
    "LeaseLostError",
    "NodeFailedError",
    "NodeRetryEvent",
    "NodeTimeoutError",
    "NotSerializableError",
    "NotWaitingError",
    "RateLimit",
    "RateLimitedChatCompletionClient",
    "RecordedChatCompletionClient",
    "RecordedStreamWorkbench",
    "RecordedWorkbench",
    "RepairResult",
    "ReplayError",
    "RetryPolicy",
    "RunExistsError",
    "RunLockedError",
    "RunNotFoundError",
    "RunRecord",
    "RunStateError",
    "SchemaVersionError",
    "SealedValue",
    "StateFormatError",
    "StepInfo",
    "Store",
    "StoreConfigError",
    "StoreCorruptError",
    "StoreError",
    "TimeoutPolicy",
    "ToolCallContext",
    "UnrepairableStateError",
    "UsageError",
    "ValidationReport",
    "Worker",
    "__version__",
    "attach_stream",
    "current_execution",
    "current_tool_call",
    "default_store_url",
    "rate_limited",
    "recorded",
    "repair_state",
    "validate_state",
]
