"""Requests for human input (schema version 8): :class:`InputRequests`, held by a store as
``store.requests``: record, read, answer, cancel.

None of this is on the commit path: a request is written only when an input function is called,
read when one is called or a run is inspected, answered by a person.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from graphflow_durable._model.codec import dumps, loads, surrogate_problem
from graphflow_durable._model.human import InputRequest, parked_on
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.lease import fenced
from graphflow_durable._storage.schema import input_requests, runs
from graphflow_durable._storage.sealing import PLAIN, Sealer, keyless
from graphflow_durable.errors import ConflictError, NotWaitingError, StoreError, UsageError

_log = logging.getLogger("graphflow_durable.store")

__all__ = ["InputRequests"]

_I = input_requests.c
_TABLE = "graphflow_input_requests"

#: The texts a person or an agent gives (schema version 9: stored as JSON strings), in words.
_TEXTS = {"prompt": "prompt", "answer": "answer", "default_answer": "default answer", "run_id": "run id"}


def _stored(
    text: str | None, sealer: Sealer = PLAIN, run_id: str = "", request_id: str = "", column: str = ""
) -> str | None:
    """A request's text as stored: a JSON string, as the message log stores its bodies, so a NUL
    (which PostgreSQL's text cannot hold) is escaped, alike on both backends; sealed with a codec."""
    if text is None:
        return None
    return sealer.seal(dumps(text), _TABLE, run_id, request_id, column) if sealer.on else dumps(text)


def _text(stored: str | None, sealer: Sealer, row: Mapping[str, Any] | RowMapping, column: str) -> str | None:
    if stored is None:
        return None
    return str(loads(sealer.open(stored, _TABLE, row["run_id"], row["request_id"], column, node=row["node"])))


def _refuse_surrogates(run_id: str, texts: Mapping[str, str | None]) -> None:
    """A :class:`UsageError` for the first of ``texts`` with a lone surrogate (UTF-8 cannot hold it:
    neither backend can store it; a command-line argument that is not UTF-8 arrives as one)."""
    for option, text in texts.items():
        problem = surrogate_problem(text) if isinstance(text, str) else None
        if problem is not None:
            shown = run_id.encode("utf-8", "backslashreplace").decode("utf-8")
            what = _TEXTS.get(option, option.replace("_", " "))
            raise UsageError(
                f"run {shown}: the {what} is refused: {problem}; nothing was changed",
                run_id=run_id,
                option=option,
            )


def _request(row: Mapping[str, Any] | RowMapping, sealer: Sealer = PLAIN) -> InputRequest:
    return InputRequest(
        run_id=row["run_id"],
        request_id=row["request_id"],
        node=row["node"],
        prompt=str(_text(row["prompt"], sealer, row, "prompt")),
        idempotency_key=row["idempotency_key"],
        status=row["status"],
        answer=_text(row["answer"], sealer, row, "answer"),
        answered_by=row["answered_by"],
        created_at=row["created_at"],
        answered_at=row["answered_at"],
        deadline=row["deadline"],
        default=_text(row["default_answer"], sealer, row, "default_answer"),
    )


def _find(conn: Connection, run_id: str, request_id: str, sealer: Sealer) -> InputRequest | None:
    """The request, or ``None``."""
    row = (
        conn.execute(sa.select(input_requests).where(_I.run_id == run_id, _I.request_id == request_id))
        .mappings()
        .first()
    )
    return None if row is None else _request(row, sealer)


def _insert(conn: Connection, request: InputRequest, sealer: Sealer) -> InputRequest:
    """Insert a request row (``IntegrityError`` when its id exists)."""
    where = (sealer, request.run_id, request.request_id)
    values = {
        "run_id": request.run_id,
        "request_id": request.request_id,
        "node": request.node,
        "prompt": _stored(request.prompt, *where, "prompt"),
        "idempotency_key": request.idempotency_key,
        "status": request.status,
        "answer": _stored(request.answer, *where, "answer"),
        "answered_by": request.answered_by,
        "created_at": request.created_at,
        "answered_at": request.answered_at,
        "deadline": request.deadline,
        "default_answer": _stored(request.default, *where, "default_answer"),
    }
    conn.execute(sa.insert(input_requests).values(**values))
    return request


def _pending(conn: Connection, run_ids: Sequence[str], sealer: Sealer = PLAIN) -> list[InputRequest]:
    """The pending requests of the runs, oldest first."""
    query = (
        sa.select(input_requests)
        .where(_I.run_id.in_(list(run_ids)), _I.status == "pending")
        .order_by(_I.created_at, _I.request_id)
    )
    return [_request(row, sealer) for row in conn.execute(query).mappings()]


def _answer(
    conn: Connection,
    run_id: str,
    text: str,
    *,
    node: str | None,
    request_id: str | None,
    by: str,
    now: float,
    sealer: Sealer,
    url: str,
) -> tuple[InputRequest, str]:
    """Answer one pending request of ``run_id``; a ``waiting`` run (or one that failed for this
    request's deadline) becomes ``interrupted`` (to be resumed) once none of the requests it parked on is pending: while another person's request is,
    it still waits (a resume would only park again). Returns the answered request and the run's
    status after the answer.

    The run's row is locked first (PostgreSQL ``FOR UPDATE``; SQLite's write transaction is
    exclusive), and the request is updated only while it is pending: of two concurrent answers,
    exactly one changes it, the other gets :class:`NotWaitingError`. A person's answer (``by``
    ``respond``) to a cancelled run is refused: the run asks again once it is resumed.
    """
    row = conn.execute(
        sa.select(runs.c.status, runs.c.result, runs.c.sealed)
        .where(runs.c.run_id == run_id)
        .with_for_update()
    ).first()
    if row is None:
        raise S.not_found(run_id)
    if row.sealed and not sealer.on:
        raise keyless(run_id, url, "answering its input request")
    status = row.status
    open_ = _pending(conn, [run_id], sealer)
    ids = [r.request_id for r in open_]
    if status == "cancelled" and by == "respond":
        raise NotWaitingError(
            f"run {run_id} is cancelled: it waits for nobody until it is resumed (run() with no task, or "
            "'graphflow-durable runs retry' for a worker pool), and its node then asks again; answer "
            f"then; nothing was changed (open requests: {', '.join(ids) or 'none'})",
            run_id=run_id,
            pending=ids,
        )
    if request_id is not None:
        target = next((r for r in open_ if r.request_id == request_id), None)
        if target is None:
            found = _find(conn, run_id, request_id, sealer)
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
        .values(
            status="answered",
            answer=_stored(text, sealer, run_id, target.request_id, "answer"),
            answered_by=by,
            answered_at=now,
        )
    ).rowcount
    if changed != 1:  # pragma: no cover - the run's row lock serialises answers
        raise NotWaitingError(
            f"run {run_id}: request {target.request_id!r} was answered meanwhile; nothing was changed",
            run_id=run_id,
            request_id=target.request_id,
        )
    result = sealer.open(row.result, "graphflow_runs", run_id, "run", "result")
    parked = parked_on(None if result is None else loads(result))
    still = [i for i in ids if i != target.request_id and (parked is None or i in parked)]
    # A run that failed for this request's deadline (no default answer) gets what it failed for:
    # resumable again, as a waiting run is (the pool claims no failed run on its own).
    late = (
        status == "failed"
        and target.deadline is not None
        and target.deadline < now
        and target.default is None
    )
    if (status == "waiting" or late) and not still:
        status = "interrupted"
        conn.execute(sa.update(runs).where(runs.c.run_id == run_id).values(status=status, updated_at=now))
    return replace(target, status="answered", answer=text, answered_by=by, answered_at=now), str(status)


def _answered(conn: Connection, run_id: str, request_ids: Sequence[str]) -> list[str]:
    """Which of ``request_ids`` are answered."""
    query = sa.select(_I.request_id).where(
        _I.run_id == run_id, _I.request_id.in_(list(request_ids)), _I.status == "answered"
    )
    return sorted(str(i) for i in conn.execute(query).scalars())


def _wake_if_answered(
    conn: Connection, run_id: str, request_ids: Sequence[str], now: float, fencing_token: int | None
) -> bool:
    """A run that just parked on ``request_ids``: if all were answered before the park was committed,
    make the run ``interrupted`` again (to be resumed), unless its token is no longer
    ``fencing_token`` (the one that parked it; ``None``: any). Returns whether it did."""
    pending = sa.exists().where(
        _I.run_id == run_id, _I.request_id.in_(list(request_ids)), _I.status == "pending"
    )
    by_token = sa.true() if fencing_token is None else runs.c.fencing_token == fencing_token
    changed = conn.execute(
        sa.update(runs)
        .where(runs.c.run_id == run_id, runs.c.status == "waiting", ~pending, by_token)
        .values(status="interrupted", updated_at=now)
    ).rowcount
    return bool(changed)


def _cancel_pending(conn: Connection, run_id: str, now: float) -> int:
    """Cancel the run's pending requests (the run was reset); return how many."""
    return int(
        conn.execute(
            sa.update(input_requests)
            .where(_I.run_id == run_id, _I.status == "pending")
            .values(status="cancelled", answered_at=now)
        ).rowcount
    )


class InputRequests:
    """The requests for human input of a store's runs: ``store.requests``.

    Shares the store's engines (its connection pool and lifetime), as ``store.queue`` does; each
    method is one transaction, database errors raised as :class:`StoreError`. The flow records and
    reads requests through it; :meth:`Store.respond` and :meth:`Store.pending_requests` are the
    public faces of :meth:`answer` and :meth:`pending`.
    """

    def __init__(self, engines: Engines) -> None:
        self._e = engines

    def _guard(self, action: str, run_id: str) -> AbstractContextManager[None]:
        return guarded(self._e, f"{action} of run {run_id}", run_id=run_id)

    def pending(self, run_id: str) -> list[InputRequest]:
        """The run's pending requests, oldest first."""
        with self._guard("reading the input requests", run_id), self._e.read.begin() as conn:
            return _pending(conn, [run_id], self._e.sealer)

    def of_run(self, run_id: str) -> list[InputRequest]:
        """Every request of the run (pending, answered, cancelled), oldest first."""
        query = sa.select(input_requests).where(_I.run_id == run_id).order_by(_I.created_at, _I.request_id)
        with self._guard("reading the input requests", run_id), self._e.read.begin() as conn:
            return [_request(row, self._e.sealer) for row in conn.execute(query).mappings()]

    def get(self, run_id: str, request_id: str) -> InputRequest | None:
        """One request of the run (any status), or ``None``."""
        with self._guard("reading an input request", run_id), self._e.read.begin() as conn:
            return _find(conn, run_id, request_id, self._e.sealer)

    def open(self, run_id: str, request: InputRequest, *, fencing_token: int | None = None) -> InputRequest:
        """Record ``request`` unless one with its id exists; return the stored one (an input
        function's call; an ``answered`` request is recorded answered). With ``fencing_token`` (the
        driver's), :class:`LeaseLostError` and nothing written unless it is still the run's.

        Raises:
            UsageError: one of its texts holds a lone surrogate (nothing is recorded).
        """
        _refuse_surrogates(
            run_id,
            {
                "node": request.node,
                "request_id": request.request_id,
                "prompt": request.prompt,
                "answer": request.answer,
                "default_answer": request.default,
            },
        )
        request = replace(request, run_id=run_id)
        for _attempt in range(2):
            try:
                with self._guard("recording an input request", run_id), self._e.write.begin() as conn:
                    fenced(conn, run_id, fencing_token)
                    found = _find(conn, run_id, request.request_id, self._e.sealer)
                    return found if found is not None else _insert(conn, request, self._e.sealer)
            except StoreError as exc:
                if not isinstance(exc.__cause__, sa.exc.IntegrityError):
                    raise
                # recorded concurrently: read it
        raise ConflictError(
            f"recording request {request.request_id} of run {run_id} kept conflicting; retry", run_id=run_id
        )

    def answer(
        self,
        run_id: str,
        text: str,
        *,
        node: str | None = None,
        request_id: str | None = None,
        by: str,
        fencing_token: int | None = None,
    ) -> InputRequest:
        """:meth:`Store.respond`, recording who answered (``by``: ``respond``, ``inline``, ``default``).
        With ``fencing_token`` (a driver's answer), as :meth:`open`."""
        if not isinstance(text, str):
            raise UsageError(f"an answer is text, not {type(text).__name__}", run_id=run_id, option="answer")
        _refuse_surrogates(run_id, {"run_id": run_id, "answer": text, "node": node, "request_id": request_id})
        with self._guard("answering an input request", run_id), self._e.write.begin() as conn:
            fenced(conn, run_id, fencing_token)
            done, status = _answer(
                conn,
                run_id,
                text,
                node=node,
                request_id=request_id,
                by=by,
                now=time.time(),
                sealer=self._e.sealer,
                url=self._e.url,
            )
        _log.info("run %s: request %s answered (%s); the run is %s", run_id, done.request_id, by, status)
        return done

    def answered(self, run_id: str, request_ids: Sequence[str]) -> list[str]:
        """Which of the run's ``request_ids`` are answered (sorted)."""
        with self._guard("reading the input requests", run_id), self._e.read.begin() as conn:
            return _answered(conn, run_id, request_ids)

    def wake_if_answered(
        self, run_id: str, request_ids: Sequence[str], *, fencing_token: int | None = None
    ) -> bool:
        """After the run parked (``waiting``) on ``request_ids``: if all were answered before the park
        committed, make the run ``interrupted`` (resumable) again; return whether it did. With
        ``fencing_token`` (the driver that parked it), only while that is still the run's token."""
        with self._guard("checking the input requests", run_id), self._e.write.begin() as conn:
            return _wake_if_answered(conn, run_id, request_ids, time.time(), fencing_token)

    def cancel(self, run_id: str) -> int:
        """Cancel the run's pending requests (its ``reset()``); return how many."""
        with self._guard("cancelling the input requests", run_id), self._e.write.begin() as conn:
            return _cancel_pending(conn, run_id, time.time())
