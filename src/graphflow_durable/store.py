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

This module opens and closes the store; its methods are written in ``_store``, one mixin per
group (runs, commits, history, leases, operations, human input), and composed here.
"""

from __future__ import annotations

from pathlib import Path

from graphflow_durable._model.history import StepInfo
from graphflow_durable._model.human import InputRequest
from graphflow_durable._model.records import (
    ENDED_STATUSES,
    FIRST_FENCING_TOKEN,
    RUN_STATUSES,
    AgentStateRecord,
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
from graphflow_durable._storage.admin import Cancellation, Heartbeat, Progress, Retry
from graphflow_durable._storage.checksum import Damage
from graphflow_durable._storage.engine import open_engines, peek_sqlite
from graphflow_durable._storage.migrations import (
    Survey,
    current_version,
    holds_store,
    migrate,
    no_store,
    refuse_unowned,
    survey,
)
from graphflow_durable._storage.queue import Claim, Submission
from graphflow_durable._storage.reading import Verification
from graphflow_durable._storage.requests import InputRequests
from graphflow_durable._storage.retention import Removal, StoreStats
from graphflow_durable._storage.workqueue import WorkQueue
from graphflow_durable._storage.writer import CommitWriter
from graphflow_durable._store.commits import CommitMethods
from graphflow_durable._store.history import HistoryMethods
from graphflow_durable._store.human import HumanInputMethods
from graphflow_durable._store.leases import LeaseMethods
from graphflow_durable._store.operations import OperationMethods
from graphflow_durable._store.runs import RunMethods

__all__ = [
    "ENDED_STATUSES",
    "FIRST_FENCING_TOKEN",
    "RUN_STATUSES",
    "AgentStateRecord",
    "Cancellation",
    "Claim",
    "Damage",
    "Heartbeat",
    "InputRequest",
    "InputRequests",
    "MessageRecord",
    "Progress",
    "Removal",
    "Retry",
    "RunLog",
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
    "Verification",
    "WorkQueue",
]


class Store(HistoryMethods, RunMethods, CommitMethods, LeaseMethods, OperationMethods, HumanInputMethods):
    """Runs, steps, messages, agent states and leases over SQLAlchemy 2.x Core.

    Opening a store creates or migrates the schema (see ``_migrations``); a database written by a
    newer graphflow-durable is refused with :class:`SchemaVersionError`. With ``create=False`` it
    only opens a store that exists (what a tool that reads runs wants: a mistyped path is refused
    instead of becoming a new, empty store). A store is safe to share
    between threads. Every method that writes runs one transaction; database and driver errors are
    raised as :class:`StoreError` with the cause chained.

    Leases: a run is driven by one worker at a time. :meth:`acquire_lease` returns a new *fencing
    token* on every successful acquisition (also when the same owner acquires again), so an older
    copy of a worker holding the previous token is fenced out; use :meth:`renew_lease` to extend a
    lease you hold. :meth:`commit` checks the token only: a worker whose lease expired may still
    commit as long as nobody has taken the run over.

    The worker-pool queue is :attr:`queue`, held by the store on the same engines.

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
            store's tables. A store at an older schema version is migrated either way.

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
    ) -> None:
        self._e = open_engines(url, synchronous=synchronous, pool_pre_ping=pool_pre_ping, shared=shared)
        self._writer = CommitWriter(self._e)
        self._queue = WorkQueue(self._e)
        self._requests = InputRequests(self._e)
        shared = self._e.target.shared
        try:
            with self._guard("opening the store"):
                # Before the engine connects (that would create a missing SQLite file, and turn an
                # existing one to WAL): a refused file is left as it was. migrate() checks again,
                # on both backends.
                found = peek_sqlite(self._e.target, survey)
                if not create:
                    self._refuse_no_sqlite_store(found)
                if found is not None:
                    refuse_unowned(found, url=self._e.url, dialect=self._e.dialect, shared=shared)
                self._version = migrate(
                    self._e.migrate, read=self._e.read, url=self._e.url, shared=shared, create=create
                )
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
    def queue(self) -> WorkQueue:
        """The worker-pool queue of this store: submit runs, claim work, release claims, record failures."""
        return self._queue

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
