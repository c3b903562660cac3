"""What the command line's ``--json`` and the console's API show of runs: one builder each, shared
by ``graphflow-durable runs list|show|transcript`` and ``graphflow_durable.ui``.

``runs list`` judges each lease by the store's lease clock (the database server's on PostgreSQL)
and, for a holder on this host, by whether its process still lives (the rule early takeover uses,
:func:`~graphflow_durable._storage.lease.owner_gone`): a run whose driver died shows as such, not as ``running`` with a future lease.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from graphflow_durable._model.records import CallSummary, NodeFailure, SealedValue
from graphflow_durable._storage.lease import EXPIRED, GONE, HELD, iso, lease_state
from graphflow_durable.store import (
    DEFAULT_QUEUE,
    ENDED_STATUSES,
    InputRequest,
    Progress,
    RunRecord,
    Store,
    StoredMessage,
    Submission,
)

__all__ = [
    "EXPIRED",
    "GONE",
    "HELD",
    "SUBMITTED",
    "RunShow",
    "lease_state",
    "list_row",
    "list_rows",
    "message_json",
    "run_show",
    "submitted_show",
    "waiting_for",
    "sealed_content",
]

#: ``runs list --status`` value for submissions whose run does not exist yet.
SUBMITTED = "submitted"


def list_row(
    run: RunRecord, sub: Submission | None, pending: list[InputRequest], now: float
) -> dict[str, Any]:
    """One run as ``runs list --json`` prints it (``pending``: its pending requests if waiting)."""
    return {
        "run_id": run.run_id,
        "status": run.status,
        "team": None if sub is None else sub.team,
        "head": run.head_seq,
        "messages": run.message_count,
        "lease_owner": run.lease_owner,
        "lease_expires_at": run.lease_expires_at,
        "lease_state": lease_state(run, now),
        "lease_host": run.lease_host,
        "lease_pid": run.lease_pid,
        "attempts": 0 if sub is None else sub.attempts,
        **_placement(sub),
        # an error a later success superseded is not the run's now
        "last_error": None if sub is None or run.status in ENDED_STATUSES else sub.last_error,
        "pending": [r.to_json() for r in pending] if run.status == "waiting" else [],
        "content": sealed_content(run),
    }


def sealed_content(run: RunRecord) -> dict[str, str] | None:
    """``{"sealed": key id}`` when the store reading ``run`` lacks the key of its task or result
    (a :class:`SealedValue`), else ``None``: the ``content`` field of ``--json`` and the console's API."""
    return None if run.sealed_with is None else SealedValue(run.sealed_with).to_json()


def _placement(sub: Submission | None) -> dict[str, Any]:
    """Where a run waits its turn in the pool: its queue, priority and partition (a run never
    submitted is in the default queue)."""
    if sub is None:
        return {"queue": DEFAULT_QUEUE, "priority": 0, "partition": None}
    return {"queue": sub.queue, "priority": sub.priority, "partition": sub.partition}


def list_rows(
    store: Store, wanted: Collection[str], queues: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """The rows ``runs list`` shows (``--json``: one object each), runs then waiting submissions;
    ``queues``: only those of these named queues (a run never submitted is in ``default``)."""
    now = store.lease_clock()
    teams = {s.run_id: s for s in store.queue.list_submissions()}
    rows: list[dict[str, Any]] = []
    real = [s for s in wanted if s != SUBMITTED]
    for run in store.list_runs(real) if real else []:
        sub = teams.get(run.run_id)
        if queues is not None and _placement(sub)["queue"] not in queues:
            continue
        waits = run.status == "waiting" and run.sealed_with is None  # what it asks is content
        asked = store.pending_requests(run.run_id) if waits else []
        rows.append(list_row(run, sub, asked, now))
    if SUBMITTED in wanted:
        for sub in store.queue.list_submissions(waiting=True):
            if queues is not None and sub.queue not in queues:
                continue
            expires = sub.claim_expires_at
            state = None if sub.claimed_by is None else EXPIRED if expires is None or expires < now else HELD
            rows.append(
                {
                    "run_id": sub.run_id,
                    "status": SUBMITTED,
                    "team": sub.team,
                    "head": None,
                    "messages": 0,
                    "lease_owner": sub.claimed_by,
                    "lease_expires_at": expires,
                    "lease_state": state,
                    "lease_host": None,
                    "lease_pid": None,
                    "attempts": sub.attempts,
                    **_placement(sub),
                    "last_error": sub.last_error,
                    "pending": [],
                    "content": None,
                }
            )
    return rows


@dataclass(frozen=True)
class RunShow:
    """What ``runs show`` reads of a run: ``fields`` is its ``--json`` object; the rest are what
    its words are made of."""

    run: RunRecord
    fields: dict[str, Any]
    progress: Progress
    failure: NodeFailure | None
    calls: CallSummary
    requests: list[InputRequest]


def run_show(store: Store, run: RunRecord) -> RunShow:
    """``runs show RUN`` of a run that exists (``--json``: ``.fields``)."""
    at = store.progress(run.run_id)
    sub = store.queue.get_submission(run.run_id)
    now = store.lease_clock()
    shown: dict[str, Any] = {
        "run_id": run.run_id,
        "status": run.status,
        "round": at.rounds,
        "head": run.head_seq,
        "head_step": {"kind": at.head_kind, "node": at.head_node, "at": at.head_at},
        "messages": run.message_count,
        "lease_owner": run.lease_owner,
        "lease_host": run.lease_host,
        "lease_pid": run.lease_pid,
        "lease_expires_at": run.lease_expires_at,
        "lease_state": lease_state(run, now),
        "cancel_requested_at": run.cancel_requested_at,
        "ended_before_cancel": run.ended_before_cancel,
        "team": None if sub is None else sub.team,
        "attempts": 0 if sub is None else sub.attempts,
        **_placement(sub),
        "not_starting": store.queue.why_not_started(run.run_id),
        # an error a later success superseded (a deadline, a failed attempt) is not the run's now
        "last_error": None if sub is None or run.status in ENDED_STATUSES else sub.last_error,
        "parent_run_id": run.parent_run_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "content": sealed_content(run),
    }
    failure = NodeFailure.of(run)
    shown["in_flight"] = {node: dict(counts) for node, counts in at.turns.items()}
    shown["next_attempt_at"] = at.next_attempt_at
    shown["node_failed"] = None if failure is None else failure.to_json()
    if failure is not None and shown["last_error"] is None:
        shown["last_error"] = f"{failure.error_type}: {failure.error}"
    calls = store.calls.summary(run.run_id)
    shown.update(calls.as_dict())
    # what a waiting run waits for (or a cancelled one asked); content, unread without the run's keys
    asked = store.pending_requests(run.run_id) if run.sealed_with is None else []
    shown["pending"] = [request.to_json() for request in asked]
    return RunShow(run, shown, at, failure, calls, asked)


def submitted_show(store: Store, sub: Submission, now: float) -> dict[str, Any]:
    """``runs show RUN --json`` of a submission whose run was not created yet."""
    shown: dict[str, Any] = {"run_id": sub.run_id, "status": SUBMITTED, "team": sub.team}
    shown |= {"attempts": sub.attempts, "last_error": sub.last_error}
    shown |= _placement(sub)
    shown["not_before"] = sub.not_before
    shown["not_starting"] = store.queue.why_not_started(sub.run_id)
    shown["waiting_for"] = waiting_for(sub, now)
    return shown


def waiting_for(sub: Submission, now: float) -> str:
    """Who a submission not started yet waits for: a worker of its team (only a worker started with
    that key, or with one factory for every run, claims it), or the worker whose claim is live."""
    if sub.claimed_by is not None and sub.claim_expires_at is not None and sub.claim_expires_at >= now:
        return f"worker {sub.claimed_by}, which claimed it (until {iso(sub.claim_expires_at)})"
    if sub.team is None:
        return "a worker started with --team module:factory (a submission with no team key)"
    return (
        f"a worker serving team {sub.team} (started with --team {sub.team}=module:factory); none "
        "holds a claim on it"
    )


def message_json(m: StoredMessage) -> dict[str, Any]:
    """A message as ``runs transcript --json`` and ``runs follow --json`` print it."""
    return {"seq": m.seq, "step": m.step_seq, "published": m.published, "message": m.body}
