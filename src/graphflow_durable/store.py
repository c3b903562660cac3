"""The run store: the only module that runs SQL. It knows nothing of AutoGen beyond JSON.

A run is an append-only log of *steps* (one per committed transition), each carrying the
messages it added to the thread, the scheduler state after it, and the agent states it saved.
Every public writing method is one transaction guarded by the run's expected head sequence
number and its lease fencing token: a stale writer gets :class:`ConflictError` (or
:class:`LeaseLostError`) and nothing is written.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _statements as S
from ._codec import dumps, loads
from ._engine import open_engines
from ._lease import lease_lost, locked, takeover_reason
from ._migrations import current_version, migrate
from ._schema import runs
from .errors import ConflictError, RunNotFoundError, StoreError

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

_log = logging.getLogger(__name__)


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
    lease_host: str | None = None
    lease_pid: int | None = None


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

    Opening a store creates or migrates the schema (see ``_migrations``); a database written by a
    newer graphflow-durable is refused with :class:`SchemaVersionError`. A store is safe to share
    between threads. Every method that writes runs one transaction; database and driver errors are
    raised as :class:`StoreError` with the cause chained.

    Leases: a run is driven by one worker at a time. :meth:`acquire_lease` returns a new *fencing
    token* on every successful acquisition (also when the same owner acquires again), so an older
    copy of a worker holding the previous token is fenced out; use :meth:`renew_lease` to extend a
    lease you hold. :meth:`commit` checks the token only: a worker whose lease expired may still
    commit as long as nobody has taken the run over.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path.db`` (embedded, the default backend),
            ``sqlite://`` (in memory, shared across threads), or ``postgresql://...``
            (psycopg 3; ``postgresql+psycopg://`` also accepted).
        synchronous: SQLite ``PRAGMA synchronous`` (``"FULL"`` default, or ``"NORMAL"``).
    """

    def __init__(self, url: str, *, synchronous: str = "FULL") -> None:
        self._e = open_engines(url, synchronous=synchronous)
        try:
            with self._guard("opening the store"):
                self._version = migrate(self._e.write, read=self._e.read, url=self._e.url)
        except BaseException:
            self._e.engine.dispose()
            raise

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self._e.url

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._e.dialect

    def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        self._e.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def schema_version(self) -> int:
        """The database's schema version (the number of the last migration applied)."""
        with self._guard("reading the schema version"), self._e.read.connect() as conn:
            return current_version(conn) or 0

    # -- runs -------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        graph_fingerprint: str,
        graph: Mapping[str, Any],
        owner: str,
        lease_seconds: float,
        parent_run_id: str | None = None,
        host: str | None = None,
        pid: int | None = None,
    ) -> RunRecord:
        """Create a run (status ``running``, head 0, no steps), leased to ``owner`` with token 1.

        ``host``/``pid`` identify the owner's process (default: this process); they let a worker on
        the same host take the run over at once if that process dies.

        Raises:
            ConflictError: a run with this id exists already.
            NotSerializableError: ``graph`` is not JSON.
        """
        graph_text = dumps(graph, where="graph")
        now = time.time()
        values = {
            "run_id": run_id,
            "graph_fingerprint": graph_fingerprint,
            "graph": graph_text,
            "status": "running",
            "head_seq": 0,
            "message_count": 0,
            "task": None,
            "result": None,
            "lease_owner": owner,
            "lease_host": socket.gethostname() if host is None else host,
            "lease_pid": os.getpid() if pid is None else pid,
            "lease_expires_at": now + lease_seconds,
            "fencing_token": 1,
            "parent_run_id": parent_run_id,
            "created_at": now,
            "updated_at": now,
        }
        exists = ConflictError(
            f"run {run_id} already exists in {self._e.url}; choose a new run_id to start a new run, "
            "or resume the existing one (acquire its lease and load it)"
        )
        with self._guard(f"creating run {run_id}"), self._e.write.begin() as conn:
            if conn.execute(_SELECT_LEASE, {"p_run_id": run_id}).first() is not None:
                raise exists
            try:
                with conn.begin_nested():
                    conn.execute(_INSERT_RUN, values)
            except sa.exc.IntegrityError as exc:  # a concurrent creator won the race
                raise exists from exc
        return _run_record(values)

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's row, or ``None`` when there is no such run."""
        with self._guard(f"reading run {run_id}"), self._e.read.begin() as conn:
            row = conn.execute(_SELECT_RUN, {"p_run_id": run_id}).mappings().first()
        return None if row is None else _run_record(row)

    def list_runs(self, status: str | Sequence[str] | None = None) -> list[RunRecord]:
        """Runs in creation order, optionally only those with the given status(es)."""
        query = sa.select(_RUNS).order_by(_RUNS.c.created_at, _RUNS.c.run_id)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            query = query.where(_RUNS.c.status.in_(wanted))
        with self._guard("listing runs"), self._e.read.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [_run_record(row) for row in rows]

    # -- the hot path ---------------------------------------------------------------------------

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
        """Append one step atomically; return the new head (``expected_head + 1``).

        One transaction: moves the run's head from ``expected_head`` (guarded by the fencing token),
        applies ``update``, and appends the step, its messages (whose ``seq`` must continue the
        thread without gaps) and the agent states. On any error nothing is written.

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: ``fencing_token`` is no longer the run's token (another worker took over).
            ConflictError: the run's head is not ``expected_head``, or the messages do not start at
                the run's message count / are not contiguous.
            NotSerializableError: a value is not JSON (raised before touching the database).
        """
        new_head = expected_head + 1
        now = time.time()
        params = _commit_params(run_id, new_head, now, step, messages, agent_states, update)
        head = {"p_run_id": run_id, "p_expected": expected_head, "p_token": fencing_token}
        head.update(params.run)
        with self._guard(f"committing step {new_head} of run {run_id}"), self._e.write.begin() as conn:
            if conn.execute(_UPDATE_HEAD_MSGS if messages else _UPDATE_HEAD, head).rowcount != 1:
                _diagnose_commit(conn, run_id, expected_head, fencing_token, messages)
            conn.execute(_INSERT_STEP, params.step)
            if params.messages:
                conn.execute(_INSERT_MESSAGE, params.messages)
            if params.states:
                conn.execute(_INSERT_STATE, params.states)
        return new_head

    def load(self, run_id: str) -> RunLog:
        """Everything needed to resume ``run_id``, read in one consistent transaction.

        Raises:
            RunNotFoundError: no such run.
        """
        with self._guard(f"loading run {run_id}"), self._e.read.begin() as conn:
            p = {"p_run_id": run_id}
            row = conn.execute(_SELECT_RUN, p).mappings().first()
            if row is None:
                raise _not_found(run_id)
            run = _run_record(row)
            steps = [
                StepRecord(seq=s.seq, kind=s.kind, node=s.node, data=loads(s.data), created_at=s.created_at)
                for s in conn.execute(_SELECT_STEPS, p)
            ]
            scheduler_text = conn.execute(_SELECT_SCHEDULER, {**p, "p_seq": run.head_seq}).scalar()
            thread = [
                StoredMessage(seq=m.seq, step_seq=m.step_seq, body=loads(m.body), published=bool(m.published))
                for m in conn.execute(_SELECT_MESSAGES, p)
            ]
            states = {a.node: loads(a.body) for a in conn.execute(_SELECT_LATEST_STATES, p)}
        return RunLog(
            run=run,
            steps=steps,
            messages=thread,
            scheduler=None if scheduler_text is None else loads(scheduler_text),
            agent_states=states,
        )

    # -- leases -------------------------------------------------------------------------------

    def acquire_lease(
        self,
        run_id: str,
        owner: str,
        *,
        lease_seconds: float,
        host: str | None = None,
        pid: int | None = None,
    ) -> int:
        """Take the run's lease for ``owner``; return the new fencing token (old token + 1).

        Allowed when the run has no owner, when ``owner`` already holds it, when the lease has
        expired, or when the holder is a process on this host that no longer exists. ``host`` and
        ``pid`` describe the new owner's process (default: this process).

        Raises:
            RunNotFoundError: no such run.
            RunLockedError: another live worker holds an unexpired lease.
        """
        with self._guard(f"acquiring the lease of run {run_id}"), self._e.write.begin() as conn:
            row = conn.execute(_SELECT_LEASE.with_for_update(), {"p_run_id": run_id}).first()
            if row is None:
                raise _not_found(run_id)
            now = time.time()
            reason = takeover_reason(row, owner, now)
            if reason is None:
                raise locked(run_id, row)
            token = int(row.fencing_token) + 1
            conn.execute(
                _UPDATE_LEASE,
                {
                    "p_run_id": run_id,
                    "p_old_token": row.fencing_token,
                    "p_token": token,
                    "p_owner": owner,
                    "p_host": socket.gethostname() if host is None else host,
                    "p_pid": os.getpid() if pid is None else pid,
                    "p_expires": now + lease_seconds,
                },
            )
        if reason != "free":
            _log.info(
                "run %s: %s took the lease from %s (%s); token %d",
                run_id,
                owner,
                row.lease_owner,
                reason,
                token,
            )
        return token

    def renew_lease(self, run_id: str, owner: str, fencing_token: int, *, lease_seconds: float) -> float:
        """Extend a lease this worker holds; return the new expiry (epoch seconds).

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: the run's token or owner is no longer ``fencing_token`` / ``owner``.
        """
        expires = time.time() + lease_seconds
        params = {"p_run_id": run_id, "p_owner": owner, "p_token": fencing_token, "p_expires": expires}
        with self._guard(f"renewing the lease of run {run_id}"), self._e.write.begin() as conn:
            if conn.execute(_RENEW_LEASE, params).rowcount != 1:
                row = conn.execute(_SELECT_LEASE, {"p_run_id": run_id}).first()
                if row is None:
                    raise _not_found(run_id)
                raise lease_lost(run_id, fencing_token, row, owner)
        return expires

    def release_lease(self, run_id: str, fencing_token: int) -> bool:
        """Give up the lease if ``fencing_token`` still holds it; return whether it did.

        Never raises because the lease was taken over (or the run is gone): there is nothing left
        to release then.
        """
        with self._guard(f"releasing the lease of run {run_id}"), self._e.write.begin() as conn:
            released = conn.execute(_RELEASE_LEASE, {"p_run_id": run_id, "p_token": fencing_token}).rowcount
        return bool(released)

    # -- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Serialise (in-memory SQLite only) and turn database errors into StoreError."""
        with self._e.serial:
            try:
                yield
            except sa.exc.SQLAlchemyError as exc:
                raise StoreError(f"{action} failed on {self._e.url}: {_describe(exc)}") from exc


_VALID_STATUS = frozenset(("running", "interrupted", "failed", "finished"))
_RUNS = runs
_SELECT_RUN = S.SELECT_RUN
_SELECT_LEASE = S.SELECT_LEASE
_SELECT_STEPS = S.SELECT_STEPS
_SELECT_SCHEDULER = S.SELECT_SCHEDULER
_SELECT_MESSAGES = S.SELECT_MESSAGES
_SELECT_LATEST_STATES = S.SELECT_LATEST_STATES
_INSERT_RUN = S.INSERT_RUN
_INSERT_STEP = S.INSERT_STEP
_INSERT_MESSAGE = S.INSERT_MESSAGE
_INSERT_STATE = S.INSERT_STATE
_UPDATE_HEAD = S.UPDATE_HEAD
_UPDATE_HEAD_MSGS = S.UPDATE_HEAD_MSGS
_UPDATE_LEASE = S.UPDATE_LEASE
_RENEW_LEASE = S.RENEW_LEASE
_RELEASE_LEASE = S.RELEASE_LEASE


@dataclass(frozen=True)
class _CommitParams:
    run: dict[str, Any]
    step: dict[str, Any]
    messages: list[dict[str, Any]]
    states: list[dict[str, Any]]


def _commit_params(
    run_id: str,
    new_head: int,
    now: float,
    step: Step,
    messages: Sequence[MessageRecord],
    agent_states: Sequence[AgentStateRecord],
    update: RunUpdate | None,
) -> _CommitParams:
    """Encode everything a commit writes (so NotSerializableError comes before any SQL)."""
    run: dict[str, Any] = {
        "p_new_head": new_head,
        "p_now": now,
        "p_status": None,
        "p_task": None,
        "p_result": None,
    }
    if update is not None:
        if update.status is not None and update.status not in _VALID_STATUS:
            raise StoreError(
                f"run {run_id}: status {update.status!r} is not one of {sorted(_VALID_STATUS)}; "
                "nothing was written"
            )
        run["p_status"] = update.status
        if update.task is not None:
            run["p_task"] = dumps(update.task, where="update/task")
        if update.result is not None:
            run["p_result"] = dumps(update.result, where="update/result")
    step_row = {
        "run_id": run_id,
        "seq": new_head,
        "kind": step.kind,
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
                raise ConflictError(
                    f"run {run_id}: message seqs of one commit must be contiguous; message {index} has "
                    f"seq {message.seq} but {first + index} was expected; nothing was written"
                )
            rows.append(
                {
                    "run_id": run_id,
                    "seq": message.seq,
                    "step_seq": new_head,
                    "published": message.published,
                    "body": dumps(message.body, where=f"messages/{message.seq}/body"),
                }
            )
        run["p_first_seq"] = first
        run["p_message_count"] = first + len(messages)
    states = []
    seen: set[str] = set()
    for state in agent_states:
        if state.node in seen:
            raise StoreError(
                f"run {run_id}: two agent states for node {state.node!r} in one commit; "
                "pass one state per node; nothing was written"
            )
        seen.add(state.node)
        body = dumps(state.body, where=f"agent_states/{state.node}")
        states.append({"run_id": run_id, "node": state.node, "step_seq": new_head, "body": body})
    return _CommitParams(run=run, step=step_row, messages=rows, states=states)


def _diagnose_commit(
    conn: Connection,
    run_id: str,
    expected_head: int,
    fencing_token: int,
    messages: Sequence[MessageRecord],
) -> NoReturn:
    """Explain why the guarded head update matched no row (the transaction then rolls back)."""
    row = conn.execute(_SELECT_LEASE, {"p_run_id": run_id}).first()
    if row is None:
        raise _not_found(run_id)
    if row.fencing_token != fencing_token:
        raise lease_lost(run_id, fencing_token, row)
    if row.head_seq != expected_head:
        raise ConflictError(
            f"run {run_id}: expected head {expected_head} but the store is at {row.head_seq}; "
            "another writer committed first; nothing was written; reload the run"
        )
    first = messages[0].seq if messages else None
    raise ConflictError(
        f"run {run_id}: the new messages start at seq {first} but the run has {row.message_count} "
        "messages; message seqs must continue the thread without gaps; nothing was written; reload the run"
    )


def _not_found(run_id: str) -> RunNotFoundError:
    return RunNotFoundError(f"run {run_id} does not exist; create it with Store.create_run() first")


def _run_record(row: Mapping[str, Any] | sa.RowMapping) -> RunRecord:
    task, result = row["task"], row["result"]
    return RunRecord(
        run_id=row["run_id"],
        graph_fingerprint=row["graph_fingerprint"],
        graph=loads(row["graph"]),
        status=row["status"],
        head_seq=row["head_seq"],
        message_count=row["message_count"],
        task=None if task is None else loads(task),
        result=None if result is None else loads(result),
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        fencing_token=row["fencing_token"],
        parent_run_id=row["parent_run_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        lease_host=row["lease_host"],
        lease_pid=row["lease_pid"],
    )


def _describe(exc: sa.exc.SQLAlchemyError) -> str:
    """A short description of a database error (the driver's message, not the SQL or values)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        return f"{type(exc.orig).__name__}: {str(exc.orig).strip()}"
    return f"{type(exc).__name__}: {exc}"
