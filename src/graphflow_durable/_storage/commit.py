"""What a commit writes, encoded before any SQL runs, and why a refused commit was refused.

Pure: no database access. Encoding first means a value that is not JSON fails with
:class:`NotSerializableError` before a transaction is even opened, so nothing is written.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphflow_durable._model.codec import dumps
from graphflow_durable._model.records import (
    RUN_STATUSES,
    AgentStateRow,
    MessageRecord,
    RunUpdate,
    Step,
    StepKind,
)
from graphflow_durable._storage.checksum import add_sums
from graphflow_durable._storage.lease import lease_lost, process_identity
from graphflow_durable._storage.statements import not_found
from graphflow_durable.errors import ConflictError, StoreError, UsageError

__all__ = [
    "VALID_STATUS",
    "CommitParams",
    "CreateParams",
    "encode_commit",
    "encode_creation",
    "run_exists",
    "refusal",
]

VALID_STATUS = frozenset(RUN_STATUSES)


@dataclass(frozen=True)
class CommitParams:
    """Bind parameters of one commit: the head update, the step row, message and state rows;
    whether it changes the run's lifecycle (status, task, result)."""

    run: dict[str, Any]
    step: dict[str, Any]
    messages: list[dict[str, Any]]
    states: list[dict[str, Any]]
    updates_run: bool


@dataclass(frozen=True)
class CreateParams:
    """Bind parameters of a new run: its row (without the lease's expiry, which the INSERT takes
    from the lease clock: ``p_now``, ``p_seconds``) and, for a run that starts at head 1, its first
    step with the agent states (``first``)."""

    run: dict[str, Any]
    first: CommitParams | None


def encode_creation(
    run_id: str,
    graph_fingerprint: str,
    graph: Mapping[str, Any],
    owner: str,
    lease_seconds: float,
    parent_run_id: str | None,
    host: str | None,
    pid: int | None,
    now: float,
    first_step: Step | None,
    agent_states: Sequence[AgentStateRow],
) -> CreateParams:
    """Encode a new run before any SQL: running, leased to ``owner`` (this process by default), at
    head 0, or at head 1 with ``first_step`` and the agent states. Its fencing token is drawn from
    the store's counter when its row is written (``items.GroupItems``)."""
    pid = os.getpid() if pid is None else pid
    run = {
        "run_id": run_id,
        "graph_fingerprint": graph_fingerprint,
        "graph": dumps(graph, where="graph"),
        "status": "running",
        "head_seq": 0,
        "message_count": 0,
        "task": None,
        "result": None,
        "lease_owner": owner,
        "lease_host": socket.gethostname() if host is None else host,
        "lease_pid": pid,
        "lease_process": process_identity(pid),
        "fencing_token": None,  # drawn in the transaction that writes the row
        "parent_run_id": parent_run_id,
        "created_at": now,
        "updated_at": now,
        "p_now": now,
        "p_seconds": lease_seconds,
    }
    first = None
    if first_step is not None:
        # Its rows are inserted with the run's row, unguarded: the token it names is never checked.
        first = encode_commit(run_id, 0, 0, now, first_step, (), agent_states, None)
        run["head_seq"] = 1
    return CreateParams(run, first)


def run_exists(run_id: str, url: str) -> ConflictError:
    """The refusal of a new run whose id is taken."""
    return ConflictError(
        f"run {run_id} already exists in {url}; choose a new run_id to start a new run, or resume the "
        "existing one (acquire its lease and load it)",
        run_id=run_id,
        url=url,
    )


def encode_commit(
    run_id: str,
    expected_head: int,
    fencing_token: int,
    now: float,
    step: Step,
    messages: Sequence[MessageRecord],
    agent_states: Sequence[AgentStateRow],
    update: RunUpdate | None,
) -> CommitParams:
    """Encode everything a commit writes; raise before any SQL if something is wrong with it.

    The agent-state rows come encoded (by ``_agentstate``): their text is written as it is. Every
    step, message and state row gets its checksum (``_storage.checksum``) here.
    """
    new_head = expected_head + 1
    run: dict[str, Any] = {
        "p_run_id": run_id,
        "p_expected": expected_head,
        "p_token": fencing_token,
        "p_new_head": new_head,
        "p_now": now,
        "p_status": None,
        "p_task": None,
        "p_result": None,
        "p_release": False,
    }
    if update is not None:
        if update.status is not None and update.status not in VALID_STATUS:
            raise UsageError(
                f"run {run_id}: status {update.status!r} is not one of {sorted(VALID_STATUS)}; "
                "nothing was written",
                run_id=run_id,
                option="status",
            )
        run["p_status"] = update.status
        run["p_release"] = update.release_lease
        if update.task is not None:
            run["p_task"] = dumps(update.task, where="update/task")
        if update.result is not None:
            run["p_result"] = dumps(update.result, where="update/result")
    step_row = {
        "run_id": run_id,
        "seq": new_head,
        "kind": _step_kind(run_id, step.kind),
        "node": step.node,
        "scheduler": dumps(step.scheduler, where="step/scheduler"),
        "data": dumps(step.data, where="step/data"),
        "created_at": now,
    }
    rows = []
    if messages:
        first = messages[0].seq
        for index, message in enumerate(messages):
            if message.seq != first + index:
                raise UsageError(
                    f"run {run_id}: message seqs of one commit must be contiguous; message {index} has "
                    f"seq {message.seq} but {first + index} was expected; nothing was written",
                    run_id=run_id,
                    option="messages",
                )
            source = message.body.get("source") if isinstance(message.body, Mapping) else None
            node = source if isinstance(source, str) else step.node
            body = dumps(message.body, where=f"messages/{message.seq}/body", node=node)
            rows.append(
                {
                    "run_id": run_id,
                    "seq": message.seq,
                    "step_seq": new_head,
                    "published": bool(message.published),
                    "body": body,
                }
            )
        run["p_first_seq"] = first
        run["p_message_count"] = first + len(messages)
    states = []
    seen: set[str] = set()
    for state in agent_states:
        if state.node in seen:
            raise UsageError(
                f"run {run_id}: two agent states for node {state.node!r} in one commit; "
                "pass one state per node; nothing was written",
                run_id=run_id,
                option="agent_states",
            )
        seen.add(state.node)
        states.append(
            {
                "run_id": run_id,
                "node": state.node,
                "step_seq": new_head,
                "body": state.text,
                "base_step": state.base_step,
            }
        )
    add_sums(run_id, step_row, rows, states)
    return CommitParams(run=run, step=step_row, messages=rows, states=states, updates_run=update is not None)


def refusal(
    run_id: str,
    row: Any,
    expected_head: int,
    fencing_token: int,
    first_seq: int | None,
) -> StoreError | UsageError:
    """Why the guarded head update matched no row, given the run's lease row (``None``: no run)."""
    if row is None:
        return not_found(run_id)
    if row.fencing_token != fencing_token:
        return lease_lost(run_id, fencing_token, row)
    if row.head_seq != expected_head:
        return ConflictError(
            f"run {run_id}: expected head {expected_head} but the store is at {row.head_seq}; "
            "another writer committed first; nothing was written; reload the run",
            run_id=run_id,
            expected_head=expected_head,
            actual_head=row.head_seq,
        )
    # The head was the expected one, so no other writer intervened: the caller numbered its
    # messages wrongly.
    return UsageError(
        f"run {run_id}: the new messages start at seq {first_seq} but the run has {row.message_count} "
        "messages; message seqs must continue the thread without gaps; nothing was written; reload the run",
        run_id=run_id,
        option="messages",
    )


def _step_kind(run_id: str, kind: str) -> str:
    """The stored text of a step kind; an unknown kind is the caller's mistake."""
    try:
        return StepKind(kind).value
    except ValueError:
        raise UsageError(
            f"run {run_id}: step kind {kind!r} is not one of {[k.value for k in StepKind]}; nothing was written",
            run_id=run_id,
            option="kind",
        ) from None
