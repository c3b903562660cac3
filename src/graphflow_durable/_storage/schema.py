"""SQLAlchemy Core tables: the single source of the schema the store reads and writes.

Every table name starts with ``graphflow_`` so the store can share a database with an application.
JSON values are stored as canonical JSON *text* (see ``_codec``), identical on both backends;
timestamps are float seconds since the epoch (``time.time()``).

Changing a table here requires a new migration in ``_migrations.py`` that brings an existing
database to the same shape; the migration test compares a migrated database with this metadata.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "FENCING_SEQUENCE",
    "agent_states",
    "call_records",
    "deaths",
    "declared_tables",
    "fencing_tokens",
    "input_requests",
    "key_checks",
    "messages",
    "metadata",
    "queue",
    "queue_settings",
    "queue_starts",
    "rate_limits",
    "runs",
    "schema_version",
    "steps",
]

metadata = sa.MetaData()

#: One row per applied migration; the schema version is the highest ``version``.
schema_version = sa.Table(
    "graphflow_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", sa.Double, nullable=False),
)

#: One row per run: its identity, its head, its lifecycle status and its lease.
runs = sa.Table(
    "graphflow_runs",
    metadata,
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
    # drawn from the store-wide counter (version 10: BIGINT; see fencing_tokens)
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
    # the run this one belongs to (a nested team's outer run, a fork's source; version 11: set
    # for the nested runs made before); deleting a run deletes the runs that name it, at any depth
    sa.Column("parent_run_id", sa.String, nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    # the holder's process identity, JSON {"boot", "pidns", "start"} (version 5; NULL: unknown)
    sa.Column("lease_process", sa.Text, nullable=True),
    # a cancel requested of the live driver, not yet honoured (version 7; NULL: none)
    sa.Column("cancel_requested_at", sa.Double, nullable=True),
    # the run's trace context, JSON {"root", "last"} of W3C traceparents (version 13; NULL: none)
    sa.Column("trace_context", sa.Text, nullable=True),
    # version 18: the run's content columns are sealed (true), so a store without the codec
    # never writes a plain row into it; NULL: plain (see _storage/sealing)
    sa.Column("sealed", sa.Boolean, nullable=True),
    sa.Index("graphflow_runs_status", "status"),
    sa.Index("graphflow_runs_parent", "parent_run_id"),
    # version 15: the leases held now, which a capped queue's claim counts
    sa.Index("graphflow_runs_lease", "lease_expires_at"),
    # version 17: the console's runs page, newest first, a keyset page at a time
    sa.Index("graphflow_runs_newest", "created_at", "run_id"),
)

#: One row per committed transition; ``seq`` 1 is the first commit, the run's head is the last.
steps = sa.Table(
    "graphflow_steps",
    metadata,
    sa.Column(
        "run_id",
        sa.String,
        sa.ForeignKey("graphflow_runs.run_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String, nullable=False),
    sa.Column("node", sa.String, nullable=True),
    sa.Column("scheduler", sa.Text, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    # CRC of the row's keys and content (version 6; NULL: written before, not checked); see _storage/checksum
    sa.Column("checksum", sa.BigInteger, nullable=True),
)

#: The thread: append-only, each message once, ``seq`` contiguous from 0 within a run.
messages = sa.Table(
    "graphflow_messages",
    metadata,
    sa.Column("run_id", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("step_seq", sa.Integer, nullable=False),
    sa.Column("published", sa.Boolean, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    # CRC of the row's keys and content (version 6; NULL: written before, not checked); see _storage/checksum
    sa.Column("checksum", sa.BigInteger, nullable=True),
    sa.ForeignKeyConstraint(
        ["run_id", "step_seq"],
        ["graphflow_steps.run_id", "graphflow_steps.seq"],
        ondelete="CASCADE",
        name="graphflow_messages_step",
    ),
)

#: Agent states as saved after a turn that changed them; every row is kept. A node's current
#: state is its latest whole row folded with the delta rows after it (see docs/state-format.md).
agent_states = sa.Table(
    "graphflow_agent_states",
    metadata,
    sa.Column("run_id", sa.String, primary_key=True),
    sa.Column("node", sa.String, primary_key=True),
    sa.Column("step_seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("body", sa.Text, nullable=False),
    # NULL: body is the whole state. 0: body is a splice of the empty text (a whole state whose
    # pieces may reference messages). Otherwise body is a delta against the row at this step.
    sa.Column("base_step", sa.Integer, nullable=True),
    # CRC of the row's keys and content (version 6; NULL: written before, not checked); see _storage/checksum
    sa.Column("checksum", sa.BigInteger, nullable=True),
    sa.ForeignKeyConstraint(
        ["run_id", "step_seq"],
        ["graphflow_steps.run_id", "graphflow_steps.seq"],
        ondelete="CASCADE",
        name="graphflow_agent_states_step",
    ),
)

#: Work for a worker pool (schema version 3): runs submitted to be started by a worker, and the
#: retry bookkeeping (attempts, back-off) of runs that failed under a worker. A submission has no
#: run row until a worker creates it; from then on the run's own lease governs who drives it.
queue = sa.Table(
    "graphflow_queue",
    metadata,
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
    sa.Column("claim_token", sa.BigInteger, nullable=False),  # from the counter too (version 10)
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    # the submitting call's W3C traceparent, the run's trace (version 13; NULL: none)
    sa.Column("trace_context", sa.Text, nullable=True),
    # version 14: a worker claims the run only while it drives nothing else, and claims nothing
    # else meanwhile (its driver could not tell its turn's crashes from another run's; NULL: no)
    sa.Column("run_alone", sa.Boolean, nullable=True),
    # version 15: flow control. The named queue the run belongs to (its settings: queue_settings),
    # its priority (lower first) and its partition key (NULL: none)
    sa.Column("queue", sa.String, nullable=False, server_default="default"),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("partition_key", sa.String, nullable=True),
    sa.Index("graphflow_queue_status", "status", "created_at"),
    sa.Index("graphflow_queue_team", "team"),
    sa.Index("graphflow_queue_order", "priority", "created_at"),
    sa.Index("graphflow_queue_claims", "claim_expires_at"),
)

#: The settings of the named queues (schema version 15): one row per configured queue, read by
#: every claim (``store.queue.configure``). NULL: no such limit. A queue with no row has none.
queue_settings = sa.Table(
    "graphflow_queue_settings",
    metadata,
    sa.Column("queue", sa.String, primary_key=True),
    sa.Column("concurrency", sa.Integer, nullable=True),
    sa.Column("worker_concurrency", sa.Integer, nullable=True),
    sa.Column("partition_concurrency", sa.Integer, nullable=True),
    sa.Column("rate_count", sa.Integer, nullable=True),
    sa.Column("rate_seconds", sa.Double, nullable=True),
    sa.Column("rate", sa.String, nullable=True),  # as given ("100/60s"), for reading back
    sa.Column("updated_at", sa.Double, nullable=False),
)

#: The recent claims of the queues that have a rate (schema version 15): one row per run start or
#: resumption, by the lease clock; a claim deletes its queue's rows older than the rate's period.
queue_starts = sa.Table(
    "graphflow_queue_starts",
    metadata,
    sa.Column("queue", sa.String, primary_key=True),
    sa.Column("started_at", sa.Double, primary_key=True),
    sa.Column("run_id", sa.String, primary_key=True),
)

#: Requests for human input (schema version 8): one row per input-function call of a turn in a
#: run, ``request_id`` ``"{node}/{step}"`` (``#n`` for a turn's n-th call). ``status`` ``pending``
#: until answered (``answered``; ``answered_by`` ``respond``, ``inline`` or ``default``), or
#: ``cancelled`` when the run was reset meanwhile.
input_requests = sa.Table(
    "graphflow_input_requests",
    metadata,
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
)

#: Model and tool calls made inside durable turns (schema version 12): one row per call recorded
#: (``outcome`` ``live``: made, ``result`` holds it) or replayed from a record (``replayed``: no
#: result, the usage it saved), ``seq`` 1, 2, 3... per run in write order. A turn's records are
#: found by its idempotency key (``turn_key``); ``discarded`` rows were voided by a later divergence
#: of their turn and are kept for audit. ``result`` is the wrappers' JSON text, opaque to the store.
call_records = sa.Table(
    "graphflow_call_records",
    metadata,
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
    # CRC of the row's keys and content, discarded flag included; see _storage/checksum
    sa.Column("checksum", sa.BigInteger, nullable=False),
    sa.Index("graphflow_call_records_turn", "run_id", "turn_key"),
)

#: Which process a run died with (schema version 14): one row per takeover of a run left
#: ``running`` by a holder (host, pid, process identity) other than the new one, at the run's head
#: then. The runs a dead process held are those still leased to it and those with a row naming it:
#: the other runs whose turns were in flight when it died (see docs/retries.md, "Crash loops in a
#: pool"). Rows older than a week are deleted as new ones are written.
deaths = sa.Table(
    "graphflow_deaths",
    metadata,
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
)

#: Model-provider rate limits shared by every process (schema version 16): one row per key, its
#: budget as two schedules (GCRA): ``request_at``, the earliest time the key's next call may start
#: (each call moves it ``60 / requests_per_minute`` s on), and ``token_at``, the same for tokens
#: (each call moves it its tokens' share of a minute on, estimated first, corrected after). A call
#: starts at the latest of both, now and ``paused_until`` (a provider's ``Retry-After``). The
#: ``window_*`` columns count the calls and tokens of the minute that began at ``window_start``
#: (``limits list``). See ``_storage/ratelimits.py``.
rate_limits = sa.Table(
    "graphflow_rate_limits",
    metadata,
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
)

#: The key check values (schema version 18): one row per key id that sealed a value in this store,
#: a short non-secret digest of the key (``Codec.check_value``), written the first time the key
#: seals. A key of the same id whose digest differs is the wrong key, not a damaged row.
key_checks = sa.Table(
    "graphflow_key_checks",
    metadata,
    sa.Column("key_id", sa.String, primary_key=True),
    sa.Column("check_value", sa.String, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

#: Where fencing tokens come from (schema version 10): one store-wide counter, so that a token never
#: repeats for a run id, not even after the run was deleted and a run of that id made again (created,
#: imported, forked): a driver that still holds a token of the deleted run can never commit to the
#: new one. SQLite (no sequences; one writer at a time anyway): the one row of this table, the last
#: token issued. PostgreSQL: the sequence :data:`FENCING_SEQUENCE` instead, which concurrent
#: transactions draw from without waiting for each other's commits.
fencing_tokens = sa.Table(
    "graphflow_fencing_tokens",
    metadata,
    sa.Column("last_token", sa.BigInteger, nullable=False),
    info={"dialects": ("sqlite",)},
)

#: PostgreSQL's counter of fencing tokens (made by migration 9, not by this metadata).
FENCING_SEQUENCE = sa.Sequence("graphflow_fencing_tokens")


def declared_tables(dialect: str) -> list[sa.Table]:
    """The tables a store on ``dialect`` (``"sqlite"``, ``"postgresql"``) has, in dependency order."""
    return [table for table in metadata.sorted_tables if dialect in table.info.get("dialects", (dialect,))]
