"""The store's SQL statements, built once at import; and a run's row read by id (an unknown id is
:func:`not_found`) and turned into a :class:`RunRecord` (JSON decoded).

Building a statement once lets SQLAlchemy's compiled cache serve every later execution, so the hot
path (the driver's ``commit``) only binds parameters. Bind parameter names start with ``p_`` because
SQLAlchemy reserves column names for the values of INSERT/UPDATE. Only the store executes them.

The commit path goes one step further: :class:`HotPath` compiles its statements once per dialect
to driver SQL, which the writer runs on a DBAPI connection, skipping SQLAlchemy's per-execution
machinery (about 0.3 ms per commit here, more than a SQLite ``NORMAL`` commit).
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, RowMapping
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, FunctionElement

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import ENDED_STATUSES, RunRecord, SealedValue
from graphflow_durable._storage.schema import (
    FENCING_SEQUENCE,
    agent_states,
    fencing_tokens,
    messages,
    queue,
    runs,
    steps,
)
from graphflow_durable._storage.sealing import PLAIN, Sealer, key_of
from graphflow_durable.errors import RunNotFoundError

__all__ = [
    "COMMIT_CHANNEL",
    "DB_NOW",
    "HotPath",
    "Prepared",
    "RowsInsert",
    "INSERT_MESSAGE",
    "INSERT_RUN",
    "INSERT_STATE",
    "INSERT_STEP",
    "LEASE_COLUMNS",
    "LEASE_HOLDER",
    "NOTIFY_COMMITS",
    "NO_HOLDER",
    "RELEASE_LEASE",
    "RENEW_LEASE",
    "SELECT_LATEST_STATES",
    "SELECT_LATEST_STATES_TO",
    "SELECT_LEASE",
    "SELECT_LEASE_NOW",
    "SELECT_MESSAGES",
    "SELECT_MESSAGES_TO",
    "SELECT_RUN",
    "SELECT_SCHEDULER",
    "SELECT_STEPS",
    "SELECT_STEPS_TO",
    "SCAN_STATES",
    "SCAN_STEPS",
    "UPDATE_LEASE",
    "draw_token",
    "lease_clock",
    "next_token",
    "not_found",
    "run_record",
    "run_row",
]

_R = runs.c
_run_id = sa.bindparam("p_run_id", type_=sa.String)

#: The lease columns of a run's row, named once (the table declares their types): who holds the
#: lease (name, host, pid, process identity) and until when; a released lease has all of them NULL.
LEASE_HOLDER = (_R.lease_owner, _R.lease_host, _R.lease_pid, _R.lease_expires_at, _R.lease_process)
#: The holder columns and the fencing token: what the lease rules (``lease.LeaseRow``) read.
LEASE_COLUMNS = (_R.fencing_token, *LEASE_HOLDER)
#: The values of the holder columns of a lease nobody holds.
NO_HOLDER: dict[str, None] = {column.name: None for column in LEASE_HOLDER}


def _keep_unless_given(name: str, column: sa.Column[str]) -> sa.ColumnElement[str]:
    """``COALESCE(:name, column)``: a NULL parameter keeps the stored value."""
    return sa.func.coalesce(sa.bindparam(name, type_=column.type), column)


class _LeaseNow(FunctionElement[float]):
    """The time leases are judged by, in epoch seconds: PostgreSQL's own clock
    (``clock_timestamp()``, read by the server when the statement runs), so that workers whose
    clocks disagree still agree on who holds a lease; on SQLite (one host, one clock) the bind
    parameter ``p_now`` (the writing process's ``time.time()``)."""

    type = sa.Double()
    inherit_cache = True
    name = "lease_now"


@compiles(_LeaseNow)
def _lease_now_default(element: _LeaseNow, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(sa.bindparam("p_now", type_=sa.Double), **kw)


@compiles(_LeaseNow, "postgresql")
def _lease_now_postgresql(element: _LeaseNow, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


#: The lease clock as a SQL expression (see :class:`_LeaseNow`); statements using it need ``p_now``
#: on SQLite (PostgreSQL ignores it).
DB_NOW: sa.ColumnElement[float] = _LeaseNow()


class _StatementNow(FunctionElement[float]):
    """The lease clock when the statement started: on PostgreSQL ``statement_timestamp()``, which
    (unlike ``clock_timestamp()``) is stable within a statement, so a comparison with it can drive
    an index scan (the live leases and claims among many rows); on SQLite ``p_now``, as
    :data:`DB_NOW`. For reads that count live holders, where the time the statement started will do."""

    type = sa.Double()
    inherit_cache = True
    name = "statement_now"


@compiles(_StatementNow)
def _statement_now_default(element: _StatementNow, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(sa.bindparam("p_now", type_=sa.Double), **kw)


@compiles(_StatementNow, "postgresql")
def _statement_now_postgresql(element: _StatementNow, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


#: The lease clock at the statement's start, for index scans over live leases (see :class:`_StatementNow`).
STATEMENT_NOW: sa.ColumnElement[float] = _StatementNow()
_SELECT_NOW = sa.select(DB_NOW)


def lease_clock(conn: sa.Connection, local: float) -> float:
    """The lease clock's time now: the database server's on PostgreSQL, ``local`` on SQLite."""
    if conn.dialect.name != "postgresql":
        return local
    return float(conn.execute(_SELECT_NOW).scalar_one())


_DRAW_FROM_SEQUENCE = sa.select(FENCING_SEQUENCE.next_value())
_DRAW_FROM_ROW = (
    sa.update(fencing_tokens)
    .values(last_token=fencing_tokens.c.last_token + sa.literal_column("1"))
    .returning(fencing_tokens.c.last_token)
)


def draw_token(dialect: str) -> sa.Select[Any] | sa.Update:
    """The statement that issues the next fencing token and returns it (one row, one column).

    Every token comes from one store-wide counter (``schema.fencing_tokens``), so none repeats for
    a run id, not even across a delete and a new run of that id; the commit's guard stays
    ``fencing_token = :p_token``. PostgreSQL: ``nextval`` of the sequence (never waits for another
    transaction; a rolled back draw leaves a gap, which is harmless). SQLite: the counter row moved
    on under the write lock the transaction holds.
    """
    return _DRAW_FROM_SEQUENCE if dialect == "postgresql" else _DRAW_FROM_ROW


def next_token(conn: sa.Connection) -> int:
    """Issue the next fencing token in ``conn``'s transaction (a write transaction on SQLite)."""
    return int(conn.execute(draw_token(conn.dialect.name)).scalar_one())


_head_guard = (
    _R.run_id == _run_id,
    _R.head_seq == sa.bindparam("p_expected", type_=sa.Integer),
    _R.fencing_token == sa.bindparam("p_token", type_=sa.BigInteger),
)
_move_values = {
    "head_seq": sa.bindparam("p_new_head", type_=sa.Integer),
    "updated_at": sa.bindparam("p_now", type_=sa.Double),
}
#: The status at which a pending cancel request is settled (see ``_lifecycle_values``). A round
#: that ends (stopped, finished) before its driver saw the request keeps it: the run shows that it
#: ended before the cancel took effect, until the lease is taken for another round (UPDATE_LEASE).
_HONOURED = "cancelled"
#: What a commit that changes the run's lifecycle sets too. Kept out of the plain moves: setting
#: ``status`` at all (even to itself) costs SQLite an index update on every commit.
_lifecycle_values: dict[str, Any] = {
    "status": _keep_unless_given("p_status", _R.status),
    # a pending cancel request is answered once the run is cancelled
    "cancel_requested_at": sa.case(
        (sa.bindparam("p_status", type_=_R.status.type) == sa.literal_column(f"'{_HONOURED}'"), sa.null()),
        else_=_R.cancel_requested_at,
    ),
    "task": _keep_unless_given("p_task", _R.task),
    "result": _keep_unless_given("p_result", _R.result),
    # RunUpdate.release_lease: the lease columns as RELEASE_LEASE leaves them
    **{
        column.name: sa.case((sa.bindparam("p_release", type_=sa.Boolean), sa.null()), else_=column)
        for column in LEASE_HOLDER
    },
}


#: PostgreSQL's notification channel of commits: the run id as payload (``_storage/follow.py``
#: listens), sent after each group of commits (``writer.CommitWriter``, :data:`NOTIFY_COMMITS`).
COMMIT_CHANNEL = "graphflow_durable_commits"

#: PostgreSQL (psycopg): notify :data:`COMMIT_CHANNEL` once per run id of the array parameter, in a
#: transaction of its own that does not wait for its WAL flush (``SET LOCAL`` through ``set_config``:
#: the connection goes back to the pool as it was). Why not inside the commit: see ``writer``.
NOTIFY_COMMITS = (
    "SELECT set_config('synchronous_commit', 'off', true), "
    f"pg_notify('{COMMIT_CHANNEL}', r) FROM unnest(%s::text[]) AS r"
)


def _update_head(with_messages: bool, with_lifecycle: bool) -> sa.Update:
    """Move a run's head (guarded by head and token); with messages, also guard and move the
    message count (the new messages' first seq must be the count); with the lifecycle, also set
    status, task and result where given. Returns the run's pending cancel request (``NULL``:
    none): the driver learns of a cancel in the commit before its next dispatch, at no statement
    of its own."""
    values: dict[str, Any] = dict(_move_values)
    guard = list(_head_guard)
    if with_lifecycle:
        values.update(_lifecycle_values)
    if with_messages:
        guard.append(_R.message_count == sa.bindparam("p_first_seq", type_=sa.Integer))
        values["message_count"] = sa.bindparam("p_message_count", type_=sa.Integer)
    return sa.update(runs).where(*guard).values(**values).returning(_R.cancel_requested_at)


INSERT_RUN = sa.insert(runs)
#: The columns a new run's row is written with (the others keep their defaults).
NEW_RUN_COLUMNS = (
    "run_id", "graph_fingerprint", "graph", "status", "head_seq", "message_count", "task", "result",
    "lease_owner", "lease_host", "lease_pid", "lease_process", "fencing_token", "parent_run_id",
    "created_at", "updated_at", "trace_context", "sealed",
)  # fmt: skip
INSERT_STEP = sa.insert(steps)
INSERT_MESSAGE = sa.insert(messages)
INSERT_STATE = sa.insert(agent_states)

SELECT_RUN = sa.select(runs).where(_R.run_id == _run_id)
SELECT_LEASE = sa.select(_R.run_id, _R.head_seq, _R.message_count, *LEASE_COLUMNS).where(_R.run_id == _run_id)

#: The lease columns with the lease clock's time (column ``db_now``), for the takeover decision.
SELECT_LEASE_NOW = SELECT_LEASE.add_columns(DB_NOW.label("db_now"), _R.sealed)

SELECT_STEPS = (
    sa.select(steps.c.seq, steps.c.kind, steps.c.node, steps.c.data, steps.c.created_at, steps.c.checksum)
    .where(steps.c.run_id == _run_id)
    .order_by(steps.c.seq)
)
SELECT_SCHEDULER = sa.select(steps.c.scheduler, steps.c.checksum).where(
    steps.c.run_id == _run_id, steps.c.seq == sa.bindparam("p_seq", type_=sa.Integer)
)
SELECT_MESSAGES = (
    sa.select(messages.c.seq, messages.c.step_seq, messages.c.published, messages.c.body, messages.c.checksum)
    .where(messages.c.run_id == _run_id)
    .order_by(messages.c.seq)
)


#: An agent-state row as read back: everything its checksum covers, and the checksum.
_STATE_ROW = (
    agent_states.c.node,
    agent_states.c.step_seq,
    agent_states.c.base_step,
    agent_states.c.body,
    agent_states.c.checksum,
)


def _latest_states(*bound: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """Per node of a run: its latest whole state and the deltas after it, in step order; with
    ``bound`` (a condition on the step), only the rows it admits."""
    latest = (
        sa.select(agent_states.c.node, sa.func.max(agent_states.c.step_seq).label("step_seq"))
        .where(
            agent_states.c.run_id == _run_id,
            sa.or_(agent_states.c.base_step.is_(None), agent_states.c.base_step == 0),
            *bound,
        )
        .group_by(agent_states.c.node)
        .subquery("latest")
    )
    return (
        sa.select(*_STATE_ROW)
        .join(
            latest,
            sa.and_(agent_states.c.node == latest.c.node, agent_states.c.step_seq >= latest.c.step_seq),
        )
        .where(agent_states.c.run_id == _run_id, *bound)
        .order_by(agent_states.c.node, agent_states.c.step_seq)
    )


#: Per node of a run: its latest whole state and the deltas after it, in step order.
SELECT_LATEST_STATES = _latest_states()

#: The run as it stood at step ``p_at`` (``Store.cut``): its steps, messages and agent states up to it.
_at = sa.bindparam("p_at", type_=sa.Integer)
SELECT_STEPS_TO = SELECT_STEPS.where(steps.c.seq <= _at)
SELECT_MESSAGES_TO = SELECT_MESSAGES.where(messages.c.step_seq <= _at)
SELECT_LATEST_STATES_TO = _latest_states(agent_states.c.step_seq <= _at)

#: Every row of a run, with everything its checksum covers (``Store.verify``).
SCAN_STEPS = (
    sa.select(steps.c.seq, steps.c.kind, steps.c.node, steps.c.data, steps.c.scheduler, steps.c.checksum)
    .where(steps.c.run_id == _run_id)
    .order_by(steps.c.seq)
)
SCAN_STATES = (
    sa.select(*_STATE_ROW)
    .where(agent_states.c.run_id == _run_id)
    .order_by(agent_states.c.step_seq, agent_states.c.node)
)

_expires = DB_NOW + sa.bindparam("p_seconds", type_=sa.Double)
#: A new run's row, leased until the lease clock's now + ``p_seconds``; returns that expiry.
INSERT_NEW_RUN = (
    sa.insert(runs)
    .values(
        {
            **{name: sa.bindparam(name, type_=runs.c[name].type) for name in NEW_RUN_COLUMNS},
            "lease_expires_at": _expires,
        }
    )
    .returning(_R.lease_expires_at)
)
_lease_values = {
    "lease_owner": sa.bindparam("p_owner", type_=_R.lease_owner.type),
    "lease_host": sa.bindparam("p_host", type_=_R.lease_host.type),
    "lease_pid": sa.bindparam("p_pid", type_=_R.lease_pid.type),
    "lease_expires_at": _expires,
    "lease_process": sa.bindparam("p_process", type_=_R.lease_process.type),
}
#: Hand the lease to a new owner, guarded by the token read under the write lock and by the lease
#: rule judged in the statement, by the lease clock: free, the same owner, expired, or
#: ``p_early`` (the caller proved the holder's process dead). Returns the new expiry.
UPDATE_LEASE = (
    sa.update(runs)
    .where(
        _R.run_id == _run_id,
        _R.fencing_token == sa.bindparam("p_old_token", type_=sa.BigInteger),
        sa.or_(
            sa.bindparam("p_early", type_=sa.Boolean),
            _R.lease_owner.is_(None),
            _R.lease_owner == sa.bindparam("p_owner", type_=_R.lease_owner.type),
            _R.lease_expires_at.is_(None),
            _R.lease_expires_at < DB_NOW,
        ),
    )
    .values(
        **_lease_values,
        fencing_token=sa.bindparam("p_token", type_=sa.BigInteger),
        # a cancel the last round ended before (stopped, finished) is not one of the next round
        cancel_requested_at=sa.case(
            (_R.status.in_([sa.literal_column(f"'{s}'") for s in ENDED_STATUSES]), sa.null()),
            else_=_R.cancel_requested_at,
        ),
    )
    .returning(_R.lease_expires_at)
)
#: Extend a lease its holder (token and owner) still has, to the lease clock's now + ``p_seconds``.
#: An expired lease of submitted work is not renewed even when nobody took the run: while it was
#: expired, its queue and partition counted it free and another worker may have started a run of
#: them in its place. A run that was never submitted counts against no cap: its driver, back from
#: a stall or a database outage longer than the lease, renews it if nobody took it meanwhile.
RENEW_LEASE = (
    sa.update(runs)
    .where(
        _R.run_id == _run_id,
        _R.fencing_token == sa.bindparam("p_token", type_=sa.BigInteger),
        _R.lease_owner == sa.bindparam("p_owner", type_=_R.lease_owner.type),
        sa.or_(_R.lease_expires_at >= DB_NOW, ~sa.exists().where(queue.c.run_id == _R.run_id)),
    )
    .values(lease_expires_at=_expires)
    .returning(_R.lease_expires_at, _R.cancel_requested_at)
)
RELEASE_LEASE = (
    sa.update(runs)
    .where(
        _R.run_id == _run_id,
        _R.fencing_token == sa.bindparam("p_token", type_=sa.BigInteger),
        _R.lease_owner.is_not(None),
    )
    .values(NO_HOLDER)
)


@dataclass(frozen=True)
class Prepared:
    """A statement compiled to the driver's SQL, with how to order its parameters."""

    sql: str
    positions: tuple[str, ...] | None  # parameter names in order (positional styles), or None

    @classmethod
    def compile(cls, statement: ClauseElement, dialect: Dialect) -> Prepared:
        """Compile ``statement`` for ``dialect`` (no literal or expanding parameters allowed)."""
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        positions = tuple(compiled.positiontup or ()) if compiled.positional else None
        return cls(sql=compiled.string, positions=positions)

    def bind(self, params: Mapping[str, Any]) -> Any:
        """Parameters in the shape the driver wants for this statement."""
        if self.positions is None:
            return params
        return tuple([params[name] for name in self.positions])


#: At most this many rows go in one multi-row INSERT (``RowsInsert``): 100 rows of 8 columns stay
#: under SQLite's oldest limit on bound variables (999); more rows take several statements.
MAX_ROWS_PER_INSERT = 100


@dataclass(frozen=True, eq=False)
class RowsInsert:
    """One table's INSERT for any number of rows: a single row with its one-row statement, several
    with one multi-row ``INSERT ... VALUES (...), (...)`` compiled once per row count (one statement
    instead of one per row: SQLite runs one prepared statement instead of stepping one per row,
    PostgreSQL gets one statement in its pipeline)."""

    table: sa.Table
    dialect: Dialect
    one: Prepared
    _many: dict[int, tuple[str, tuple[tuple[int, str], ...] | None, tuple[str, ...]]] = dataclasses.field(
        default_factory=dict, repr=False
    )

    def statements(self, rows: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
        """``(sql, parameters)`` of the statements that insert ``rows`` (at least one row)."""
        if len(rows) == 1:
            yield self.one.sql, self.one.bind(rows[0])
            return
        for start in range(0, len(rows), MAX_ROWS_PER_INSERT):
            chunk = rows[start : start + MAX_ROWS_PER_INSERT]
            if len(chunk) == 1:
                yield self.one.sql, self.one.bind(chunk[0])
                continue
            many = self._many.get(len(chunk))
            if many is None:
                many = self._many.setdefault(len(chunk), self._compile(len(chunk)))
            sql, positions, columns = many
            if positions is not None:
                yield sql, tuple([chunk[index][column] for index, column in positions])
            else:
                yield sql, {f"r{index}_{c}": row[c] for index, row in enumerate(chunk) for c in columns}

    def _compile(self, count: int) -> tuple[str, tuple[tuple[int, str], ...] | None, tuple[str, ...]]:
        columns = tuple(column.name for column in self.table.columns)
        rows = [
            {c: sa.bindparam(f"r{index}_{c}", type_=self.table.c[c].type) for c in columns}
            for index in range(count)
        ]
        prepared = Prepared.compile(sa.insert(self.table).values(rows), self.dialect)
        positions = None
        if prepared.positions is not None:
            split = (name[1:].split("_", 1) for name in prepared.positions)
            positions = tuple((int(index), column) for index, column in split)
        return prepared.sql, positions, columns


#: A run's lease columns as read by the commit path (attribute access like a SQLAlchemy Row).
LeaseTuple = namedtuple("LeaseTuple", list(SELECT_LEASE.selected_columns.keys()))  # type: ignore[misc]


@dataclass(frozen=True)
class HotPath:
    """The commit path's statements, and the read of a run's row every run starts with, compiled
    once per kind of dialect (not per store: compiling them takes ~2 ms, reading a run's row
    through SQLAlchemy's compiler on a new store ~0.5 ms, more than the read itself)."""

    update_head: Mapping[tuple[bool, bool], Prepared]  # by (with messages, with lifecycle)
    insert_step: Prepared
    insert_message: RowsInsert
    insert_state: RowsInsert
    select_lease: Prepared
    insert_run: Prepared
    select_run: Prepared
    draw_token: Prepared  # a new run's token, drawn just before its row is written

    @classmethod
    def for_dialect(cls, dialect: Dialect) -> HotPath:
        """Every statement of the commit path compiled for ``dialect`` (cached by the dialect's
        name, driver, parameter style and server version)."""
        key = (dialect.name, dialect.driver, dialect.paramstyle, dialect.server_version_info)
        hot = _compiled.get(key)
        if hot is None:
            hot = _compiled.setdefault(key, cls._compile(dialect))
        return hot

    @classmethod
    def _compile(cls, dialect: Dialect) -> HotPath:
        return cls(
            update_head={
                (m, life): Prepared.compile(_update_head(m, life), dialect)
                for m in (False, True)
                for life in (False, True)
            },
            insert_step=Prepared.compile(INSERT_STEP, dialect),
            insert_message=RowsInsert(messages, dialect, Prepared.compile(INSERT_MESSAGE, dialect)),
            insert_state=RowsInsert(agent_states, dialect, Prepared.compile(INSERT_STATE, dialect)),
            select_lease=Prepared.compile(SELECT_LEASE, dialect),
            insert_run=Prepared.compile(INSERT_NEW_RUN, dialect),
            select_run=Prepared.compile(SELECT_RUN, dialect),
            draw_token=Prepared.compile(draw_token(dialect.name), dialect),
        )


_compiled: dict[tuple[Any, ...], HotPath] = {}


def not_found(run_id: str) -> RunNotFoundError:
    """The error for a run id the store does not have (nothing was changed). One wording for every
    caller: the CLI prints it as it is, so it names the command that lists the runs."""
    return RunNotFoundError(
        f"run {run_id} does not exist, nothing was changed; 'graphflow-durable runs list' lists the runs",
        run_id=run_id,
    )


def run_row(conn: sa.Connection, run_id: str, sealer: Sealer = PLAIN) -> RunRecord:
    """The run's row; :class:`RunNotFoundError` when there is none."""
    row = conn.execute(SELECT_RUN, {"p_run_id": run_id}).mappings().first()
    if row is None:
        raise not_found(run_id)
    return run_record(row, sealer)


#: The fields of a :class:`RunRecord` that are columns of the run's row as they are (the JSON
#: columns are decoded; ``pending`` is not stored in the row).
_PLAIN_RUN_FIELDS = tuple(
    f.name for f in dataclasses.fields(RunRecord) if f.name not in ("graph", "task", "result", "pending")
)


def run_record(
    row: Mapping[str, Any] | RowMapping, sealer: Sealer = PLAIN, *, mark: bool = False
) -> RunRecord:
    """A run's row (as stored: JSON text) as a :class:`RunRecord` (JSON decoded; its task and
    result opened by ``sealer``: without a codec, a sealed one is refused naming its key, or with
    ``mark`` (a listing) read as a :class:`SealedValue` naming it)."""
    plain: dict[str, Any] = {name: row.get(name) for name in _PLAIN_RUN_FIELDS}
    run_id = row["run_id"]
    return RunRecord(
        **plain,
        graph=loads(row["graph"]),
        task=_content(row["task"], sealer, run_id, "task", mark),
        result=_content(row["result"], sealer, run_id, "result", mark),
    )


def _content(stored: str | None, sealer: Sealer, run_id: str, column: str, mark: bool) -> Any:
    """A run's ``column`` decoded; with ``mark``, a :class:`SealedValue` where its key is not held
    (a wrong key under a held id, or a damaged value, still raises)."""
    if stored is None:
        return None
    if mark and (key_id := key_of(stored)) is not None and not sealer.holds(key_id):
        return SealedValue(key_id)
    return loads(sealer.open(stored, "graphflow_runs", run_id, "run", column))
