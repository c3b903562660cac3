"""The runtime's way into the store: one private driver object the store holds (``store._driver``).

:class:`Driver` is what a run's driver calls, not the operator API: new runs and commits (one
typed request each, :class:`CreateRequest` and :class:`CommitRequest`, blocking or handed to the
store's writer for a coroutine, several :meth:`~Driver.together`), the lease (acquire, renew,
heartbeat, release) and the head's scheduler state. A request is encoded here before any SQL runs:
a value that is not JSON fails with :class:`NotSerializableError` before a transaction is even
opened, so nothing is written. The commit writer (``writer.py``) writes what this encodes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass
from typing import Any

import sqlalchemy as sa

from graphflow_durable._agentstate.encoder import state_row
from graphflow_durable._model.codec import dumps
from graphflow_durable._model.records import (
    RUN_STATUSES,
    AgentStateRecord,
    AgentStateRow,
    MessageRecord,
    RunRecord,
    RunUpdate,
    Step,
    StepKind,
)
from graphflow_durable._storage import deaths, schema
from graphflow_durable._storage.checksum import add_sums
from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.lease import (
    Heartbeat,
    acquire,
    check_lease_seconds,
    process_identity,
    release,
    renew,
)
from graphflow_durable._storage.reading import head_scheduler
from graphflow_durable._storage.sealing import Sealer, seal_commit
from graphflow_durable._storage.writer import CommitParams, CommitWriter, CreateParams
from graphflow_durable.errors import UsageError

__all__ = ["VALID_STATUS", "CommitRequest", "CreateRequest", "Driver", "encode_commit", "encode_creation"]

VALID_STATUS = frozenset(RUN_STATUSES)

_log = logging.getLogger("graphflow_durable.store")

#: An agent state as a commit takes it: a record (its body a JSON value, encoded here) or a row made
#: by the flow's agent-state writer (its body already JSON text, written as it is).
AgentState = AgentStateRecord | AgentStateRow


@dataclass(frozen=True)
class CommitRequest:
    """One step appended atomically to ``run_id``: the head moves from ``expected_head`` (guarded by
    ``fencing_token``), ``update`` is applied, and the step, its ``messages`` (whose ``seq`` must
    continue the thread without gaps) and ``agent_states`` are written."""

    run_id: str
    _: KW_ONLY
    expected_head: int
    fencing_token: int
    step: Step
    messages: Sequence[MessageRecord] = ()
    agent_states: Sequence[AgentState] = ()
    update: RunUpdate | None = None


@dataclass(frozen=True)
class CreateRequest:
    """A new run ``run_id`` (status ``running``), leased to ``owner`` for ``lease_seconds``: at head
    0, or at head 1 with ``first_step`` and ``agent_states``. ``host``/``pid`` identify the owner's
    process (default: this process). ``parent_run_id``: the outer run of a nested team's run.
    ``trace_context``: the run's OpenTelemetry trace context (JSON, see ``schema.runs``), if any."""

    run_id: str
    _: KW_ONLY
    graph_fingerprint: str
    graph: Mapping[str, Any]
    owner: str
    lease_seconds: float
    parent_run_id: str | None = None
    host: str | None = None
    pid: int | None = None
    first_step: Step | None = None
    agent_states: Sequence[AgentState] = ()
    trace_context: str | None = None


def _state_rows(agent_states: Sequence[AgentState]) -> list[AgentStateRow]:
    """Agent states as rows: a record's body encoded to JSON, a row as it is."""
    return [state if isinstance(state, AgentStateRow) else state_row(state) for state in agent_states]


def encode_creation(request: CreateRequest, now: float, sealer: Sealer | None = None) -> CreateParams:
    """Encode a new run before any SQL: running, leased to its owner (this process by default), at
    head 0, or at head 1 with its first step and agent states. Its fencing token is drawn from the
    store's counter when its row is written (``writer.GroupItems``)."""
    check_lease_seconds(request.lease_seconds)
    pid = os.getpid() if request.pid is None else request.pid
    run_id = request.run_id
    run = {
        "run_id": run_id,
        "graph_fingerprint": request.graph_fingerprint,
        "graph": dumps(request.graph, where="graph"),
        "status": "running",
        "head_seq": 0,
        "message_count": 0,
        "task": None,
        "result": None,
        "lease_owner": request.owner,
        "lease_host": socket.gethostname() if request.host is None else request.host,
        "lease_pid": pid,
        "lease_process": process_identity(pid),
        "fencing_token": None,  # drawn in the transaction that writes the row
        "parent_run_id": request.parent_run_id,  # the outer run of a nested team's run (or None)
        "created_at": now,
        "updated_at": now,
        "trace_context": request.trace_context,
        "sealed": None if sealer is None else True,
        "p_now": now,
        "p_seconds": request.lease_seconds,
    }
    first = None
    if request.first_step is not None:
        # Its rows are inserted with the run's row, unguarded: the token it names is never checked.
        step = CommitRequest(
            run_id,
            expected_head=0,
            fencing_token=0,
            step=request.first_step,
            agent_states=request.agent_states,
        )
        first = encode_commit(step, now, sealer)
        run["head_seq"] = 1
    return CreateParams(run, first)


def encode_commit(request: CommitRequest, now: float, sealer: Sealer | None = None) -> CommitParams:
    """Encode everything a commit writes; raise before any SQL if something is wrong with it.

    An agent-state row made by ``_agentstate`` is written as it is (a record is encoded here; a
    delta is made on the plain JSON). With ``sealer`` (a store with a codec) the content is sealed
    here, then every step, message and state row gets its checksum (``_storage.checksum``), over
    the stored text.
    """
    run_id, expected_head, step = request.run_id, request.expected_head, request.step
    messages, update = request.messages, request.update
    agent_states = _state_rows(request.agent_states)
    new_head = expected_head + 1
    run: dict[str, Any] = {
        "p_run_id": run_id,
        "p_expected": expected_head,
        "p_token": request.fencing_token,
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
    if sealer is not None:
        seal_commit(sealer, run_id, run, step_row, rows, states)
    add_sums(run_id, step_row, rows, states)
    return CommitParams(run=run, step=step_row, messages=rows, states=states, updates_run=update is not None)


def _step_kind(run_id: str, kind: str) -> str:
    """The stored text of a step kind; an unknown kind is the caller's mistake."""
    if type(kind) is StepKind:  # the runtime's steps: no lookup through the enum's constructor
        return kind.value
    try:
        return StepKind(kind).value
    except ValueError:
        raise UsageError(
            f"run {run_id}: step kind {kind!r} is not one of {[k.value for k in StepKind]}; nothing was written",
            run_id=run_id,
            option="kind",
        ) from None


class Driver:
    """The driver protocol of a store: what a run's driver (the runtime, a worker) calls.

    Held by the :class:`~graphflow_durable.store.Store` (``store._driver``), on its engines and its
    commit writer. Leases: a run is driven by one worker at a time. :meth:`acquire_lease` returns a
    new *fencing token* on every successful acquisition (also when the same owner acquires again),
    so an older copy of a worker holding the previous token is fenced out; :meth:`renew_lease`
    extends a lease held. :meth:`commit` checks the token only: a worker whose lease expired may
    still commit as long as nobody has taken the run over.
    """

    def __init__(self, engines: Engines, writer: CommitWriter) -> None:
        self._e = engines
        self._writer = writer
        self._sealer = engines.sealer if engines.sealer.on else None  # None: nothing to seal

    def _guard(self, action: str, run_id: str) -> AbstractContextManager[None]:
        return guarded(self._e, action, run_id=run_id)

    # New runs and commits: through the writer thread, blocking or for a coroutine.

    def create_run(self, request: CreateRequest) -> RunRecord:
        """Create a run (status ``running``, head 0, no steps), leased to its owner with a new fencing
        token (the record's ``fencing_token``, drawn from the store's counter in the transaction
        that writes the run: a driver of a run deleted under this id can never commit to it).

        With a first step, the run starts at head 1: that step and the agent states are written in
        the same transaction (a new run's first snapshot costs no commit of its own). With the boot
        id, PID namespace and start time recorded beside its host and pid, a worker on the same
        host, boot and PID namespace can take the run over at once if the owner's process dies.

        Raises:
            ConflictError: a run with this id exists already.
            NotSerializableError: the graph is not JSON.
        """
        record: RunRecord = self._writer.submit(encode_creation(request, time.time(), self._sealer)).result()
        return record

    def submit_create_run(self, request: CreateRequest) -> asyncio.Future[RunRecord]:
        """:meth:`create_run` for coroutines: hand the new run to the store's writer (with the
        commits of other runs) and return at once; the future gives the run's record once it is
        durable, or raises what :meth:`create_run` raises (a value that is not JSON raises here,
        before anything is handed over). Call it from a running event loop."""
        params = encode_creation(request, time.time(), self._sealer)
        return self._writer.submit_async(params, asyncio.get_running_loop())

    def commit(self, request: CommitRequest) -> int:
        """Append one step atomically; return the new head (``expected_head + 1``).

        One transaction: the head move (guarded by the fencing token), the update, the step, its
        messages and the agent states; on any error nothing is written. The store's writer thread
        writes it, with whatever other commits (of any run) are waiting at that moment, in one
        transaction; this call blocks until it is durable. From a coroutine use
        :meth:`submit_commit`, which leaves the event loop free meanwhile.

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: the fencing token is no longer the run's token (another worker took over).
            ConflictError: the run's head is not ``expected_head``, or the messages do not start at
                the run's message count / are not contiguous.
            NotSerializableError: a value is not JSON (raised before touching the database).
            StoreError: the database failed (nothing of this commit was written).
        """
        head: int = self._writer.submit(encode_commit(request, time.time(), self._sealer)).result()
        return head

    def submit_commit(self, request: CommitRequest) -> asyncio.Future[int]:
        """:meth:`commit` for coroutines: hand the commit to the writer thread and return at once.

        Call it from a running event loop. The future gives the new head once the commit is
        durable, or raises what :meth:`commit` raises; a value that is not JSON raises
        :class:`NotSerializableError` here, before anything is handed over. The future refuses a
        cancellation (``cancel()`` returns ``False``): the commit lands or fails all the same, and a
        task awaiting it that is cancelled gets its ``CancelledError`` once the outcome is in, which
        the future then still holds.
        """
        params = encode_commit(request, time.time(), self._sealer)
        return self._writer.submit_async(params, asyncio.get_running_loop())

    def together(self) -> AbstractContextManager[None]:
        """A block whose :meth:`submit_commit` and :meth:`submit_create_run` calls (from this thread)
        are handed to the writer together when it ends, and written in one transaction: one fsync
        (SQLite), one ``COMMIT`` (PostgreSQL). Each is still written or refused on its own, except
        that one after a failed one of the same run is not written and fails with that error: a run
        created together with its first commit never gets that commit on a run it did not create.
        The commits of a run handed over after its creation in the block are written under the
        fencing token the creation draws (whatever token they name, which cannot be known yet:
        the creation's record gives it, for the commits after the block).

        Nothing is handed over before the block ends: awaiting one of its futures inside it would
        wait forever, and the blocking :meth:`commit` and :meth:`create_run` raise
        :class:`UsageError` there.
        """
        return self._writer.together()

    # Leases: one worker drives a run at a time; a fencing token fences out the previous holder
    # (every token is drawn from one store-wide counter: none is issued twice).

    def acquire_lease(
        self,
        run_id: str,
        owner: str,
        *,
        lease_seconds: float,
        host: str | None = None,
        pid: int | None = None,
    ) -> int:
        """Take the run's lease for ``owner``; return the new fencing token: the store's next (one
        counter for every run), so a token never repeats for a run id, not even for a run deleted
        and made again under its id, and any token issued earlier is refused by its commits.

        Allowed when the run has no owner, when ``owner`` already holds it, when the lease has
        expired, or when the holder is provably dead: a process on this host, of this boot and PID
        namespace, whose pid is gone or was reused (another start time). ``host`` and
        ``pid`` describe the new owner's process (default: this process). Expiry is judged, and
        stored, by the database server's clock on PostgreSQL (by this host's on SQLite), in the
        statement that takes the lease.

        Raises:
            RunNotFoundError: no such run.
            RunLockedError: another live worker holds an unexpired lease.
        """
        check_lease_seconds(lease_seconds)
        host = socket.gethostname() if host is None else host
        pid = os.getpid() if pid is None else pid
        with self._guard(f"acquiring the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            token, reason, previous = acquire(
                conn, run_id, owner, lease_seconds, host, pid, self._e.sealer, self._e.url
            )
        if reason not in ("free", "same owner"):
            _log.info(
                "run %s: %s took the lease from %s (%s); token %d", run_id, owner, previous, reason, token
            )
        return token

    def renew_lease(self, run_id: str, owner: str, fencing_token: int, *, lease_seconds: float) -> float:
        """Extend a lease this worker holds; return the new expiry (epoch seconds, by the
        database server's clock on PostgreSQL).

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: the run's token or owner is no longer ``fencing_token`` / ``owner``.
        """
        return self.heartbeat(run_id, owner, fencing_token, lease_seconds=lease_seconds).expires_at

    def heartbeat(self, run_id: str, owner: str, fencing_token: int, *, lease_seconds: float) -> Heartbeat:
        """:meth:`renew_lease`, also saying whether a cancel of the run was requested (read in the
        same statement): a driver that sees one stops dispatching and records the run ``cancelled``.

        Raises what :meth:`renew_lease` raises.
        """
        check_lease_seconds(lease_seconds)
        with self._guard(f"renewing the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            return renew(conn, run_id, owner, fencing_token, lease_seconds)

    def release_lease(self, run_id: str, fencing_token: int) -> bool:
        """Give up the lease if ``fencing_token`` still holds it; return whether it did.

        Never raises because the lease was taken over (or the run is gone): there is nothing left
        to release then.
        """
        with self._guard(f"releasing the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            return release(conn, run_id, fencing_token)

    def head_scheduler(self, run_id: str) -> Mapping[str, Any] | None:
        """The scheduler JSON of the run's head step (``None`` before the first step), read alone
        and checked against the step's checksum (:class:`StoreCorruptError` if it does not match)."""
        with self._guard(f"reading the head of run {run_id}", run_id), self._e.read.begin() as conn:
            found: Mapping[str, Any] | None = head_scheduler(conn, run_id, self._e.url)
        return found

    def died_with(self, run_id: str, head_seq: int) -> frozenset[str] | None:
        """The other runs the process that ``run_id`` died with at ``head_seq`` drove (see
        :func:`deaths.company`; ``None``: no such death recorded)."""
        with self._guard(f"reading how run {run_id} died", run_id), self._e.read.begin() as conn:
            return deaths.company(conn, run_id, head_seq)

    def trace_context(self, run_id: str) -> str | None:
        """The run's stored trace context (JSON text, see ``schema.runs``), ``None`` when it has none."""
        runs = schema.runs
        with self._guard(f"reading the trace context of run {run_id}", run_id), self._e.read.begin() as conn:
            found = conn.execute(sa.select(runs.c.trace_context).where(runs.c.run_id == run_id)).scalar()
        return None if found is None else str(found)

    def submitted_trace_context(self, run_id: str) -> str | None:
        """The ``traceparent`` of the call that submitted the run to the pool, if any."""
        queue = schema.queue
        with self._guard(f"reading the submission of run {run_id}", run_id), self._e.read.begin() as conn:
            found = conn.execute(sa.select(queue.c.trace_context).where(queue.c.run_id == run_id)).scalar()
        return None if found is None else str(found)

    def rounds(self, run_id: str) -> int:
        """How many rounds the run has begun (its ``start`` steps)."""
        steps = schema.steps
        query = sa.select(sa.func.count()).where(
            steps.c.run_id == run_id, steps.c.kind == StepKind.START.value
        )
        with self._guard(f"counting the rounds of run {run_id}", run_id), self._e.read.begin() as conn:
            return int(conn.execute(query).scalar_one())

    def set_trace_context(self, run_id: str, value: str, fencing_token: int) -> None:
        """Store the run's trace context if ``fencing_token`` still holds the run (a stale driver's
        spans are not the run's last)."""
        runs = schema.runs
        held = sa.and_(runs.c.run_id == run_id, runs.c.fencing_token == fencing_token)
        with self._guard(f"storing the trace context of run {run_id}", run_id), self._e.write.begin() as conn:
            conn.execute(sa.update(runs).where(held).values(trace_context=value))
