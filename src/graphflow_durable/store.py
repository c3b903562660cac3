"""The run store: the only code that runs SQL. It knows nothing of AutoGen beyond JSON.

A run is an append-only log of *steps* (one per committed transition), each carrying the
messages it added to the thread, the scheduler state after it, and the agent states it saved.
Every public writing method is one transaction guarded by the run's expected head sequence
number and its lease fencing token: a stale writer gets :class:`ConflictError` (or
:class:`LeaseLostError`) and nothing is written.

The value objects (:class:`Step`, :class:`MessageRecord`, :class:`RunLog`, ...) are defined in
``_model.records`` and exported from here; import them from ``graphflow_durable.store``. The
worker-pool queue is an object the store holds, :attr:`Store.queue` (a :class:`WorkQueue`:
``store.queue.submit(...)``, ``store.queue.claim(...)``...), on the store's engines.

:class:`Store` is one class: it opens and closes the store and holds its helpers (the commit
writer, the work queue, the input requests, the call records, over one set of engines); its methods, grouped as runs,
history, operations and human input, are thin calls into ``_storage``. What a run's driver calls
(commits, new runs, leases) is the private driver object it holds (``_storage/driver.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.history import StepInfo, step_infos, transcript_of
from graphflow_durable._model.human import InputRequest
from graphflow_durable._model.records import (
    ENDED_STATUSES,
    FIRST_FENCING_TOKEN,
    RUN_STATUSES,
    AgentStateRecord,
    CallRecord,
    CallSummary,
    MessageRecord,
    RunLog,
    RunRecord,
    RunStatus,
    RunUpdate,
    Step,
    StepKind,
    StepRecord,
    StoredMessage,
)
from graphflow_durable._storage import admin, deaths
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.admin import Cancellation, Progress, Removal, Retry, StoreStats, Supply
from graphflow_durable._storage.calls import CallRecords
from graphflow_durable._storage.checksum import Damage
from graphflow_durable._storage.document import from_document, to_document
from graphflow_durable._storage.driver import Driver
from graphflow_durable._storage.engine import guarded, open_engines, peek_sqlite, read_row
from graphflow_durable._storage.flowcontrol import DEFAULT_QUEUE, QueueSettings, check_queue_name
from graphflow_durable._storage.follow import Feeds, Follow, check_after
from graphflow_durable._storage.keychecks import store_sealer
from graphflow_durable._storage.lease import Heartbeat
from graphflow_durable._storage.listing import RunPage, open_requests, page, status_counts
from graphflow_durable._storage.migrations import (
    Survey,
    current_version,
    holds_store,
    no_store,
    refuse_unowned,
    survey,
)
from graphflow_durable._storage.migrations import migrate as migrate_schema  # Store(migrate=)
from graphflow_durable._storage.ratelimits import LimitState, RateBudgets
from graphflow_durable._storage.reading import Verification, read_log, read_steps, scan_run
from graphflow_durable._storage.rekey import Rekeyed, SealAudit
from graphflow_durable._storage.rekey import audit as audit_rows
from graphflow_durable._storage.rekey import rekey as rekey_rows
from graphflow_durable._storage.requests import InputRequests
from graphflow_durable._storage.schema import runs
from graphflow_durable._storage.sealedexport import unseal
from graphflow_durable._storage.transfer import fork_run, read_cut, read_rows, write_rows
from graphflow_durable._storage.workqueue import Claim, Submission, WorkQueue
from graphflow_durable._storage.writer import CommitWriter
from graphflow_durable.crypto import Codec

__all__ = [
    "ENDED_STATUSES",
    "FIRST_FENCING_TOKEN",
    "RUN_STATUSES",
    "AgentStateRecord",
    "CallRecord",
    "CallRecords",
    "CallSummary",
    "Cancellation",
    "Claim",
    "Damage",
    "Follow",
    "Heartbeat",
    "InputRequest",
    "InputRequests",
    "LimitState",
    "MessageRecord",
    "Progress",
    "RateBudgets",
    "Removal",
    "Retry",
    "RunLog",
    "RunPage",
    "RunRecord",
    "RunStatus",
    "RunUpdate",
    "Step",
    "StepInfo",
    "StepKind",
    "StepRecord",
    "Store",
    "StoreStats",
    "StoredMessage",
    "Submission",
    "Supply",
    "QueueSettings",
    "DEFAULT_QUEUE",
    "check_queue_name",
    "Verification",
    "WorkQueue",
]


class Store:
    """Runs, steps, messages, agent states and leases over SQLAlchemy 2.x Core.

    Opening a store creates or migrates the schema (see ``_migrations``); a database written by a
    newer graphflow-durable is refused with :class:`SchemaVersionError`. With ``create=False`` it
    only opens a store that exists (what a tool that reads runs wants: a mistyped path is refused
    instead of becoming a new, empty store). A store is safe to share
    between threads. Every method that writes runs one transaction; database and driver errors are
    raised as :class:`StoreError` with the cause chained.

    Leases: a run is driven by one worker at a time, fenced by a token drawn on every acquisition.
    What a run's driver calls (new runs, commits, leases) is not on this class: the runtime reaches
    it through the store's private driver object (``_storage/driver.py``).

    The worker-pool queue is :attr:`queue`, the requests for human input :attr:`requests`, the
    recorded model and tool calls :attr:`calls`, the shared rate limits :attr:`limits`: held by the
    store on the same engines.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///path.db`` (embedded, the default backend),
            ``sqlite://`` (in memory, shared across threads), or ``postgresql://...``
            (psycopg 3; ``postgresql+psycopg://`` also accepted). Its query may carry the options
            below (``sqlite:///runs.db?synchronous=NORMAL``) and driver options (SQLite
            ``timeout``, ``cached_statements``; PostgreSQL any libpq connection parameter such
            as ``connect_timeout`` or ``application_name``); see docs/store-urls.md.
        synchronous: SQLite ``PRAGMA synchronous`` (``"FULL"`` default, or ``"NORMAL"``, ``"OFF"``,
            ``"EXTRA"``). ``None``: the URL's ``synchronous``, else ``"FULL"``.
        pool_pre_ping: PostgreSQL: test each pooled connection before use (survives server restarts;
            costs one extra round trip per operation, measured at 0.02-0.08 ms on a local server).
            ``None``: the URL's ``pool_pre_ping``, else true.
        shared: let the store create its ``graphflow_*`` tables in a database (PostgreSQL: the
            schema on the search path) that already holds other tables. Without it such a database
            is refused, and nothing is created in it; a database that already holds a store opens
            either way. ``None``: the URL's ``shared``, else false.
        create: create the store when the database holds none (the default). ``False``: refuse a
            database without a store, creating nothing: a SQLite file that does not exist (or
            holds no store, or an in-memory database), a PostgreSQL database (schema) without the
            store's tables. A store at an older schema version is migrated either way, unless
            ``migrate`` is false.
        codec: seal every content column (message bodies, agent states, tasks, results, call
            records, prompts and answers) with it, bound to its row (``AESGCMCodec(Keys.from_env())``;
            docs/encryption.md). ``None``: store them plain; a sealed row is then refused,
            naming its key id.
        allow_plaintext: with a codec, also read plain content rows (the migration window, while
            ``runs rekey --encrypt`` seals an existing store); without it a plain row is refused.
        migrate: bring a store at an older schema version to this version's (the default).
            ``False``: refuse it (:class:`StoreConfigError`, ``option`` ``"migrate"``), for a
            look that must change nothing (``graphflow-durable check`` before a deploy: the old
            workers still run on the old schema).

    Raises:
        StoreConfigError: (a ``ValueError`` and a :class:`StoreError`) the URL is malformed or
            unsupported, its query has an unknown option or a bad value, or an argument and the
            same option in the URL disagree. A keyword argument for the other backend is ignored.
            Also (``option == "shared"``) when the database holds other tables and no store, and
            ``shared`` is not set; and (``option`` ``None``) when it holds tables named like the
            store's that the store did not create (``graphflow_runs`` and no version table, or a
            version table it did not write), ``shared`` or not. Nothing was created or changed
            (a SQLite file is left byte for byte as it was).
            Also (``option == "create"``) when ``create`` is false and the database holds no
            store; nothing was created.
            Also (``option == "migrate"``) when ``migrate`` is false and the store's schema is
            older than this version's; nothing was changed.
        StoreError: the database could not be opened or migrated.
    """

    def __init__(
        self,
        url: str,
        *,
        synchronous: str | None = None,
        pool_pre_ping: bool | None = None,
        shared: bool | None = None,
        create: bool = True,
        migrate: bool = True,
        codec: Codec | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        engines = open_engines(url, synchronous=synchronous, pool_pre_ping=pool_pre_ping, shared=shared)
        if codec is not None:
            sealer = store_sealer(engines, codec, allow_plaintext=allow_plaintext)
            engines = dataclasses.replace(engines, sealer=sealer)
        self._e = engines
        self._writer = CommitWriter(self._e)
        self._driver = Driver(self._e, self._writer)  # the runtime's way in: commits, new runs, leases
        self._queue = WorkQueue(self._e)
        self._requests = InputRequests(self._e)
        self._calls = CallRecords(self._e)
        self._limits = RateBudgets(self._e)
        self._feeds = Feeds(self._e)  # the live feeds of the runs followed (Store.follow)
        shared = self._e.target.shared
        try:
            with self._guard("opening the store"):
                # Before the engine connects (that would create a missing SQLite file, and turn an
                # existing one to WAL): a refused file is left as it was. migrate_schema() checks again,
                # on both backends.
                found = peek_sqlite(self._e.target, survey)
                if not create:
                    self._refuse_no_sqlite_store(found)
                if found is not None:
                    refuse_unowned(found, url=self._e.url, dialect=self._e.dialect, shared=shared)
                self._version = migrate_schema(
                    self._e.migrate,
                    read=self._e.read,
                    url=self._e.url,
                    shared=shared,
                    create=create,
                    upgrade=migrate,
                )
            if codec is not None:  # a wrong active key is refused now, and its check value kept
                self._e.sealer.verify_key(codec.active, keep=True)
        except BaseException:
            self._e.engine.dispose()
            raise

    def _refuse_no_sqlite_store(self, found: Survey | None) -> None:
        """SQLite, opened with ``create=False``: refuse a file that does not exist or holds no store
        (``found``: what :func:`peek_sqlite` read of it) without connecting the engine (PostgreSQL,
        and a file this cannot read: ``migrate`` checks)."""
        target = self._e.target
        path = target.engine_url.database
        if target.dialect != "sqlite":
            return
        if path in (None, "", ":memory:"):
            raise no_store(self._e.url, "an in-memory database starts empty")
        if not Path(path).exists():
            raise no_store(self._e.url, "the file does not exist")
        if found is not None and not holds_store(found.tables):
            raise no_store(self._e.url, "the file holds no graphflow-durable store")

    @property
    def codec(self) -> Codec | None:
        """The codec the store seals its content columns with (``None``: it stores them plain)."""
        return self._e.sealer.codec

    def _guard(self, action: str, run_id: str | None = None) -> AbstractContextManager[None]:
        """Serialise (in-memory SQLite only) and turn database errors into :class:`StoreError`."""
        return guarded(self._e, action, run_id=run_id)

    @property
    def queue(self) -> WorkQueue:
        """The worker-pool queue of this store: submit runs, claim work, release claims, record failures."""
        return self._queue

    @property
    def requests(self) -> InputRequests:
        """The requests for human input of this store's runs (record, read, answer, cancel)."""
        return self._requests

    @property
    def calls(self) -> CallRecords:
        """The recorded model and tool calls of this store's runs (record, replay, discard, list)."""
        return self._calls

    @property
    def limits(self) -> RateBudgets:
        """The model-provider rate limits every process shares (``graphflow_durable.rate_limited``)."""
        return self._limits

    @property
    def url(self) -> str:
        """The database URL with its password hidden."""
        return self._e.url

    @property
    def config_url(self) -> str:
        """The URL to write into a configuration: as given, without the password, with the options.

        The package's options are in the query when they differ from their defaults, whether they
        were given in the URL or as arguments (``Store("sqlite:///a.db", synchronous="NORMAL")``
        gives ``"sqlite:///a.db?synchronous=NORMAL"``); driver options are kept; the password, and
        any secret libpq parameter (``password``, ``sslpassword``...), is left out, the user name
        kept. ``Store(store.config_url)`` opens the same database with the same options, given the
        password from elsewhere (PostgreSQL: ``PGPASSWORD`` or ``~/.pgpass``): see
        :attr:`has_password`. A relative SQLite path stays relative.
        """
        return self._e.target.config_url

    @property
    def has_password(self) -> bool:
        """Whether the URL carried a password (or secret libpq parameter) that :attr:`config_url` omits."""
        return self._e.target.has_password

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._e.dialect

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._writer.closed

    def close(self) -> None:
        """Write the commits already handed over, then close every pooled connection. The store
        must not be used afterwards."""
        self._writer.close()
        self._e.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def schema_version(self) -> int:
        """The database's schema version (the number of the last migration applied)."""
        with self._guard("reading the schema version"), self._e.read.connect() as conn:
            return current_version(conn) or 0

    # Runs: create, read, list; a run's log read back and checked.

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's row (content sealed with a key not held: a ``SealedValue``), or ``None``."""
        select = S.HotPath.for_dialect(self._e.engine.dialect).select_run
        with self._guard(f"reading run {run_id}", run_id):
            row = read_row(self._e, select.sql, select.bind({"p_run_id": run_id}))
        return None if row is None else S.run_record(row, self._e.sealer, mark=True)

    def list_runs(self, status: str | Sequence[str] | None = None) -> list[RunRecord]:
        """Runs in creation order, optionally only those with the given status(es)."""
        query = sa.select(runs).order_by(runs.c.created_at, runs.c.run_id)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            query = query.where(runs.c.status.in_(wanted))
        with self._guard("listing runs"), self._e.read.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [S.run_record(row, self._e.sealer, mark=True) for row in rows]

    def list_runs_page(
        self,
        *,
        status: Sequence[str] | None = None,
        text: str | None = None,
        parent: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """A page of runs, newest first (``created_at``, then run id), with each run's queue row,
        pending requests and rounds, read in one transaction; keyset-paginated: ``after`` is the
        ``next`` cursor of the page before (``None``: the first page). ``status``: only these
        statuses; ``text``: only run ids containing it; ``parent``: only the runs nested in (or forked
        from) that run.

        Raises:
            UsageError: a malformed cursor, an unknown status, ``limit`` not in 1..500.
        """
        with self._guard("listing runs"), self._e.read.begin() as conn:
            return page(
                conn, status=status, text=text, parent=parent, after=after, limit=limit, sealer=self._e.sealer
            )

    def run_counts(self) -> dict[str, int]:
        """Runs per status (every status, 0 included): cheaper than :meth:`stats`."""
        with self._guard("counting runs"), self._e.read.begin() as conn:
            return status_counts(conn)

    def open_requests(self, limit: int = 500) -> list[InputRequest]:
        """The pending requests for human input of every run, oldest first (at most ``limit``)."""
        with self._guard("listing the open input requests"), self._e.read.begin() as conn:
            return open_requests(conn, limit, self._e.sealer)

    def driver_deaths(self, run_id: str) -> list[deaths.Death]:
        """The takeovers of ``run_id`` from a driver that left it ``running`` (it died, or stalled
        past its lease), in time order: the run's head then, that driver's host and pid, the time.
        Kept a week (see docs/retries.md, "Crash loops in a pool"); empty for an unknown run."""
        with self._guard(f"reading the driver deaths of run {run_id}", run_id), self._e.read.begin() as conn:
            return deaths.of_run(conn, run_id)

    def lease_clock(self) -> float:
        """The time leases are judged by, now (epoch seconds): the database server's clock on
        PostgreSQL, this host's on SQLite. Compare a run's ``lease_expires_at`` with it."""
        with self._guard("reading the lease clock"), self._e.read.begin() as conn:
            return S.lease_clock(conn, time.time())

    def load(self, run_id: str) -> RunLog:
        """Everything needed to resume ``run_id``, read in one consistent transaction.

        Every step, message and agent-state row read is checked against the checksum stored with
        it (rows written before schema version 6 have none and are not checked).

        Raises:
            RunNotFoundError: no such run.
            StoreCorruptError: a row does not match its checksum, a step or message row is
                missing (or stored beyond the run's head or message count), or the agent-state rows
                do not fold; the error names the run, table, step and message seq or node.
        """
        with self._guard(f"loading run {run_id}", run_id), self._e.read.begin() as conn:
            return read_log(conn, run_id, self._e.url, sealer=self._e.sealer)

    def load_steps(self, run_id: str) -> RunLog:
        """The run's row, its steps and its head's scheduler, each row checked as :meth:`load`
        checks it, in one transaction: a :class:`RunLog` without its messages and agent states
        (what the console reads to draw its nodes' states, much cheaper than :meth:`load`).

        Raises:
            RunNotFoundError: no such run.
            StoreCorruptError: a step row does not match its checksum, or one is missing.
        """
        with self._guard(f"loading the steps of run {run_id}", run_id), self._e.read.begin() as conn:
            return read_steps(conn, run_id, self._e.url, sealer=self._e.sealer)

    def verify(self, run_ids: Sequence[str] | None = None) -> Verification:
        """Check every step, message, agent-state and call-record row of the runs (default: every run)
        against its checksum, check that none of their steps and messages is missing, and report the damaged
        rows and gaps instead of raising. Each run is read in its own transaction. Rows written
        before schema version 6 have no checksum: counted, not checked. Checksums are over the
        stored text, so a sealed store is verified without its keys (:meth:`audit_sealing` opens
        every sealed value).

        Raises:
            RunNotFoundError: one of ``run_ids`` does not exist (nothing is reported then).
        """
        with self._guard("listing runs"), self._e.read.begin() as conn:
            known = conn.execute(
                sa.select(runs.c.run_id).order_by(runs.c.created_at, runs.c.run_id)
            ).scalars()
            every = [str(run_id) for run_id in known]
        ids = every if run_ids is None else list(dict.fromkeys(run_ids))
        if missing := [run_id for run_id in ids if run_id not in set(every)]:
            raise S.not_found(missing[0])
        scans = []
        for run_id in ids:
            with self._guard(f"verifying run {run_id}", run_id), self._e.read.begin() as conn:
                scans.append(scan_run(conn, run_id))
        return Verification.of(ids, scans)

    # History, time travel, fork, export and import (built on load).

    def history(self, run_id: str, *, round: int | None = None, node: str | None = None) -> list[StepInfo]:
        """The run's steps in order (:class:`StepInfo`: seq, round, kind, node, attempt, time, the
        messages each added), only those of round ``round`` and/or node ``node`` if given. Read
        with every row checked, as :meth:`load` reads.

        Raises:
            RunNotFoundError: no such run.
        """
        infos = step_infos(self.load(run_id))
        return [i for i in infos if (round is None or i.round == round) and (node is None or i.node == node)]

    def transcript(
        self, run_id: str, *, round: int | None = None, node: str | None = None
    ) -> list[StoredMessage]:
        """The run's thread (message dumps) in order, only round ``round`` (see :meth:`history`)
        and/or the answers of node ``node`` if given. :meth:`DurableGraphFlow.transcript` gives them
        as AutoGen message objects.

        Raises:
            RunNotFoundError: no such run.
        """
        return transcript_of(self.load(run_id), round, node)

    def call_history(
        self, run_id: str, *, round: int | None = None, node: str | None = None
    ) -> list[CallRecord]:
        """The run's recorded model and tool calls in write order (``runs history --calls``): every
        record, live, replayed and discarded alike, each checked against its checksum; only those of
        turns dispatched in round ``round`` and/or of node ``node`` if given. What they sum to is
        ``store.calls.summary(run_id)``.

        Raises:
            RunNotFoundError: no such run.
        """
        if self.get_run(run_id) is None:
            raise S.not_found(run_id)
        records = [r for r in self._calls.list(run_id) if node is None or r.node == node]
        if round is not None:
            rounds = {info.seq: info.round for info in self.history(run_id)}
            records = [r for r in records if rounds.get(r.step) == round]
        return records

    def follow(self, run_id: str, after_seq: int | None = None, *, wait: bool = True) -> Follow:
        """The run's messages with a seq greater than ``after_seq`` (all, the task's seq 0 included,
        when ``None``), in seq order, as :class:`StoredMessage` (what :meth:`transcript` returns);
        then, with ``wait``, each new commit's messages as it lands, until the run is no longer
        driven: its round stopped or finished, it parked ``waiting`` for a person, or it ended
        interrupted, failed or cancelled. A run in any status but ``running`` yields what is stored
        and stops at once (so does every run with ``wait=False``). A run whose driver died stays
        ``running`` until a driver takes it over: the iteration waits for that driver's commits.

        Read-only and from any process: no lease, any number of followers. An async iterator:
        ``async for message in store.follow(run_id, 3): ...``. Its ``run`` attribute is the run's row
        once the iteration ended (its status and stored result, read with the last messages).
        The followers of a run in one process share one reader of its new commits (a watcher costs
        the reads of what it missed, then nothing of its own). PostgreSQL: commits notify that reader
        (LISTEN/NOTIFY, on one connection of its own outside the pool, falling back to polling);
        SQLite: it polls, backing off to 0.5 s while the run is quiet. Either way it reads at most
        every 50 ms, in batches, while commits come. :meth:`DurableGraphFlow.attach_stream` gives AutoGen message objects.

        Raises (from the iteration):
            UsageError: ``after_seq`` is not ``None`` or a whole number >= 0.
            RunNotFoundError: no such run; or the run was deleted while it was followed, also
                when another run was made under its id since (known by its ``created_at``): its
                messages are never spliced into the iteration.
            StoreCorruptError: a message row does not match its checksum, or one is missing.
        """
        check_after(after_seq)  # at the call, not at the first iteration
        return Follow(self._feeds, run_id, after_seq, wait=wait)

    def cut(self, run_id: str, at: int) -> RunLog:
        """The run as it stood once step ``at`` was committed: its steps, messages and agent states
        up to that step, the step's scheduler state, and the run's row as it was then (status from
        the step; the stop reason only at the head). What ``save_state(at=...)`` renders and
        :meth:`fork` starts from. Read in one transaction, every row checked.

        Raises:
            RunNotFoundError: no such run.
            UsageError: ``at`` is not one of the run's steps (1 to its head).
        """
        with self._guard(f"reading run {run_id} at step {at}", run_id), self._e.read.begin() as conn:
            return read_cut(conn, run_id, at, self._e.url, self._e.sealer)

    def fork(
        self,
        run_id: str,
        at: int,
        *,
        new_run_id: str | None = None,
        replace: tuple[int, Mapping[str, Any]] | None = None,
    ) -> RunRecord:
        """Start a new run from the cut at step ``at`` of ``run_id``; return the new run's row.

        The new run (id ``new_run_id``, default ``"<run_id>-fork-<8 hex digits>"``) holds a copy of
        the source's steps, messages and agent states up to ``at``, and the recorded calls of the turns
        completed by then (a turn in flight at ``at`` runs again as the new run's own turn, and calls
        out again: its records stay with the source), the source only read; its
        ``parent_run_id`` is ``run_id``, nobody holds its lease (its fencing token is a new one, as
        every run's), and its status is the step's:
        ``interrupted`` mid-round (``run()`` with no task, on a team built with
        ``run_id=new_run_id``, resumes it: the nodes in flight at that step run again, then what
        follows), ``stopped`` or ``finished`` when the step ended its round. One transaction.

        ``replace=(seq, message)`` ("the node should have said this"): message ``seq`` of the cut,
        a node's text answer, is replaced by ``message`` (a dump whose ``source`` is that node), and
        the new run starts just after the step that recorded the answer: everything after it runs
        again. That step's scheduler state is kept, so the answer must not have decided anything
        there: refused when the node's edges have conditions or the step ended the round. In the
        node's own state saved at that turn, the old answer's text is replaced by the new one. The
        termination condition is not asked again about the batch the answer belonged to.

        Raises:
            RunNotFoundError: no such run.
            UsageError: ``at`` is out of range, ``new_run_id`` is not a valid run id, or the
                replacement is refused (see above).
            RunLockedError: ``at`` is the head of a run a live process drives (its nodes in flight
                are running there); fork at an earlier step, or once the run has ended.
            ConflictError: a run ``new_run_id`` exists already.
        """
        with self._guard(f"forking run {run_id} at step {at}", run_id), self._e.write.begin() as conn:
            return fork_run(conn, run_id, at, new_run_id, self._e.url, replace, self._e.sealer)

    def export_run(self, run_id: str, *, decrypt: bool = False) -> dict[str, Any]:
        """The run as one JSON document: its row (without the lease), steps, messages, agent-state
        rows and recorded calls, read in one transaction with every row checked. :meth:`import_run` reads it back,
        into this store or another (SQLite or PostgreSQL). The document (``"version": 2``) carries a
        checksum on the run object and on every row, so an edited export is refused on import.
        Sealed rows are written as stored (``"version": 3``: importable into a store holding the
        keys), or opened with ``decrypt`` (a plain version 2 document).

        Raises:
            RunNotFoundError: no such run.
            StoreCorruptError: a row does not match its checksum.
        """
        with self._guard(f"exporting run {run_id}", run_id), self._e.read.begin() as conn:
            rows = read_rows(conn, run_id, self._e.url, sealer=self._e.sealer if decrypt else None)
            return to_document(rows, current_version(conn) or 0)

    def import_run(self, document: Mapping[str, Any], *, run_id: str | None = None) -> RunRecord:
        """Write a run exported by :meth:`export_run` (as ``run_id`` if given) in one transaction;
        return its row. Nobody holds its lease, and its fencing token is a new one (a driver the
        exported run still had can never commit to it); a run exported while ``running`` (or
        ``waiting`` for a person: its requests are not exported, the node asks again) is imported
        as ``interrupted``, so ``run()`` resumes it here. Its recorded calls come with it, so its
        in-flight turn replays them here (under a new ``run_id``, their turn keys name the new run,
        as the turn itself does).

        The whole document is checked before anything is written (see ``_storage/document.py``):
        field types, times, numbering, references between steps and messages, every message body
        through AutoGen's message factory, the head's scheduler state through the scheduler's
        parser, agent-state rows folded, nesting depth (at most 500 levels) and, in a version 2
        document, every checksum (a version 1 document has none). The run is also read back before
        the transaction commits, as a resume reads it.

        Raises:
            UsageError: the document is not a run export or fails a check (the message names the
                first bad field as a path: ``steps[3].node``); ``run_id`` is not a valid run id.
            ConflictError: a run with its id exists already in this store.
        """
        document = unseal(document, self._e.sealer, "the document")  # a sealed export: needs the keys
        rows = from_document(document, "the document", run_id)
        new_id = rows.run["run_id"]
        with self._guard(f"importing run {new_id}", new_id), self._e.write.begin() as conn:
            return write_rows(conn, rows, rows.run, self._e.url, self._e.sealer).run

    # Operations on runs from any process: cancel, retry, delete, prune, stats, progress.

    def cancel_run(self, run_id: str) -> Cancellation:
        """Cancel a run, from any process.

        A run a live driver holds gets a cancel *request*: the driver learns of it in its next
        commit (the head move reads it: no statement of its own) or lease renewal (every third of
        its lease period), whichever comes first, so it stops before its next dispatch; it lets
        the agents already running answer (recorded as usual), and records the run ``cancelled``.
        A round whose last turn was dispatched already ends on its own (``finished``,
        ``stopped``): it keeps the request, and ``RunRecord.ended_before_cancel`` (``runs show``:
        "finished before the cancel took effect") says so until another round takes the lease. A
        pending request is honoured by whichever driver holds the run next (the
        one asked may die first). A run nobody holds (interrupted, failed, or whose driver's lease
        ran out) is ``cancelled`` at once, no step written, its fencing token moved on. ``run()``
        with no task resumes a cancelled run; worker pools do not claim it until :meth:`retry_run`.

        Raises:
            RunNotFoundError: no such run.
            RunStateError: the run's last round ended (``stopped``, ``finished``): nothing to cancel.
        """
        with self._guard(f"cancelling run {run_id}", run_id), self._e.write.begin() as conn:
            return admin.cancel(conn, run_id, time.time())

    def retry_run(self, run_id: str) -> Retry:
        """Queue a failed, cancelled or interrupted run again for the worker pool: a cancelled run
        becomes ``interrupted`` (claimable), and the retry back-off of its queue row is cleared (the
        failure count is kept). A request for human input whose deadline passed with no default
        answer (``InputDeadlineError``: the pool leaves such a failed run alone) gets a new deadline,
        as long as its first, and is asked again (``Retry.asked_again``). Works on a submission
        whose run was never created, too.

        Raises:
            RunNotFoundError: no such run or submission.
            RunLockedError: a live driver holds the run (nothing to retry).
            RunStateError: the run's last round ended (``stopped``, ``finished``).
        """
        with self._guard(f"retrying run {run_id}", run_id), self._e.write.begin() as conn:
            return admin.retry(conn, run_id, time.time(), self._e.sealer)

    def supply_output(self, run_id: str, node: str, text: str) -> Supply:
        """Write the answer of the node a failed run failed on, so that the run continues without it.

        Accepted only when the run is ``failed`` because ``node``'s budget ran out (its retries, a
        timeout, or ``max_crash_attempts``: the ``node_failed`` marker of its result names the node).
        ``text`` becomes a ``TextMessage`` from ``node``, recorded as that node's completion: one
        ``complete`` step whose data is ``{"supplied": true}`` (``runs history`` prints "supplied"),
        moving the scheduler exactly as the node's own answer would (its edges' counts, the nodes
        they enqueue; its turn's failure and crash counts cleared). The run becomes ``interrupted``,
        its marker cleared: ``run()`` with no task (or a pool worker) continues it with the next ready
        node. The node's agent keeps the state stored at its dispatch (no turn of it ran). When the
        answer was the last of its batch, the resume decides the batch's end (the team's termination
        condition sees it, ``max_turns`` counts it) before it selects the next nodes.

        One transaction under the run's lock; the run's fencing token is replaced, so a driver that
        held the run before can no longer commit to it. Everything is checked before anything is
        written. Returns the :class:`Supply`: the step's number, the answer's ``seq`` in the message
        log, the run's status, the nodes ready next.

        Raises:
            UsageError: ``text`` is not text, is empty, or holds a NUL or a lone surrogate; ``node``
                is not the node the run failed on (the message names that one); or the node's edges
                have a callable condition (only its team can evaluate it: retry the node instead).
            RunNotFoundError: no such run.
            RunStateError: the run is not ``failed``, or failed without a ``node_failed`` marker (an
                error with no retry policy: ``run()`` resumes it and the node runs again).
            RunLockedError: a live driver holds the run.
        """
        with (
            self._guard(f"supplying node {node}'s answer to run {run_id}", run_id),
            self._e.write.begin() as conn,
        ):
            return admin.supply(conn, run_id, node, text, time.time(), self._e.url, self._e.sealer)

    def delete_run(self, run_id: str, *, force: bool = False, dry_run: bool = False) -> Removal:
        """Delete a run and everything of it, in one transaction: its steps, messages, agent states,
        queue row, and its nested runs (those whose ``parent_run_id`` is it, at any depth: the runs
        nested durable teams drove inside its turns, and its forks). A submission whose run
        was not created yet is deleted too. ``dry_run``: count, remove nothing.

        Raises:
            RunNotFoundError: no such run or submission.
            RunStateError: it (or a nested run) is ``running`` or held by a live driver, and
                ``force`` is false. With ``force`` it is deleted anyway; its driver fails on its next
                write (:class:`RunNotFoundError`) and writes nothing.
        """
        engine = self._e.read if dry_run else self._e.write
        with self._guard(f"deleting run {run_id}", run_id), engine.begin() as conn:
            return admin.delete(conn, run_id, time.time(), force=force, dry_run=dry_run)

    def prune(
        self,
        *,
        older_than: float,
        status: str | Sequence[str] = "finished",
        dry_run: bool = True,
        force: bool = False,
    ) -> Removal:
        """Retention: delete the runs with ``status`` (default ``finished``) last updated more than
        ``older_than`` seconds ago, each with its nested runs, as :meth:`delete_run` does.

        A dry run by default: it returns what would be removed and removes nothing; pass
        ``dry_run=False`` to delete. Runs ``running`` or held by a live driver are skipped (listed
        in ``skipped``) unless ``force``; naming ``status="running"`` needs ``force``.

        Raises:
            UsageError: an unknown status, or ``older_than`` negative or not finite.
            RunStateError: ``status`` includes ``running`` and ``force`` is false.
        """
        statuses = [status] if isinstance(status, str) else list(status)
        admin.check_prune(statuses, older_than, force)
        engine = self._e.read if dry_run else self._e.write
        with self._guard("pruning runs"), engine.begin() as conn:
            return admin.prune(conn, statuses, older_than, time.time(), force=force, dry_run=dry_run)

    def rekey(
        self,
        run_ids: Sequence[str] | None = None,
        *,
        to: str | None = None,
        encrypt: bool = False,
        batch: int = 200,
    ) -> Rekeyed:
        """Re-seal the runs' content (default: all, submissions too) under key ``to`` (default: the
        active key), plain rows too with ``encrypt``, ``batch`` rows per transaction, while workers
        drive them; killed, every row opens under the old key or the new (``_storage/rekey.py``).
        Raises StoreConfigError (no codec, no key ``to``, not a row's key), StoreCorruptError (a
        sealed row does not open), RunNotFoundError (an unknown run id)."""
        with self._guard("re-sealing rows"):
            return rekey_rows(self._e, self._e.sealer, run_ids, to=to, encrypt=encrypt, batch=batch)

    def audit_sealing(self, run_ids: Sequence[str] | None = None, *, open_values: bool = False) -> SealAudit:
        """Sealed and plain content values per table and key; ``open_values``: open each (keys needed)."""
        with self._guard("auditing sealed rows"), self._e.read.begin() as conn:
            return audit_rows(conn, self._e.sealer, run_ids, open_values=open_values)

    def stats(self) -> StoreStats:
        """Runs per status, submissions waiting for a worker, and rows and bytes per table."""
        with self._guard("reading the store's statistics"), self._e.read.begin() as conn:
            return admin.stats(conn)

    def progress(self, run_id: str) -> Progress:
        """How many rounds the run began, and its head step's kind, node and time.

        Raises:
            RunNotFoundError: no such run.
        """
        with self._guard(f"reading run {run_id}", run_id), self._e.read.begin() as conn:
            row = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first()
            if row is None:
                raise S.not_found(run_id)
            return admin.progress(conn, run_id, int(row.head_seq))

    # Human input (the requests are the store's :attr:`requests`): a run's pending ones, answering them.

    def pending_requests(self, run_id: str) -> list[InputRequest]:
        """The run's pending requests for human input (node, prompt, idempotency key, time,
        deadline), oldest first; empty when it waits for nobody."""
        return self._requests.pending(run_id)

    def respond(
        self, run_id: str, answer: str, *, node: str | None = None, request_id: str | None = None
    ) -> InputRequest:
        """Answer a pending request for human input of ``run_id``, as if the person had typed
        ``answer``; return the answered request. A ``waiting`` run becomes ``interrupted`` once none
        of the requests it waits on is pending (until then it still reads ``waiting``): the next
        ``run()`` (or a worker of a pool) resumes it, and the asking node's turn runs again and gets
        this answer. A run still being driven takes the answer when the node's batch would park.
        ``node`` or ``request_id`` names the request when several are pending.

        Raises:
            RunNotFoundError: no such run.
            NotWaitingError: (a :class:`UsageError`) no pending request (the run is not waiting, or
                the request was already answered, e.g. by a concurrent call: exactly one wins), or
                several and none named, or the run is cancelled (resumed, it asks again). Nothing
                was changed.
        """
        return self._requests.answer(run_id, answer, node=node, request_id=request_id, by="respond")
