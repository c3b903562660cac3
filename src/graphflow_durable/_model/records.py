"""The store's value objects: what a commit takes and what a load returns (JSON values, no AutoGen).

Re-exported by :mod:`graphflow_durable.store`, which is where they are documented for users.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Literal, get_args

from graphflow_durable._model.human import InputRequest
from graphflow_durable.errors import NodeFailedError

__all__ = [
    "CALL_KINDS",
    "CALL_OUTCOMES",
    "CallKind",
    "CallOutcome",
    "CallRecord",
    "CallSummary",
    "StepKind",
    "AgentStateRecord",
    "NodeFailure",
    "AgentStateRow",
    "MessageRecord",
    "RunLog",
    "RunRecord",
    "SealedValue",
    "ENDED_STATUSES",
    "FIRST_FENCING_TOKEN",
    "FRESH_BUDGET",
    "RUN_STATUSES",
    "RunStatus",
    "RunUpdate",
    "Step",
    "StepRecord",
    "StoredMessage",
    "turn_counts",
]

RunStatus = Literal["running", "interrupted", "stopped", "failed", "cancelled", "finished", "waiting"]
"""A run's status. ``waiting``: a node asked for human input (``HumanInput("wait")``) and nothing
else can run until it is answered (``Store.respond``; an answer makes the run ``interrupted``, to be
resumed). ``stopped``: its round was ended by the termination condition, ``max_turns`` or an
external termination (``run()`` with no task continues it, as GraphFlow does); ``cancelled``: stopped
on request (``Store.cancel_run``; ``run()`` with no task resumes it, worker pools leave it alone
until ``Store.retry_run``); ``finished``: the graph completed (nothing left to run; ``run()`` with no
task returns the stored result)."""

RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)

#: The first fencing token a store issues. Tokens come from one store-wide counter (every new run,
#: import, fork, lease taken or taken over draws the next), so no token repeats for a run id: a run's
#: own token is :attr:`RunRecord.fencing_token` (and what the store driver's ``acquire_lease`` returns).
FIRST_FENCING_TOKEN = 1

#: Statuses whose last round has ended: the run is at rest until a caller continues it.
ENDED_STATUSES: tuple[RunStatus, ...] = ("stopped", "finished")


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
    """A participant's state saved in a commit (as ``agent.save_state()`` returns it).

    With ``base_step`` set, ``body`` is a delta against the node's state saved at step
    ``base_step``, which must be the node's previous row: a splice of its canonical JSON text
    (``{"at", "cut", "put"}``, see ``_agentstate.textdelta``; pieces may reference messages of the
    run) or, in rows written before schema version 4, a ``_agentstate.jsondelta`` patch.
    ``base_step`` 0 means a splice of the empty text: a whole state that references messages.
    ``load`` applies them.
    """

    node: str
    body: Mapping[str, Any]
    base_step: int | None = None


@dataclass(frozen=True)
class AgentStateRow:
    """An agent-state row ready to store, as the agent-state writer (``_agentstate``) makes it.

    ``text`` is the row's final ``body``: JSON text written verbatim (the store does not encode it
    again, nor know what it holds); ``base_step`` as in :class:`AgentStateRecord`.
    """

    node: str
    text: str
    base_step: int | None = None


class StepKind(str, Enum):
    """What a step records (stored as its value)."""

    CREATED = "created"
    """The run was created: every participant's starting state."""
    START = "start"
    """A round begins: its task messages (if any) and the first selection, or its stop."""
    INPUT = "input"
    """User input added to an unfinished round."""
    RESUME = "resume"
    """An interrupted round resumes: its in-flight nodes are dispatched again."""
    COMPLETE = "complete"
    """A node's answer, with the next selection (or the stop) when its batch is complete."""
    INTERRUPT = "interrupt"
    """The run ended without the manager recording it: interrupted, or failed."""
    RESET = "reset"
    """``reset()``: a fresh scheduler after the run's messages, every participant's state."""
    IMPORT = "import"
    """``load_state()``: a saved state's thread, agent states and scheduler."""
    WAIT = "wait"
    """The round parks: the nodes still in flight wait for human input (data: their request ids)."""
    ATTEMPT_FAILED = "attempt_failed"
    """An attempt of a node's turn raised or timed out (data: node, attempt, error type and message,
    elapsed seconds); the node runs again after its back-off, or the run fails."""


@dataclass(frozen=True)
class NodeFailure:
    """Why a run is ``failed`` with a node's budget spent: ``RunRecord.result["node_failed"]``.

    Attributes:
        node: the node.
        attempts: the attempts the budget allowed and used.
        error_type: the last error's class name (``ProcessDied`` for a crash loop).
        error: the last error's message.
        cause: ``"error"`` (it raised), ``"timeout"`` (a TimeoutPolicy limit) or ``"crash"`` (its
            process died).
    """

    node: str
    attempts: int
    error_type: str
    error: str
    cause: Literal["error", "timeout", "crash"] = "error"

    def to_json(self) -> dict[str, Any]:
        """The marker as stored in the run's result."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> NodeFailure | None:
        """The marker :meth:`to_json` wrote, or ``None`` when ``data`` is not one (a run's result
        from before markers, or of a run that did not fail on a spent budget)."""
        if not isinstance(data, Mapping):
            return None
        try:
            cause = data.get("cause", "error")
            return cls(
                node=str(data["node"]),
                attempts=int(data["attempts"]),
                error_type=str(data.get("error_type", "")),
                error=str(data.get("error", "")),
                cause=cause if cause in ("error", "timeout", "crash") else "error",
            )
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def of_result(cls, result: Any) -> NodeFailure | None:
        """The marker in a run's result (``RunRecord.result``), if it has one."""
        return cls.from_json(result.get("node_failed")) if isinstance(result, Mapping) else None

    @classmethod
    def of(cls, run: RunRecord) -> NodeFailure | None:
        """The marker of ``run`` when it is ``failed`` because a budget ran out, else ``None``."""
        result = run.result
        if run.status != "failed" or not isinstance(result, Mapping):
            return None
        return cls.of_result(result)

    @classmethod
    def crash(cls, node: str, deaths: int) -> NodeFailure:
        """``node``'s turn died with its process ``deaths`` times (``max_crash_attempts``)."""
        times = "once" if deaths == 1 else f"{deaths} times"
        return cls(
            node, deaths, "ProcessDied", f"the process died {times} during node {node}'s turn", "crash"
        )

    def exception(self, run_id: str, said: str | None = None) -> NodeFailedError:
        """The error ``run()`` raises for this failure (``said``: its message when the run failed,
        the stored stop reason, which says why no further attempt was made)."""
        message = said
        if message is None and self.cause == "crash":
            message = (
                f"run {run_id}: {self.error} (max_crash_attempts reached); it is not dispatched "
                f"again. Once the cause is fixed (memory, a crashing native tool...), retry it with "
                f"`graphflow-durable runs retry {run_id}` (or Store.retry_run({run_id!r}))"
            )
        return NodeFailedError(
            message,
            node=self.node,
            attempts=self.attempts,
            error_type=self.error_type,
            error=self.error,
            run_id=run_id,
        )


@dataclass(frozen=True)
class Step:
    """One transition to commit.

    Attributes:
        kind: what the step records (:class:`StepKind`).
        node: the node that completed, for :attr:`StepKind.COMPLETE`.
        scheduler: the scheduler state after the step (JSON, opaque to the store).
        data: anything else the flow needs to resume (JSON, opaque to the store).
    """

    kind: StepKind
    node: str | None
    scheduler: Mapping[str, Any]
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunUpdate:
    """Run-level fields a commit changes at the same time (``None`` = unchanged).

    ``release_lease``: the commit also gives up the run's lease, as the store driver's ``release_lease``
    would, in the same transaction (a driver's last commit: it saves the release's own).
    """

    status: RunStatus | None = None
    task: Any = None
    result: Any = None
    release_lease: bool = False


#: The key of a run's ``result`` that :meth:`Store.retry_run` sets on a run whose budget ran out:
#: the next resume gives its in-flight nodes a fresh budget (``Cursor.fresh_budget``) and clears it.
FRESH_BUDGET = "fresh_budget"


def turn_counts(cursor: Any) -> dict[str, dict[str, int]]:
    """Per in-flight node of a step's stored cursor (``Cursor.to_json``, read without the graph):
    its turn's ``attempts``, ``failures`` and ``crashes``; empty for anything else."""
    if not isinstance(cursor, Mapping) or not isinstance(cursor.get("attempts"), Mapping):
        return {}
    failures, crashes = cursor.get("failures") or {}, cursor.get("crashes") or {}
    return {
        str(n): {"attempts": int(a), "failures": int(failures.get(n, 0)), "crashes": int(crashes.get(n, 0))}
        for n, a in sorted(cursor["attempts"].items())
    }


def next_attempt_at(cursor: Any) -> float | None:
    """When the next attempt of a node backing off after a failed attempt may be dispatched, by a
    step's stored cursor (``Cursor.to_json``: its ``retry_at``; the earliest of several), or ``None``."""
    times = cursor.get("retry_at") if isinstance(cursor, Mapping) else None
    return min(float(t) for t in times.values()) if isinstance(times, Mapping) and times else None


@dataclass(frozen=True)
class SealedValue:
    """A run's task or result as a store without its key reads it: sealed with key ``key_id``, which
    the store was not opened with. Listings (``Store.get_run``, ``list_runs``, ``list_runs_page``)
    show it in place of the content, so runs can be listed without keys; nothing drives a run whose
    record holds one (attaching it raises ``StoreConfigError`` naming the key)."""

    key_id: str

    def __str__(self) -> str:
        return f"<sealed with key {self.key_id!r}>"

    def to_json(self) -> dict[str, str]:
        """Its JSON form in ``--json`` output and the console's API: ``{"sealed": key_id}``."""
        return {"sealed": self.key_id}


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
    lease_host: str | None = None
    lease_pid: int | None = None
    lease_process: str | None = None
    """The lease holder's process identity as stored (JSON: boot id, PID namespace, start time)."""
    cancel_requested_at: float | None = None
    """When a cancel was requested of the run's live driver and not yet honoured (epoch seconds).
    Kept on a run whose round ended (stopped, finished) before its driver could honour it:
    :attr:`ended_before_cancel`."""
    pending: Sequence[InputRequest] = ()
    """The run's pending requests for human input, oldest first, where the
    reader asked for them (``DurableGraphFlow.run_info()``); otherwise empty."""
    turns: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per node in flight at the head, its turn's ``attempts``, ``failures`` and ``crashes``, where
    the reader asked for them (``DurableGraphFlow.run_info()``); otherwise empty. A run that failed
    because a budget ran out names its node in ``result["node_failed"]`` (:class:`NodeFailure`)."""
    next_attempt_at: float | None = None
    """While a node backs off after a failed attempt (a retry policy), when its next attempt may be
    dispatched (epoch seconds, the driver's wall clock), where the reader asked for it
    (``DurableGraphFlow.run_info()``); otherwise ``None``."""

    @property
    def sealed_with(self) -> str | None:
        """The key id of a task or result the reading store could not open (a
        :class:`SealedValue`: it lacks that key), else ``None``."""
        for value in (self.task, self.result):
            if isinstance(value, SealedValue):
                return value.key_id
        return None

    @property
    def ended_before_cancel(self) -> bool:
        """Whether a cancel was requested and the round ended (stopped, finished) before it took
        effect: its driver had dispatched its last turn already, so nothing was stopped. The request
        stays on the run (``cancel_requested_at``) until the lease is taken for another round."""
        return self.cancel_requested_at is not None and self.status in ENDED_STATUSES


@dataclass(frozen=True)
class StepRecord:
    """A committed step, as read back (the scheduler state only for the head step, in RunLog)."""

    seq: int
    kind: StepKind
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
    agent_state_steps: Mapping[str, int] = field(default_factory=dict)


CallKind = Literal["model", "tool"]
"""What a recorded call called: a model client's ``create``/``create_stream``, or a workbench's tool."""

CallOutcome = Literal["live", "replayed"]
"""``live``: the call was made and its result recorded; ``replayed``: a recorded result was returned
instead of calling out (the row keeps the usage it saved, no result)."""

CALL_KINDS: tuple[CallKind, ...] = get_args(CallKind)
CALL_OUTCOMES: tuple[CallOutcome, ...] = get_args(CallOutcome)


@dataclass(frozen=True)
class CallRecord:
    """A model or tool call made inside a durable turn, as recorded (schema version 12).

    A call is identified within its turn by ``(kind, ident)``: ``ident`` is the model call's ordinal
    (``"0"``, ``"1"``...; counted from 0 on each attempt) or the tool call's ``call_id``. The store
    treats ``fingerprint`` and ``result`` as opaque text (the wrappers compute and decode them).

    Attributes:
        run_id: the run.
        turn_key: the turn's idempotency key (equal on every attempt of the turn).
        node: the node whose turn made the call.
        step: the step that dispatched the turn.
        attempt: the attempt of the turn that made (or replayed) the call.
        kind: ``"model"`` or ``"tool"``.
        name: the model's name or the tool's name.
        ident: the model call's ordinal, or the tool call's id.
        fingerprint: a digest of the request (what a replay must match).
        outcome: ``"live"`` or ``"replayed"``.
        result: the recorded result as JSON text (``None`` on a replayed row).
        prompt_tokens: the call's prompt tokens (a replayed row: the tokens it saved), if known.
        completion_tokens: the same for completion tokens.
        created_at: when the record was written (epoch seconds).
        seq: the record's place in the run's records, 1, 2, 3... in write order (set by the store).
        discarded: a later divergence of its turn voided it (kept for audit, never replayed).
    """

    run_id: str
    turn_key: str
    node: str
    step: int
    attempt: int
    kind: str
    name: str
    ident: str
    fingerprint: str
    outcome: str
    result: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    created_at: float
    seq: int = 0
    discarded: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The record as ``runs history --calls --json`` writes it: every field but ``result``
        (the recorded answer itself, possibly large), ``created_at`` as ``time``, and ``ident``
        also spelled out as what it is: ``ordinal`` (a model call's, an int) or ``call_id`` (a
        tool call's), the other ``None``."""
        row = asdict(self)
        del row["result"]
        row["time"] = row.pop("created_at")
        row["ordinal"] = int(self.ident) if self.kind == "model" else None
        row["call_id"] = self.ident if self.kind == "tool" else None
        return row


@dataclass(frozen=True)
class CallSummary:
    """A run's recorded calls in three numbers (``runs show``, ``runs stats``).

    Attributes:
        calls_live: calls made (rows with outcome ``live``, discarded ones included: they were paid).
        calls_replayed: calls answered from a record instead (outcome ``replayed``).
        tokens_saved: the prompt and completion tokens of the replayed calls, summed.
    """

    calls_live: int = 0
    calls_replayed: int = 0
    tokens_saved: int = 0

    def as_dict(self) -> dict[str, int]:
        """A JSON-ready dict with the three fields."""
        return asdict(self)
