"""Operations on runs from outside their driver: cancel, retry, an operator's answer for a failed
node (supply), delete, prune (retention), the store's statistics, and what ``runs show`` reads.

The store runs each function inside one of its transactions. Nothing here writes to a run that a
live driver holds (an unexpired lease whose holder is not provably dead), except a cancel
*request*: a column the driver reads when it renews its lease (:func:`~.lease.renew`), after which
the driver itself records the run ``cancelled``. A run nobody holds is changed directly, and its
fencing token is replaced by a new one, so a driver whose lease ran out can no longer commit to it.

Deleting a run removes its steps, messages, agent states, requests for human input and queue row,
and its nested runs: the runs whose ``parent_run_id`` is it (a nested durable team's run records
its outer run there, a fork its source), at any depth. A run that is ``running`` or held by a live
driver is refused (``delete``) or skipped (``prune``) unless forced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import sqlalchemy as sa

from graphflow_durable._model.codec import dumps, loads, surrogate_problem
from graphflow_durable._model.records import (
    ENDED_STATUSES,
    FRESH_BUDGET,
    RUN_STATUSES,
    CallSummary,
    MessageRecord,
    NodeFailure,
    Step,
    StepKind,
    next_attempt_at,
    turn_counts,
)
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.calls import summarise
from graphflow_durable._storage.driver import CommitRequest, encode_commit
from graphflow_durable._storage.lease import NOBODY, iso, locked, takeover_reason
from graphflow_durable._storage.reading import head_scheduler
from graphflow_durable._storage.schema import (
    agent_states,
    call_records,
    input_requests,
    messages,
    queue,
    runs,
    steps,
)
from graphflow_durable._storage.sealing import PLAIN, Sealer, keyless
from graphflow_durable.errors import ConflictError, RunStateError, UsageError

__all__ = [
    "TABLES",
    "Cancellation",
    "Progress",
    "Removal",
    "Retry",
    "StoreStats",
    "Supply",
    "cancel",
    "check_prune",
    "delete",
    "held",
    "progress",
    "prune",
    "retry",
    "run_state",
    "stats",
    "supply",
    "use_answer_rule",
]

_R = runs.c

_SELECT_RUN_STATE = S.SELECT_LEASE_NOW.add_columns(
    _R.status, _R.cancel_requested_at, _R.parent_run_id, _R.result
)


@dataclass(frozen=True)
class Cancellation:
    """What :meth:`Store.cancel_run` did.

    Attributes:
        run_id: the run.
        outcome: ``"requested"`` (a live driver holds the run: it stops before its next
            dispatch, as the commit before it or a lease renewal reads the request, and records
            the run ``cancelled``; a round whose last turn was dispatched already ends on its own,
            and keeps the request: ``RunRecord.ended_before_cancel``), ``"cancelled"`` (nobody held it: it is ``cancelled`` now), or
            ``"already cancelled"``.
        status: the run's status after the call.
        owner: the driver asked to stop (``"requested"``), else ``None``.
        lease_expires_at: that driver's lease expiry (epoch seconds, lease clock), else ``None``.
    """

    run_id: str
    outcome: Literal["requested", "cancelled", "already cancelled"]
    status: str
    owner: str | None = None
    lease_expires_at: float | None = None


@dataclass(frozen=True)
class Retry:
    """What :meth:`Store.retry_run` did.

    Attributes:
        run_id: the run.
        previous_status: its status before (``None``: a submission whose run was not created yet).
        status: its status now (a cancelled run becomes ``interrupted``, which workers claim).
        team: the team key it was submitted with: workers with that ``--team KEY`` claim it;
            ``None``: only a worker given a single team factory (any run) does.
        asked_again: the requests for human input whose deadline had passed with no default
            answer (the run failed on them): each has a new deadline, as long as its first, and its
            node asks it again when the run is resumed.
    """

    run_id: str
    previous_status: str | None
    status: str | None
    team: str | None
    asked_again: tuple[str, ...] = ()


def run_state(conn: sa.Connection, run_id: str, now: float, *, lock: bool = True) -> Any:
    """The run's status and lease (``lock``: locked for this transaction), or ``None``."""
    query = _SELECT_RUN_STATE
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update(of=runs)
    return conn.execute(query, {"p_run_id": run_id, "p_now": now}).first()


def held(row: Any) -> bool:
    """Whether a live driver holds the run's lease (unexpired, its process not provably gone)."""
    return row.lease_owner is not None and takeover_reason(row, NOBODY, float(row.db_now)) is None


def _free(conn: sa.Connection, row: Any, now: float, **values: Any) -> None:
    """Set ``values`` on a run nobody holds; clear its lease and give it a new fencing token (the
    store's next), so that a driver whose lease ran out can no longer commit to it."""
    changed = conn.execute(
        sa.update(runs)
        .where(_R.run_id == row.run_id, _R.fencing_token == row.fencing_token)
        .values(
            fencing_token=S.next_token(conn),
            **S.NO_HOLDER,
            cancel_requested_at=None,
            updated_at=now,
            **values,
        )
    ).rowcount
    if changed != 1:  # pragma: no cover - the row is locked (FOR UPDATE, SQLite's write lock)
        raise ConflictError(f"run {row.run_id} changed while it was being updated; retry", run_id=row.run_id)


def _ended(row: Any, what: str) -> RunStateError:
    """The error for an operation on a run whose last round ended (stopped, finished): ``what`` (its
    words after "ended") says why that leaves it nothing to do, and what to do instead."""
    return RunStateError(
        f"run {row.run_id} is {row.status}: its last round ended{what}",
        run_id=row.run_id,
        status=row.status,
    )


def cancel(conn: sa.Connection, run_id: str, now: float) -> Cancellation:
    """Cancel ``run_id``: ask its live driver to stop, or record it ``cancelled`` if nobody holds it.

    Raises RunNotFoundError, or RunStateError when its last round ended (stopped, finished).
    """
    row = run_state(conn, run_id, now)
    if row is None:
        raise S.not_found(run_id)
    if row.status == "cancelled":
        return Cancellation(run_id, "already cancelled", "cancelled")
    if row.status in ENDED_STATUSES:
        missed = row.cancel_requested_at
        raise _ended(
            row,
            (
                ""
                if missed is None
                else f" before the cancel requested at {iso(missed)} took effect (its last turn was "
                "already dispatched)"
            )
            + " and nothing runs, so there is nothing to cancel; delete it (graphflow-durable runs delete) "
            "if it is no longer wanted",
        )
    if held(row):
        conn.execute(
            sa.update(runs)
            .where(_R.run_id == run_id, _R.fencing_token == row.fencing_token)
            .values(cancel_requested_at=sa.func.coalesce(_R.cancel_requested_at, row.db_now))
        )
        return Cancellation(run_id, "requested", row.status, row.lease_owner, row.lease_expires_at)
    _free(conn, row, now, status="cancelled")
    return Cancellation(run_id, "cancelled", "cancelled")


def retry(conn: sa.Connection, run_id: str, now: float, sealer: Sealer = PLAIN) -> Retry:
    """Queue ``run_id`` again for the worker pool: a cancelled or failed run becomes ``interrupted``
    (the pool claims no failed run on its own); one whose budget ran out (the ``node_failed``
    marker) is marked for a fresh budget, which its next resume gives its nodes (``FRESH_BUDGET``);
    the retry back-off of its queue row (and of a failed submission) is cleared.

    Raises RunNotFoundError; RunLockedError when a live driver holds it; RunStateError when its
    last round ended (stopped, finished).
    """
    row = run_state(conn, run_id, now)
    submitted = conn.execute(sa.select(queue.c.team).where(queue.c.run_id == run_id)).first()
    if row is None and submitted is None:
        raise S.not_found(run_id)
    if row is not None:
        if row.status in ENDED_STATUSES:
            raise _ended(
                row, ", there is nothing to retry; give it a new task (run(task=...)) to start another round"
            )
        if held(row):
            raise locked(run_id, row)
        status = "interrupted" if row.status in ("cancelled", "failed") else row.status
        marker = _node_failed(row, sealer)
        fresh = {}
        if marker is not None:
            result = dumps({FRESH_BUDGET: True, "retried": marker})
            fresh = {"result": sealer.seal(result, "graphflow_runs", run_id, "run", "result")}
        _free(conn, row, now, status=status, **fresh)
    if submitted is not None:
        _due_now(conn, run_id, now)
    return Retry(
        run_id,
        None if row is None else row.status,
        None if row is None else status,
        None if submitted is None else submitted.team,
        () if row is None else _ask_again(conn, run_id, now),
    )


def _due_now(conn: sa.Connection, run_id: str, now: float) -> None:
    """Clear the retry back-off of the run's queue row (if it has one): any worker may claim it now."""
    conn.execute(sa.update(queue).where(queue.c.run_id == run_id).values(not_before=None, updated_at=now))


@dataclass(frozen=True)
class Supply:
    """What :meth:`Store.supply_output` recorded.

    Attributes:
        run_id: the run.
        node: the node whose answer was supplied (the node the run failed on).
        step: the number of the ``complete`` step that records it (its data: ``{"supplied": true}``).
        message_seq: the answer's position in the run's message log (``Store.transcript``'s ``seq``).
        status: the run's status now: ``interrupted`` (``run()`` with no task, or a pool worker,
            continues it).
        next: the nodes ready to run next (empty when the batch's other nodes are still to run, or
            the graph is complete; the resume decides the batch's end then).
    """

    run_id: str
    node: str
    step: int
    message_seq: int
    status: str
    next: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "next": list(self.next)}


#: The scheduler's rule for a supplied answer: (the run's graph description, the head's cursor JSON,
#: node, text) -> (the message's dump, the cursor after it, the nodes ready); ``ValueError`` when the
#: answer cannot be recorded. It needs AutoGen, which storage never imports: the package installs
#: ``_model.exported.supplied_answer`` (:func:`use_answer_rule`).
AnswerRule = Callable[
    [Mapping[str, Any], Mapping[str, Any], str, str],
    tuple[dict[str, Any], dict[str, Any], tuple[str, ...]],
]
_answer_rule: AnswerRule | None = None


def use_answer_rule(rule: AnswerRule) -> None:
    """Install the rule :func:`supply` records an answer by (the package does, in its ``__init__``)."""
    global _answer_rule
    _answer_rule = rule


def _refuse_text(run_id: str, node: Any, text: Any) -> None:
    """A :class:`UsageError` for arguments that are not text, and for an answer that is empty or
    holds a NUL; a lone surrogate in any of them (UTF-8 cannot hold it: a command-line argument
    that is not UTF-8 arrives as one) is refused too."""
    shown = run_id.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(run_id, str) else run_id
    for option, what, value in (
        ("run_id", "run id", run_id),
        ("node", "node", node),
        ("text", "answer", text),
    ):
        problem = None
        if not isinstance(value, str):
            problem = f"it is {type(value).__name__}, not text"
        elif option == "text" and not value.strip():
            problem = "it is empty; give the text the node should have answered"
        elif option == "text" and "\x00" in value:
            problem = f"it holds a NUL character (at index {value.index(chr(0))}); remove it"
        else:
            problem = surrogate_problem(value)
        if problem is not None:
            raise UsageError(
                f"run {shown}: the supplied {what} is refused: {problem}; nothing was changed",
                run_id=run_id if isinstance(run_id, str) else None,
                option=option,
            )


def supply(
    conn: sa.Connection, run_id: str, node: str, text: str, now: float, url: str, sealer: Sealer = PLAIN
) -> Supply:
    """Record ``text`` as the answer of ``node``, the node the failed run ``run_id`` failed on (its
    budget of retries or crashes spent: the ``node_failed`` marker), as that node's completion: one
    ``complete`` step marked ``supplied`` with a ``TextMessage`` from the node, the scheduler moved
    as a real answer moves it (the installed :data:`AnswerRule`), and the run ``interrupted``, its
    marker cleared, its lease free under a new fencing token (a driver that held the run before
    can no longer commit to it), its queue back-off cleared. Everything is checked before anything
    is written; one transaction.

    Raises UsageError (the text, the node), RunNotFoundError, RunStateError (the run is not failed,
    or failed without a marker), RunLockedError (a live driver holds it).
    """
    _refuse_text(run_id, node, text)
    row = run_state(conn, run_id, now)
    if row is None:
        raise S.not_found(run_id)
    if row.sealed and not sealer.on:
        raise keyless(run_id, url, "supplying an answer")
    failure = NodeFailure.from_json(_node_failed(row, sealer))
    if row.status != "failed" or failure is None:
        why = (
            f"it is {row.status}, not failed"
            if row.status != "failed"
            else "it failed, but not on a node whose retry or crash budget ran out (its result names no "
            "failed node): run() resumes it and the node runs again"
        )
        raise RunStateError(
            f"run {run_id}: an answer is supplied only for the node a failed run failed on, and {why}; "
            "nothing was changed",
            run_id=run_id,
            status=row.status,
        )
    if node != failure.node:
        raise UsageError(
            f"run {run_id} failed on node {failure.node}, not {node}: supply that node's answer "
            f"(graphflow-durable runs supply {run_id} {failure.node} TEXT); nothing was changed",
            run_id=run_id,
            option="node",
        )
    if held(row):
        raise locked(run_id, row)
    if _answer_rule is None:  # pragma: no cover - the package installs it on import
        raise RuntimeError("graphflow_durable was not imported: the answer rule is missing")
    graph = loads(conn.execute(sa.select(_R.graph).where(_R.run_id == run_id)).scalar_one())
    try:
        body, cursor, ready = _answer_rule(graph, head_scheduler(conn, run_id, url) or {}, node, text)
    except ValueError as exc:
        raise UsageError(
            f"run {run_id}: node {node}'s answer cannot be supplied: {exc}; retry the node instead "
            f"(graphflow-durable runs retry {run_id}); nothing was changed",
            run_id=run_id,
            option="node",
        ) from None
    head = int(row.head_seq) + 1
    seq = int(row.message_count)
    # Encoded as a driver's commit is (checksums, canonical JSON), written under this transaction's
    # lock; the run's row then moves as _free moves it: a new token fences off any earlier driver.
    params = encode_commit(
        CommitRequest(
            run_id,
            expected_head=int(row.head_seq),
            fencing_token=int(row.fencing_token),
            step=Step(StepKind.COMPLETE, node, cursor, {"supplied": True}),
            messages=[MessageRecord(seq, body, True)],
        ),
        now,
        sealer if sealer.on else None,
    )
    conn.execute(S.INSERT_STEP, params.step)
    conn.execute(S.INSERT_MESSAGE, params.messages)
    _free(conn, row, now, status="interrupted", result=None, head_seq=head, message_count=seq + 1)
    _due_now(conn, run_id, now)
    return Supply(run_id, node, head, seq, "interrupted", ready)


def _node_failed(row: Any, sealer: Sealer) -> Any:
    """The ``node_failed`` marker of a failed run's result (a budget ran out), or ``None``."""
    text = (
        sealer.open(row.result, "graphflow_runs", row.run_id, "run", "result")
        if row.status == "failed"
        else None
    )
    result = loads(text) if text is not None else None
    return result.get("node_failed") if isinstance(result, Mapping) else None


def _ask_again(conn: sa.Connection, run_id: str, now: float) -> tuple[str, ...]:
    """Give the run's pending requests whose deadline passed with no default answer a new deadline,
    as far from now as the first was from the request; return their ids. Without it the retried run
    would fail on them again at once."""
    r = input_requests.c
    overdue = sa.and_(r.run_id == run_id, r.status == "pending", r.deadline < now, r.default_answer.is_(None))
    ids = tuple(conn.execute(sa.select(r.request_id).where(overdue).order_by(r.request_id)).scalars())
    if ids:
        conn.execute(
            sa.update(input_requests).where(overdue).values(deadline=now + (r.deadline - r.created_at))
        )
    return ids


@dataclass(frozen=True)
class Progress:
    """Where a run is, for ``runs show``: its rounds and its head step.

    Attributes:
        rounds: how many rounds began (``start`` steps; a task given to a finished run begins one).
        head_kind: the kind of the head step (``None`` before the first step).
        head_node: the node whose answer the head step recorded, if it did.
        head_at: when the head step was committed (epoch seconds), or ``None``.
        turns: per node in flight at the head, its turn's ``attempts``, ``failures`` (raised or
            timed out) and ``crashes`` (died with their process).
        next_attempt_at: while a node backs off after a failed attempt, when its next attempt may
            be dispatched (epoch seconds), else ``None``.
    """

    rounds: int
    head_kind: str | None
    head_node: str | None
    head_at: float | None
    turns: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    next_attempt_at: float | None = None


def progress(conn: sa.Connection, run_id: str, head: int) -> Progress:
    """The run's rounds and head step."""
    rounds = conn.execute(
        sa.select(sa.func.count()).where(steps.c.run_id == run_id, steps.c.kind == "start")
    ).scalar_one()
    top = conn.execute(
        sa.select(steps.c.kind, steps.c.node, steps.c.created_at, steps.c.scheduler).where(
            steps.c.run_id == run_id, steps.c.seq == head
        )
    ).first()
    if top is None:
        return Progress(int(rounds), None, None, None)
    turns, due = _turns(top.scheduler)
    return Progress(int(rounds), str(top.kind), top.node, float(top.created_at), turns, due)


def _turns(text: Any) -> tuple[dict[str, dict[str, int]], float | None]:
    """The in-flight turns' counts of a head step's cursor, and its next attempt's time (a damaged
    one shows none: ``verify`` is where damage is reported)."""
    try:
        cursor = loads(text) if isinstance(text, str) else None
        return turn_counts(cursor), next_attempt_at(cursor)
    except (ValueError, TypeError, AttributeError):
        return {}, None


#: The package's tables, children first (the order rows are deleted in).
TABLES: tuple[sa.Table, ...] = (agent_states, messages, steps, input_requests, call_records, queue, runs)
#: Statuses whose runs are never picked by ``prune`` or ``delete`` without ``force``.
_ACTIVE = "running"
#: At most this many run ids per ``IN (...)`` list (SQLite's parameter limit is far above it).
_CHUNK = 500


@dataclass(frozen=True)
class Removal:
    """What :meth:`Store.delete_run` or :meth:`Store.prune` removed (or, with ``dry_run``, would).

    Attributes:
        run_ids: the runs removed, nested runs included, in the order found.
        rows: rows removed per table (every table of the store, 0 included).
        skipped: runs that matched but were left alone because they are running (``prune``
            without ``force``).
        dry_run: nothing was removed; the counts are what a real call would remove now.
    """

    run_ids: tuple[str, ...]
    rows: Mapping[str, int]
    skipped: tuple[str, ...] = ()
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "run_ids": list(self.run_ids),
            "rows": dict(self.rows),
            "skipped": list(self.skipped),
            "dry_run": self.dry_run,
        }


@dataclass(frozen=True)
class StoreStats:
    """What :meth:`Store.stats` counts.

    Attributes:
        runs: runs per status (every status, 0 included).
        submissions: submissions whose run was not created yet.
        rows: rows per table.
        bytes: bytes per table, its indexes included (SQLite: pages of the ``dbstat`` table;
            PostgreSQL: ``pg_total_relation_size``); ``None`` where the database cannot say
            (SQLite built without ``dbstat``).
        calls: the recorded model and tool calls of every run: made, replayed, tokens saved.
    """

    runs: Mapping[str, int]
    submissions: int
    rows: Mapping[str, int]
    bytes: Mapping[str, int | None]
    calls: CallSummary = field(default_factory=CallSummary)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the recorded calls' sums as ``calls_live``, ``calls_replayed``,
        ``tokens_saved``)."""
        return {
            "runs": dict(self.runs),
            "submissions": self.submissions,
            "rows": dict(self.rows),
            "bytes": dict(self.bytes),
            **self.calls.as_dict(),
        }


def _family(conn: sa.Connection, run_ids: Sequence[str]) -> list[str]:
    """``run_ids`` and every run nested in them, at any depth (the runs whose ``parent_run_id``
    leads to one of them): roots first, then each level in run id order. One recursive query;
    ``UNION`` ends it on a cycle of parents (which imported runs can make)."""
    pair = (_R.run_id, _R.parent_run_id)
    tree = sa.select(*pair).where(_R.run_id.in_(list(run_ids))).cte("tree", recursive=True)
    tree = tree.union(sa.select(*pair).join(tree, _R.parent_run_id == tree.c.run_id))
    children: dict[str | None, list[str]] = {}
    for run_id, parent in conn.execute(sa.select(tree.c.run_id, tree.c.parent_run_id)):
        children.setdefault(parent, []).append(run_id)
    seen = dict.fromkeys(run_ids)
    level = list(seen)
    while level:
        level = sorted({child for run_id in level for child in children.get(run_id, ()) if child not in seen})
        seen.update(dict.fromkeys(level))
    return list(seen)


def _active(conn: sa.Connection, run_ids: Sequence[str], now: float, lock: bool) -> list[str]:
    """Of ``run_ids``, those running or held by a live driver (``lock``: their rows locked until the
    transaction ends, so that none is taken while it deletes them)."""
    found = []
    for run_id in run_ids:
        row = run_state(conn, run_id, now, lock=lock)
        if row is not None and (row.status == _ACTIVE or held(row)):
            found.append(run_id)
    return found


def _remove(conn: sa.Connection, run_ids: Sequence[str], dry_run: bool) -> dict[str, int]:
    """Delete (or, ``dry_run``, count) every row of ``run_ids``; rows per table."""
    rows = {table.name: 0 for table in TABLES}
    for chunk in _chunks(run_ids):
        for table in TABLES:
            where = table.c.run_id.in_(chunk)
            if dry_run:
                rows[table.name] += int(conn.execute(sa.select(sa.func.count()).where(where)).scalar_one())
            else:
                rows[table.name] += int(conn.execute(sa.delete(table).where(where)).rowcount)
    return rows


def delete(conn: sa.Connection, run_id: str, now: float, *, force: bool, dry_run: bool) -> Removal:
    """Delete ``run_id`` (a run, or a submission whose run was not created yet) with its nested runs.

    Raises RunNotFoundError, or RunStateError when it (or a nested run) is running or held by a
    live driver and ``force`` is false.
    """
    exists = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first() is not None
    if not exists and conn.execute(sa.select(queue.c.run_id).where(queue.c.run_id == run_id)).first() is None:
        raise S.not_found(run_id)
    family = _family(conn, [run_id]) if exists else [run_id]
    if not force and (busy := _active(conn, family, now, not dry_run)):
        row = run_state(conn, busy[0], now, lock=False)
        holder = (
            f"held by {row.lease_owner} until {iso(row.lease_expires_at)}"
            if row.lease_owner is not None
            else "with no driver"
        )
        which = "it is" if busy[0] == run_id else f"its nested run {busy[0]} is"
        raise RunStateError(
            f"run {run_id} was not deleted: {which} {row.status} ({holder}); cancel it first "
            "(graphflow-durable runs cancel) and wait for it to stop, or pass force=True (--force) to "
            "delete it anyway (its driver then fails on its next write)",
            run_id=run_id,
            status=row.status,
        )
    return Removal(tuple(family), _remove(conn, family, dry_run), dry_run=dry_run)


def check_prune(statuses: Sequence[str], older_than: float, force: bool) -> None:
    """Refuse a prune that names an unknown status, a negative age, or running runs without ``force``."""
    if not statuses:
        raise UsageError("prune needs at least one status (e.g. finished)", option="status")
    for status in statuses:
        if status not in RUN_STATUSES:
            raise UsageError(
                f"prune: unknown status {status!r}; expected one of {', '.join(RUN_STATUSES)}",
                option="status",
            )
    if not math.isfinite(older_than) or older_than < 0:
        raise UsageError(
            f"prune: older_than must be 0 seconds or more, not {older_than}", option="older_than"
        )
    if _ACTIVE in statuses and not force:
        raise RunStateError(
            "prune: running runs are being driven (or were, by a driver that died); pass force=True "
            "(--force) to prune them anyway, or cancel them first",
            status=_ACTIVE,
        )


def prune(
    conn: sa.Connection, statuses: Sequence[str], older_than: float, now: float, *, force: bool, dry_run: bool
) -> Removal:
    """Delete (``dry_run``: count) the runs with one of ``statuses`` last updated more than
    ``older_than`` seconds before ``now``, with their nested runs; a run running or held by a live
    driver (or with such a nested run) is skipped unless ``force``."""
    check_prune(statuses, older_than, force)
    query = (
        sa.select(_R.run_id)
        .where(_R.status.in_(list(statuses)), _R.updated_at < now - older_than)
        .order_by(_R.updated_at, _R.run_id)
    )
    chosen: list[str] = []
    skipped: list[str] = []
    for run_id in conn.execute(query).scalars():
        if run_id in chosen:
            continue  # nested in a run chosen before
        family = _family(conn, [run_id])
        if not force and _active(conn, family, now, not dry_run):
            skipped.append(run_id)
            continue
        chosen.extend(r for r in family if r not in chosen)
    return Removal(tuple(chosen), _remove(conn, chosen, dry_run), tuple(skipped), dry_run)


def stats(conn: sa.Connection) -> StoreStats:
    """Runs per status, waiting submissions, rows and bytes per table."""
    per_status: dict[str, int] = dict.fromkeys(RUN_STATUSES, 0)
    for status, count in conn.execute(sa.select(_R.status, sa.func.count()).group_by(_R.status)):
        per_status[str(status)] = int(count)
    waiting = (
        sa.select(sa.func.count()).select_from(queue).where(~sa.exists().where(_R.run_id == queue.c.run_id))
    )
    rows = {t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()) for t in TABLES}
    return StoreStats(
        per_status, int(conn.execute(waiting).scalar_one()), rows, _bytes(conn), summarise(conn, None)
    )


_SQLITE_BYTES = sa.text(
    "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat AS d JOIN sqlite_master AS m ON m.name = d.name "
    "GROUP BY m.tbl_name"
)
_PG_BYTES = sa.text("SELECT pg_total_relation_size(to_regclass(:name))")


def _bytes(conn: sa.Connection) -> dict[str, int | None]:
    names = [t.name for t in TABLES]
    if conn.dialect.name == "postgresql":
        return {n: int(conn.execute(_PG_BYTES, {"name": n}).scalar_one() or 0) for n in names}
    try:
        with conn.begin_nested():
            found = {str(name): int(size) for name, size in conn.execute(_SQLITE_BYTES)}
    except sa.exc.OperationalError:  # SQLite built without the dbstat virtual table
        return dict.fromkeys(names, None)
    return {n: found.get(n, 0) for n in names}


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])
