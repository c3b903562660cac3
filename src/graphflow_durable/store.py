"""The run store: the only module that runs SQL. It knows nothing of AutoGen beyond JSON.

A run is an append-only log of *steps* (one per committed transition), each carrying the
messages it added to the thread, the scheduler state after it, and the agent states it saved.
Every public writing method is one transaction guarded by the run's expected head sequence
number and its lease fencing token: a stale writer gets :class:`ConflictError` (or
:class:`LeaseLostError`) and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AgentStateRecord",
    "MessageRecord",
    "RunLog",
    "RunRecord",
    "RunStatus",
    "RunUpdate",
    "Step",
    "StepRecord",
    "Store",
    "StoredMessage",
]

RunStatus = Literal["running", "interrupted", "failed", "finished"]


@dataclass(frozen=True)
class MessageRecord:
    """A message to append to a run's thread.

    Attributes:
        seq: its position in the thread (0-based, contiguous; the first message of a commit is the
            run's current message count).
        body: the message as AutoGen's ``message.dump()`` returns it.
        published: whether the message was broadcast to the participants (it then belongs in
            their input buffers); inner events of an agent's turn are not.
    """

    seq: int
    body: Mapping[str, Any]
    published: bool


@dataclass(frozen=True)
class AgentStateRecord:
    """A participant's state saved in a commit (as ``agent.save_state()`` returns it)."""

    node: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Step:
    """One transition to commit.

    Attributes:
        kind: ``"start"`` (a round begins: task messages, first selection), ``"complete"``
            (a node's answer, possibly followed by the next selection), ``"input"`` (user input
            added to an unfinished round), ``"stop"`` (the round ended), ``"reset"``.
        node: the node that completed, for ``"complete"``.
        scheduler: the scheduler state after the step (JSON, opaque to the store).
        data: anything else the flow needs to resume (JSON, opaque to the store).
    """

    kind: str
    node: str | None
    scheduler: Mapping[str, Any]
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunUpdate:
    """Run-level fields a commit changes at the same time (``None`` = unchanged)."""

    status: RunStatus | None = None
    task: Any = None
    result: Any = None


@dataclass(frozen=True)
class RunRecord:
    """A run's row."""

    run_id: str
    graph_fingerprint: str
    graph: Mapping[str, Any]
    status: RunStatus
    head_seq: int
    message_count: int
    task: Any
    result: Any
    lease_owner: str | None
    lease_expires_at: float | None
    fencing_token: int
    parent_run_id: str | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class StepRecord:
    """A committed step, as read back (the scheduler state only for the head step, in RunLog)."""

    seq: int
    kind: str
    node: str | None
    data: Mapping[str, Any]
    created_at: float


@dataclass(frozen=True)
class StoredMessage:
    """A message of the thread, as read back."""

    seq: int
    step_seq: int
    body: Mapping[str, Any]
    published: bool


@dataclass(frozen=True)
class RunLog:
    """Everything needed to resume a run, read in one transaction."""

    run: RunRecord
    steps: Sequence[StepRecord]
    messages: Sequence[StoredMessage]
    scheduler: Mapping[str, Any] | None
    agent_states: Mapping[str, Mapping[str, Any]]


class Store:
    """Runs, steps, messages, agent states and leases over SQLAlchemy 2.x Core.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path.db`` (embedded, the default backend),
            ``sqlite://`` (in memory, shared across threads), or ``postgresql://...``
            (psycopg 3; ``postgresql+psycopg://`` also accepted).
        synchronous: SQLite ``PRAGMA synchronous`` (``"FULL"`` default, or ``"NORMAL"``).
    """

    def __init__(self, url: str, *, synchronous: str = "FULL") -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def create_run(
        self,
        run_id: str,
        *,
        graph_fingerprint: str,
        graph: Mapping[str, Any],
        owner: str,
        lease_seconds: float,
        parent_run_id: str | None = None,
    ) -> RunRecord:
        """Create a run (status ``running``, head 0, no steps), leased to ``owner``."""
        raise NotImplementedError

    def get_run(self, run_id: str) -> RunRecord | None:
        raise NotImplementedError

    def commit(
        self,
        run_id: str,
        *,
        expected_head: int,
        fencing_token: int,
        step: Step,
        messages: Sequence[MessageRecord] = (),
        agent_states: Sequence[AgentStateRecord] = (),
        update: RunUpdate | None = None,
    ) -> int:
        """Append one step atomically; return the new head (``expected_head + 1``)."""
        raise NotImplementedError

    def load(self, run_id: str) -> RunLog:
        raise NotImplementedError
