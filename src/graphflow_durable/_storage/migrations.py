"""Versioned schema migrations: an append-only tuple of ``(version, description, function)``.

Rules (a test keeps them):

- Never edit or reorder an existing migration; append a new one. Each function defines its own DDL
  (its own local ``Table`` objects), so later edits to ``_schema.py`` never change what an old
  migration does to a database.
- Each migration runs in one transaction together with its version bump (row in
  ``graphflow_schema_version``); PostgreSQL and SQLite both have transactional DDL.
- After the last migration a fresh database has exactly the tables and columns of
  ``_schema.metadata`` that its dialect holds (``_schema.declared_tables``).

Concurrent openers are serialised: SQLite by ``BEGIN IMMEDIATE`` (the write lock), PostgreSQL by
a transaction-scoped advisory lock; each migration re-reads the version under that lock.

A database that holds other tables (an application's) and no store yet is refused before any DDL,
unless the store is ``shared``; a database that holds tables with the store's names the store did
not create (a ``graphflow_*`` table and no version table, or a version table the store did not
write) is refused even then (:func:`refuse_unowned`, over what :func:`survey` read). The check is
made again under the lock, in the transaction that would create the first table, so a refusal
never leaves anything behind.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from graphflow_durable._version import __version__
from graphflow_durable.errors import SchemaVersionError, StoreConfigError

__all__ = [
    "HEAD",
    "MIGRATIONS",
    "Migration",
    "Survey",
    "current_version",
    "holds_store",
    "migrate",
    "no_store",
    "refuse_unowned",
    "survey",
    "table_names",
]

_log = logging.getLogger(__name__)

Migration = tuple[int, str, Callable[[Connection], None]]

_VERSION_TABLE = "graphflow_schema_version"
#: Every table of the package is named so; any other table in the database is foreign.
_PREFIX = "graphflow_"
#: Tables in the schemas on the search path (where the store creates its own), system schemas left out.
_PG_TABLES = """
SELECT c.relname FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = ANY (current_schemas(false)) AND c.relkind IN ('r', 'p', 'f', 'v', 'm')
AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
"""
_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
#: Arbitrary constant key of the PostgreSQL advisory lock held while migrating.
_PG_LOCK_KEY = 0x67F1_0D0B


def _version_table(metadata: sa.MetaData) -> sa.Table:
    """The version table as it was first created (frozen: never change it)."""
    return sa.Table(
        _VERSION_TABLE,
        metadata,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("applied_at", sa.Double, nullable=False),
    )


def _m0001_create_tables(conn: Connection) -> None:
    """Version 1: runs, steps, messages, agent_states (frozen copy of the schema at version 1)."""
    md = sa.MetaData()
    sa.Table(
        "graphflow_runs",
        md,
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("graph_fingerprint", sa.String, nullable=False),
        sa.Column("graph", sa.Text, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("head_seq", sa.Integer, nullable=False),
        sa.Column("message_count", sa.Integer, nullable=False),
        sa.Column("task", sa.Text, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("lease_owner", sa.String, nullable=True),
        sa.Column("lease_host", sa.String, nullable=True),
        sa.Column("lease_pid", sa.Integer, nullable=True),
        sa.Column("lease_expires_at", sa.Double, nullable=True),
        sa.Column("fencing_token", sa.Integer, nullable=False),
        sa.Column("parent_run_id", sa.String, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Index("graphflow_runs_status", "status"),
        sa.Index("graphflow_runs_parent", "parent_run_id"),
    )
    sa.Table(
        "graphflow_steps",
        md,
        sa.Column(
            "run_id", sa.String, sa.ForeignKey("graphflow_runs.run_id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("node", sa.String, nullable=True),
        sa.Column("scheduler", sa.Text, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    sa.Table(
        "graphflow_messages",
        md,
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("step_seq", sa.Integer, nullable=False),
        sa.Column("published", sa.Boolean, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id", "step_seq"],
            ["graphflow_steps.run_id", "graphflow_steps.seq"],
            ondelete="CASCADE",
            name="graphflow_messages_step",
        ),
    )
    sa.Table(
        "graphflow_agent_states",
        md,
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("node", sa.String, primary_key=True),
        sa.Column("step_seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id", "step_seq"],
            ["graphflow_steps.run_id", "graphflow_steps.seq"],
            ondelete="CASCADE",
            name="graphflow_agent_states_step",
        ),
    )
    md.create_all(conn)


def _m0002_agent_state_deltas(conn: Connection) -> None:
    """Version 2: an agent-state row may be a delta against the node's previous row."""
    conn.execute(sa.text("ALTER TABLE graphflow_agent_states ADD COLUMN base_step INTEGER"))


def _m0003_create_queue(conn: Connection) -> None:
    """Version 3: the worker-pool queue (submitted runs, claims, retry back-off); frozen copy."""
    md = sa.MetaData()
    sa.Table(
        "graphflow_queue",
        md,
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("team", sa.String, nullable=True),
        sa.Column("task", sa.Text, nullable=True),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("not_before", sa.Double, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("claimed_by", sa.String, nullable=True),
        sa.Column("claim_host", sa.String, nullable=True),
        sa.Column("claim_pid", sa.Integer, nullable=True),
        sa.Column("claim_expires_at", sa.Double, nullable=True),
        sa.Column("claim_token", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Index("graphflow_queue_status", "status", "created_at"),
        sa.Index("graphflow_queue_team", "team"),
    )
    md.create_all(conn)


def _m0004_state_splices(conn: Connection) -> None:
    """Version 4: agent-state deltas may be splices of the state's JSON text whose pieces reference
    messages of the run, and ``base_step`` 0 marks a whole state written that way. No DDL: the
    version tells older releases, which cannot read such rows, to refuse the database."""


def _m0005_lease_process(conn: Connection) -> None:
    """Version 5: ``graphflow_runs.lease_process``, the lease holder's process identity (JSON: boot
    id, pid-namespace id, process start time), so that a worker takes a lease over early only when
    the holder provably died, not merely because its pid is missing from another PID namespace."""
    conn.execute(sa.text("ALTER TABLE graphflow_runs ADD COLUMN lease_process TEXT"))


def _m0006_row_checksums(conn: Connection) -> None:
    """Version 6: ``checksum`` on steps, messages and agent states, a CRC of each row's keys and
    content written with the row and checked when it is read. Rows already stored keep NULL (not
    checked): a backfill would certify whatever they hold now, damage included, and rewrite every
    row of the store under the migration lock."""
    for table in ("graphflow_steps", "graphflow_messages", "graphflow_agent_states"):
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN checksum BIGINT"))


def _m0007_cancel_request(conn: Connection) -> None:
    """Version 7: ``graphflow_runs.cancel_requested_at``, a cancel asked of the run's live driver
    (from another process), which the driver learns of when it renews its lease."""
    conn.execute(sa.text("ALTER TABLE graphflow_runs ADD COLUMN cancel_requested_at DOUBLE PRECISION"))


def _m0008_input_requests(conn: Connection) -> None:
    """Version 8: ``graphflow_input_requests``, the requests for human input of runs (asked,
    answered, the deadline and its default); frozen copy."""
    md = sa.MetaData()
    sa.Table("graphflow_runs", md, sa.Column("run_id", sa.String, primary_key=True))  # the FK's target
    sa.Table(
        "graphflow_input_requests",
        md,
        sa.Column(
            "run_id",
            sa.String,
            sa.ForeignKey("graphflow_runs.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("request_id", sa.String, primary_key=True),
        sa.Column("node", sa.String, nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.String, nullable=False),
        sa.Column("status", sa.String, nullable=False),
        sa.Column("answer", sa.Text, nullable=True),
        sa.Column("answered_by", sa.String, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("answered_at", sa.Double, nullable=True),
        sa.Column("deadline", sa.Double, nullable=True),
        sa.Column("default_answer", sa.Text, nullable=True),
        sa.Index("graphflow_input_requests_status", "status", "deadline"),
    ).create(conn)


def _m0009_request_texts_as_json(conn: Connection) -> None:
    """Version 9: the prompt, answer and default answer of each request for human input are stored
    as JSON strings, as the message log stores its bodies (PostgreSQL's text cannot hold NUL);
    rows written before are re-encoded. Frozen: canonical JSON of a string, spelled out here."""
    encode = json.JSONEncoder(ensure_ascii=False).encode
    table = sa.table(
        "graphflow_input_requests",
        sa.column("run_id", sa.String),
        sa.column("request_id", sa.String),
        sa.column("prompt", sa.Text),
        sa.column("answer", sa.Text),
        sa.column("default_answer", sa.Text),
    )
    rows = conn.execute(
        sa.select(table.c.run_id, table.c.request_id, table.c.prompt, table.c.answer, table.c.default_answer)
    ).all()
    for run_id, request_id, prompt, answer, default in rows:
        conn.execute(
            sa.update(table)
            .where(table.c.run_id == run_id, table.c.request_id == request_id)
            .values(
                prompt=encode(prompt),
                answer=None if answer is None else encode(answer),
                default_answer=None if default is None else encode(default),
            )
        )


def _m0010_fencing_tokens(conn: Connection) -> None:
    """Version 10: fencing tokens from one store-wide counter (until now each run counted its own
    from 1, so a run deleted and made again under its id repeated the tokens a stale driver may
    still hold). PostgreSQL: the sequence ``graphflow_fencing_tokens``, and the token columns become
    BIGINT (the counter runs over every lease of every run); SQLite (64-bit integers already): a
    one-row table ``graphflow_fencing_tokens`` holding the last token issued. Either starts above
    every token stored, run leases and submission claims alike."""
    postgresql = conn.dialect.name == "postgresql"
    if postgresql:  # first: ALTER locks both tables, so no token is issued while the top is read
        conn.execute(sa.text("ALTER TABLE graphflow_runs ALTER COLUMN fencing_token TYPE BIGINT"))
        conn.execute(sa.text("ALTER TABLE graphflow_queue ALTER COLUMN claim_token TYPE BIGINT"))
    top = conn.execute(
        sa.text(
            "SELECT MAX(token) FROM (SELECT MAX(fencing_token) AS token FROM graphflow_runs "
            "UNION ALL SELECT MAX(claim_token) AS token FROM graphflow_queue) AS issued"
        )
    ).scalar()
    top = max(int(top or 0), 0)
    if postgresql:
        conn.execute(sa.text(f"CREATE SEQUENCE graphflow_fencing_tokens AS BIGINT START WITH {top + 1}"))
    else:
        conn.execute(sa.text("CREATE TABLE graphflow_fencing_tokens (last_token BIGINT NOT NULL)"))
        conn.execute(sa.text("INSERT INTO graphflow_fencing_tokens (last_token) VALUES (:top)"), {"top": top})


def _m0011_nested_run_parents(conn: Connection) -> None:
    """Version 11: a nested durable team's run records its outer run in ``parent_run_id``, so that
    deleting a run finds its nested runs through that column alone. Until now only its id said so:
    ``OUTER/node/step/team`` (the outer turn's idempotency key and the team's name). This is the one
    place a run id is parsed: a run without a parent whose id has that shape, and whose ``OUTER``
    is a run of the store, gets ``OUTER`` as its parent."""
    shaped = conn.execute(
        sa.text("SELECT run_id FROM graphflow_runs WHERE parent_run_id IS NULL AND run_id LIKE '%/%/%/%'")
    ).scalars()
    parents: dict[str, str] = {}
    for run_id in shaped:
        outer, node, step, team = ["", "", "", "", *str(run_id).rsplit("/", 3)][-4:]
        if outer and node and step.isdigit() and team:
            parents[str(run_id)] = outer
    exists = sa.text("SELECT run_id FROM graphflow_runs WHERE run_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    wanted = sorted(set(parents.values()))
    found: set[str] = set()
    for start in range(0, len(wanted), 500):
        found.update(conn.execute(exists, {"ids": wanted[start : start + 500]}).scalars())
    rows = [{"p_parent": outer, "p_run": run_id} for run_id, outer in parents.items() if outer in found]
    if rows:
        conn.execute(
            sa.text("UPDATE graphflow_runs SET parent_run_id = :p_parent WHERE run_id = :p_run"), rows
        )


def _m0012_call_records(conn: Connection) -> None:
    """Version 12: ``graphflow_call_records``, the model and tool calls made inside durable turns
    (recorded, replayed, discarded), each row checksummed; frozen copy."""
    md = sa.MetaData()
    sa.Table("graphflow_runs", md, sa.Column("run_id", sa.String, primary_key=True))  # the FK's target
    sa.Table(
        "graphflow_call_records",
        md,
        sa.Column(
            "run_id",
            sa.String,
            sa.ForeignKey("graphflow_runs.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("turn_key", sa.String, nullable=False),
        sa.Column("node", sa.String, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("ident", sa.String, nullable=False),
        sa.Column("fingerprint", sa.String, nullable=False),
        sa.Column("outcome", sa.String, nullable=False),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=True),
        sa.Column("completion_tokens", sa.Integer, nullable=True),
        sa.Column("discarded", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("checksum", sa.BigInteger, nullable=False),
        sa.Index("graphflow_call_records_turn", "run_id", "turn_key"),
    ).create(conn)


def _m0013_trace_context(conn: Connection) -> None:
    """Version 13: ``graphflow_runs.trace_context``, JSON ``{"root", "last"}``: the W3C trace
    context every attach of the run is a child of, and the last attach's span (each links to it);
    ``graphflow_queue.trace_context``: the ``traceparent`` of the call that submitted the run."""
    conn.execute(sa.text("ALTER TABLE graphflow_runs ADD COLUMN trace_context TEXT"))
    conn.execute(sa.text("ALTER TABLE graphflow_queue ADD COLUMN trace_context TEXT"))


def _m0014_deaths(conn: Connection) -> None:
    """Version 14: ``graphflow_deaths``, which process each run died with (at a takeover), and
    ``graphflow_queue.run_alone``, a run a worker must drive alone; frozen copy."""
    md = sa.MetaData()
    sa.Table("graphflow_runs", md, sa.Column("run_id", sa.String, primary_key=True))  # the FK's target
    sa.Table(
        "graphflow_deaths",
        md,
        sa.Column(
            "run_id",
            sa.String,
            sa.ForeignKey("graphflow_runs.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("head_seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder_host", sa.String, primary_key=True),
        sa.Column("holder_pid", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder_process", sa.String, primary_key=True),
        sa.Column("died_at", sa.Double, nullable=False),
        sa.Index("graphflow_deaths_holder", "holder_host", "holder_pid"),
    ).create(conn)
    conn.execute(sa.text("ALTER TABLE graphflow_queue ADD COLUMN run_alone BOOLEAN"))


def _m0015_flow_control(conn: Connection) -> None:
    """Version 15: flow control for the worker pool. ``graphflow_queue`` gains the run's named
    ``queue`` (``'default'``), ``priority`` (0) and ``partition_key``, and the indexes a claim walks
    (priority order, live claims; ``graphflow_runs``: live leases); ``graphflow_queue_settings``
    holds each queue's caps and rate, ``graphflow_queue_starts`` the recent claims a rate counts;
    frozen copy."""
    conn.execute(sa.text("ALTER TABLE graphflow_queue ADD COLUMN queue VARCHAR DEFAULT 'default' NOT NULL"))
    conn.execute(sa.text("ALTER TABLE graphflow_queue ADD COLUMN priority INTEGER DEFAULT 0 NOT NULL"))
    conn.execute(sa.text("ALTER TABLE graphflow_queue ADD COLUMN partition_key VARCHAR"))
    conn.execute(sa.text("CREATE INDEX graphflow_queue_order ON graphflow_queue (priority, created_at)"))
    conn.execute(sa.text("CREATE INDEX graphflow_queue_claims ON graphflow_queue (claim_expires_at)"))
    conn.execute(sa.text("CREATE INDEX graphflow_runs_lease ON graphflow_runs (lease_expires_at)"))
    md = sa.MetaData()
    sa.Table(
        "graphflow_queue_settings",
        md,
        sa.Column("queue", sa.String, primary_key=True),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("worker_concurrency", sa.Integer, nullable=True),
        sa.Column("partition_concurrency", sa.Integer, nullable=True),
        sa.Column("rate_count", sa.Integer, nullable=True),
        sa.Column("rate_seconds", sa.Double, nullable=True),
        sa.Column("rate", sa.String, nullable=True),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    sa.Table(
        "graphflow_queue_starts",
        md,
        sa.Column("queue", sa.String, primary_key=True),
        sa.Column("started_at", sa.Double, primary_key=True),
        sa.Column("run_id", sa.String, primary_key=True),
    )
    md.create_all(conn)


def _m0016_rate_limits(conn: Connection) -> None:
    """Version 16: ``graphflow_rate_limits``, the model-provider rate limits every process shares
    (one row per key: its schedules, pause and current window); frozen copy."""
    md = sa.MetaData()
    sa.Table(
        "graphflow_rate_limits",
        md,
        sa.Column("key", sa.String, primary_key=True),
        sa.Column("requests_per_minute", sa.Double, nullable=True),
        sa.Column("tokens_per_minute", sa.Double, nullable=True),
        sa.Column("request_at", sa.Double, nullable=False),
        sa.Column("token_at", sa.Double, nullable=False),
        sa.Column("paused_until", sa.Double, nullable=False),
        sa.Column("window_start", sa.Double, nullable=False),
        sa.Column("window_requests", sa.BigInteger, nullable=False),
        sa.Column("window_tokens", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    ).create(conn)


def _m0017_newest_runs(conn: Connection) -> None:
    """Version 17: an index on ``graphflow_runs (created_at, run_id)``, the order the console's runs
    page reads a keyset page in (without it, each page sorts every run: 430 ms at 100,000 runs on
    SQLite, 0.2 ms with it)."""
    conn.execute(sa.text("CREATE INDEX graphflow_runs_newest ON graphflow_runs (created_at, run_id)"))


def _m0018_sealing(conn: Connection) -> None:
    """Version 18: encryption at rest. ``graphflow_key_checks`` keeps each sealing key's check
    value (a wrong key told from a damaged row); ``graphflow_runs.sealed`` marks a run whose
    content is sealed, so a store without the codec never writes a plain row into it; frozen copy."""
    sa.Table(
        "graphflow_key_checks",
        sa.MetaData(),
        sa.Column("key_id", sa.String, primary_key=True),
        sa.Column("check_value", sa.String, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    ).create(conn)
    conn.execute(sa.text("ALTER TABLE graphflow_runs ADD COLUMN sealed BOOLEAN"))


#: Append only. Versions are 1, 2, 3, ... in order. Version 1's description is also how a version
#: table is known to be the store's (:func:`refuse_unowned`): never change it.
MIGRATIONS: tuple[Migration, ...] = (
    (1, "create runs, steps, messages and agent_states", _m0001_create_tables),
    (2, "agent states stored as deltas against the previous row (base_step)", _m0002_agent_state_deltas),
    (3, "create the worker-pool queue (submissions, claims, retry back-off)", _m0003_create_queue),
    (4, "agent states as text splices that reference messages (base_step 0: whole)", _m0004_state_splices),
    (5, "the lease holder's process identity (boot id, pid namespace, start time)", _m0005_lease_process),
    (6, "a checksum of each step, message and agent-state row, checked on read", _m0006_row_checksums),
    (7, "a cancel requested of a run's live driver (cancel_requested_at)", _m0007_cancel_request),
    (8, "create the requests for human input (pending, answered, deadline)", _m0008_input_requests),
    (
        9,
        "request prompts and answers stored as JSON strings (NUL alike on both backends)",
        _m0009_request_texts_as_json,
    ),
    (10, "fencing tokens from one store-wide counter, never repeated for a run id", _m0010_fencing_tokens),
    (11, "a nested team's run records its outer run (parent_run_id)", _m0011_nested_run_parents),
    (12, "create the records of model and tool calls made inside turns", _m0012_call_records),
    (13, "a run's and a submission's trace context for OpenTelemetry", _m0013_trace_context),
    (14, "which process each run died with; runs a worker must drive alone", _m0014_deaths),
    (15, "named queues: settings, priorities, partitions and the claims a rate counts", _m0015_flow_control),
    (16, "create the model-provider rate limits shared by every process", _m0016_rate_limits),
    (17, "index the runs newest first for the console's pages", _m0017_newest_runs),
    (18, "key check values, and which runs hold sealed content", _m0018_sealing),
)

#: The schema version this package writes.
HEAD: int = MIGRATIONS[-1][0]


def current_version(conn: Connection) -> int | None:
    """The database's schema version, or ``None`` when it has no version table yet."""
    if not sa.inspect(conn).has_table(_VERSION_TABLE):
        return None
    table = _version_table(sa.MetaData())
    found = conn.execute(sa.select(sa.func.max(table.c.version))).scalar_one()
    return 0 if found is None else int(found)


def table_names(conn: Connection) -> list[str]:
    """The names of the tables and views: all of SQLite's, PostgreSQL's in the schemas on the search path."""
    query = _PG_TABLES if conn.dialect.name == "postgresql" else _SQLITE_TABLES
    return sorted(str(name) for name in conn.execute(sa.text(query)).scalars())


def holds_store(names: Sequence[str]) -> bool:
    """Whether a database whose tables are ``names`` holds a store (its schema-version table)."""
    return _VERSION_TABLE in names


def no_store(url: str, why: str) -> StoreConfigError:
    """The error for a database that holds no store, opened by a caller that must not create one
    (``Store(url, create=False)``); ``why`` says what was found instead."""
    return StoreConfigError(f"no store at {url} ({why}); nothing was created", url=url, option="create")


@dataclass(frozen=True)
class Survey:
    """What a database holds, as far as deciding whether it is (or may become) a store goes.

    Attributes:
        tables: the names of its tables and views (see :func:`table_names`).
        version_columns: the columns of its version table (empty: it has none).
        origin: the description of its version table's row for version 1 (``None``: no such row,
            or the table lacks the store's columns).
    """

    tables: tuple[str, ...]
    version_columns: frozenset[str] = frozenset()
    origin: str | None = None


#: The version table's columns as the store creates them (:func:`_version_table`).
_VERSION_COLUMNS = frozenset({"version", "description", "applied_at"})


def survey(conn: Connection) -> Survey:
    """Read what :func:`refuse_unowned` decides on; reads only (no lock taken, nothing written)."""
    names = tuple(table_names(conn))
    if _VERSION_TABLE not in names:
        return Survey(names)
    found = frozenset(str(column["name"]) for column in sa.inspect(conn).get_columns(_VERSION_TABLE))
    if not found >= _VERSION_COLUMNS:
        return Survey(names, found)
    table = _version_table(sa.MetaData())
    origin = conn.execute(sa.select(table.c.description).where(table.c.version == 1)).scalar()
    return Survey(names, found, None if origin is None else str(origin))


def refuse_unowned(
    found: Survey, *, url: str, dialect: str, shared: bool, origin: str = MIGRATIONS[0][1]
) -> None:
    """Refuse a database the store must not write to, before anything is written to it.

    - Tables named like the store's (``graphflow_*``) that the store did not create: such a table and
      no version table (the store creates its first table and the version table in one
      transaction), or a version table with other columns, or one whose row for version 1 is not
      the store's first migration (``origin``). Refused whatever ``shared`` says: migrating would
      add columns to, or fail on, another application's table.
    - Unless ``shared``, tables that are not the store's (an application's) and no store yet. A
      database with the store's version table is a store (foreign tables added later are its
      owner's business); SQLite's own ``sqlite_*`` tables are not foreign.

    Raises:
        StoreConfigError: the database is refused; ``option`` is ``"shared"`` when sharing it would
            be allowed, ``None`` when its tables with the store's names are not the store's.
    """
    where = "a database of its own" if dialect == "sqlite" else "a database or schema of its own"
    if _VERSION_TABLE in found.tables:
        if not found.version_columns >= _VERSION_COLUMNS:
            what = f"columns {', '.join(sorted(found.version_columns))}"
        elif found.origin is None:
            what = "no row for version 1"
        elif found.origin != origin:
            what = f"version 1 described as {found.origin[:60]!r}"
        else:
            return
        raise StoreConfigError(
            f"database {url} holds a table {_VERSION_TABLE} not written by graphflow-durable ({what}); "
            f"nothing was changed: point the store at {where}",
            url=url,
        )
    ours = sorted(name for name in found.tables if name.startswith(_PREFIX))
    if ours:
        raise StoreConfigError(
            f"database {url} holds {'a table' if len(ours) == 1 else 'tables'} {_shown(ours)} that "
            f"graphflow-durable did not create (it has no {_VERSION_TABLE} table); nothing was "
            f"changed: point the store at {where}",
            url=url,
        )
    foreign = sorted(name for name in found.tables if not name.startswith("sqlite_"))
    if foreign and not shared:
        raise StoreConfigError(
            f"database {url} holds tables that are not graphflow-durable's ({_shown(foreign)}) and no "
            f"store; nothing was created: point the store at {where}, or add shared=true to the store "
            "URL (Store(url, shared=True)) to keep the store's graphflow_* tables beside them",
            url=url,
            option="shared",
        )


def _refuse(found: Survey, *, url: str, dialect: str, shared: bool, create: bool, origin: str) -> None:
    """:func:`refuse_unowned`, after refusing a database without a store where none may be created."""
    if not create and not holds_store(found.tables):
        raise no_store(url, "the database holds no graphflow-durable store")
    refuse_unowned(found, url=url, dialect=dialect, shared=shared, origin=origin)


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def migrate(
    write: Engine,
    *,
    read: Engine | None = None,
    url: str,
    migrations: Sequence[Migration] = MIGRATIONS,
    shared: bool = False,
    create: bool = True,
    upgrade: bool = True,
) -> int:
    """Bring the database at ``write`` to the last of ``migrations``; return its version.

    ``write`` must begin write transactions (SQLite ``BEGIN IMMEDIATE``); ``read`` (default
    ``write``) is used for the up-to-date check. ``url`` (password hidden) is only for messages.
    A database :func:`refuse_unowned` refuses is refused before any DDL (checked first without,
    then again with the lock). Unless ``create``, a database without a store is refused before any
    DDL; a store at an older version is migrated either way, unless not ``upgrade``: then it is
    refused before any DDL (a check that must change nothing, ``graphflow-durable check``).

    Raises:
        SchemaVersionError: the database's version is newer than the last migration known here.
        StoreConfigError: the database holds tables with the store's names that the store did not
            create, or (unless ``shared``) foreign tables and no store; or (option ``create``) it
            holds no store and ``create`` is false.
    """
    head = migrations[-1][0] if migrations else 0
    origin = migrations[0][1] if migrations else ""
    with (read or write).connect() as conn:
        _refuse(survey(conn), url=url, dialect=conn.dialect.name, shared=shared, create=create, origin=origin)
        version = current_version(conn)
        conn.rollback()
    if version is not None:
        _refuse_newer(version, head, url)
        if version == head:
            return version
        if not upgrade:
            raise StoreConfigError(
                f"database {url} has schema version {version}, older than the {head} of "
                f"graphflow-durable {__version__}, and was opened without migrating it; nothing was "
                "changed: check a migrated copy of it, or migrate it first (opening it with this version "
                "does; workers of an older version then refuse it)",
                url=url,
                option="migrate",
            )
    for number, description, function in migrations:
        with write.begin() as conn:
            _lock(conn)
            # Checked again under the lock: the database may have changed since the check above.
            _refuse(
                survey(conn), url=url, dialect=conn.dialect.name, shared=shared, create=create, origin=origin
            )
            found = current_version(conn)
            table = _version_table(sa.MetaData())
            table.create(conn, checkfirst=True)
            version = found or 0
            _refuse_newer(version, head, url)
            if version >= number:
                continue
            _log.info("migrating %s to schema version %d: %s", url, number, description)
            function(conn)
            conn.execute(
                table.insert().values(version=number, description=description, applied_at=time.time())
            )
    return head


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def _refuse_newer(version: int, head: int, url: str) -> None:
    if version > head:
        raise SchemaVersionError(
            f"database {url} has schema version {version}, but graphflow-durable {__version__} knows "
            f"schema versions up to {head}; upgrade graphflow-durable (pip install -U graphflow-durable) "
            "to open it, or point the store at another database",
            url=url,
            version=version,
            known_version=head,
        )
