"""The SQL of requests for human input (schema version 7): record, read, answer, cancel.

Each function runs inside a transaction the store opened (``Store.respond`` and friends). None of
this is on the commit path: a request is written only when an input function is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from graphflow_durable._model.human import InputRequest
from graphflow_durable._storage.commit import not_found
from graphflow_durable._storage.schema import input_requests, runs
from graphflow_durable.errors import NotWaitingError

__all__ = ["answer", "cancel_pending", "find", "insert", "pending", "wake_if_answered"]

_I = input_requests.c


def _request(row: Mapping[str, Any] | RowMapping) -> InputRequest:
    return InputRequest(
        run_id=row["run_id"],
        request_id=row["request_id"],
        node=row["node"],
        prompt=row["prompt"],
        idempotency_key=row["idempotency_key"],
        status=row["status"],
        answer=row["answer"],
        answered_by=row["answered_by"],
        created_at=row["created_at"],
        answered_at=row["answered_at"],
        deadline=row["deadline"],
        default=row["default_answer"],
    )


def find(conn: Connection, run_id: str, request_id: str) -> InputRequest | None:
    """The request, or ``None``."""
    row = (
        conn.execute(sa.select(input_requests).where(_I.run_id == run_id, _I.request_id == request_id))
        .mappings()
        .first()
    )
    return None if row is None else _request(row)


def insert(conn: Connection, values: Mapping[str, Any]) -> InputRequest:
    """Insert a request row (``IntegrityError`` when its id exists)."""
    conn.execute(sa.insert(input_requests).values(**values))
    return _request(values)


def pending(conn: Connection, run_ids: Sequence[str]) -> list[InputRequest]:
    """The pending requests of the runs, oldest first."""
    query = (
        sa.select(input_requests)
        .where(_I.run_id.in_(list(run_ids)), _I.status == "pending")
        .order_by(_I.created_at, _I.request_id)
    )
    return [_request(row) for row in conn.execute(query).mappings()]


def answer(
    conn: Connection,
    run_id: str,
    text: str,
    *,
    node: str | None,
    request_id: str | None,
    by: str,
    now: float,
) -> tuple[InputRequest, str]:
    """Answer one pending request of ``run_id``; a ``waiting`` run becomes ``interrupted`` (to be
    resumed). Returns the answered request and the run's status after the answer.

    The run's row is locked first (PostgreSQL ``FOR UPDATE``; SQLite's write transaction is
    exclusive), and the request is updated only while it is pending: of two concurrent answers,
    exactly one changes it, the other gets :class:`NotWaitingError`.
    """
    status = conn.execute(sa.select(runs.c.status).where(runs.c.run_id == run_id).with_for_update()).scalar()
    if status is None:
        raise not_found(run_id)
    open_ = pending(conn, [run_id])
    ids = [r.request_id for r in open_]
    if request_id is not None:
        target = next((r for r in open_ if r.request_id == request_id), None)
        if target is None:
            found = find(conn, run_id, request_id)
            what = "has no such request" if found is None else f"has request {request_id!r} {found.status}"
            raise NotWaitingError(
                f"run {run_id} {what}; nothing was changed; pending: {', '.join(ids) or 'none'}",
                run_id=run_id,
                request_id=request_id,
                pending=ids,
            )
    else:
        candidates = [r for r in open_ if node is None or r.node == node]
        if not candidates:
            whose = "" if node is None else f" from node {node!r}"
            raise NotWaitingError(
                f"run {run_id} is not waiting for input{whose} (status {status}; pending requests: "
                f"{', '.join(ids) or 'none'}); nothing was changed",
                run_id=run_id,
                pending=ids,
            )
        if len(candidates) > 1 and node is None:
            raise NotWaitingError(
                f"run {run_id} waits on {len(candidates)} requests ({', '.join(ids)}); name the one "
                "this answers (node or request id); nothing was changed",
                run_id=run_id,
                pending=ids,
            )
        target = candidates[0]
    changed = conn.execute(
        sa.update(input_requests)
        .where(_I.run_id == run_id, _I.request_id == target.request_id, _I.status == "pending")
        .values(status="answered", answer=text, answered_by=by, answered_at=now)
    ).rowcount
    if changed != 1:  # pragma: no cover - the run's row lock serialises answers
        raise NotWaitingError(
            f"run {run_id}: request {target.request_id!r} was answered meanwhile; nothing was changed",
            run_id=run_id,
            request_id=target.request_id,
        )
    if status == "waiting":
        status = "interrupted"
        conn.execute(sa.update(runs).where(runs.c.run_id == run_id).values(status=status, updated_at=now))
    return replace(target, status="answered", answer=text, answered_by=by, answered_at=now), str(status)


def wake_if_answered(conn: Connection, run_id: str, request_ids: Sequence[str], now: float) -> bool:
    """A run that just parked on ``request_ids``: if one was answered before the park was committed,
    make the run ``interrupted`` again (to be resumed). Returns whether it did."""
    answered = sa.exists().where(
        _I.run_id == run_id, _I.request_id.in_(list(request_ids)), _I.status == "answered"
    )
    changed = conn.execute(
        sa.update(runs)
        .where(runs.c.run_id == run_id, runs.c.status == "waiting", answered)
        .values(status="interrupted", updated_at=now)
    ).rowcount
    return bool(changed)


def cancel_pending(conn: Connection, run_id: str, now: float) -> int:
    """Cancel the run's pending requests (the run was reset); return how many."""
    return int(
        conn.execute(
            sa.update(input_requests)
            .where(_I.run_id == run_id, _I.status == "pending")
            .values(status="cancelled", answered_at=now)
        ).rowcount
    )
