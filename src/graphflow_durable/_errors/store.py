"""What the store raises: a bad URL, a newer schema, corrupt rows, another writer first (a conflict,
a lost lease, a locked run), and a run that is not there."""

from __future__ import annotations

from graphflow_durable._errors.base import GraphflowDurableError, StoreError, UsageError

__all__ = [
    "ConflictError",
    "LeaseLostError",
    "RunLockedError",
    "RunNotFoundError",
    "SchemaVersionError",
    "StoreConfigError",
    "StoreCorruptError",
]


class StoreConfigError(UsageError, StoreError):
    """A store URL or store argument is invalid; nothing was opened.

    An unknown or refused option in the URL's query, a bad value, an unsupported backend, a
    keyword argument and the same option in the URL disagreeing, a database that holds another
    application's tables and no store (``option`` is ``"shared"``), one that holds tables named
    like the store's that the store did not create (``option`` is ``None``), or no store at all
    where one must exist (``Store(url, create=False)``; ``option`` is ``"create"``). A :class:`UsageError` (so a
    ``ValueError``: the caller gave a wrong value) and a :class:`StoreError` (so
    ``except StoreError`` keeps catching bad URLs).

    Attributes:
        url: the URL as given, password hidden (``None`` when it could not be parsed at all).
        option: the option at fault (``"synchronous"``, ``"pool_pre_ping"``...), if one is.
        run_id, action: always ``None`` (no run is involved).
    """

    def __init__(self, message: str, *, url: str | None = None, option: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.url = url
        self.option = option
        self.run_id = None
        self.action = None


class SchemaVersionError(StoreError):
    """The database was written by a newer graphflow-durable than the one running.

    Attributes:
        url: the database URL, password hidden.
        version: the database's schema version.
        known_version: the newest schema version this graphflow-durable knows.
        run_id, action: always ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        version: int | None = None,
        known_version: int | None = None,
    ) -> None:
        StoreError.__init__(self, message, url=url)
        self.version = version
        self.known_version = known_version


class StoreCorruptError(StoreError):
    """The stored rows of a run contradict each other (edited by hand, or a bug): retrying does not help.

    Attributes:
        url: the database URL, password hidden (when known).
        run_id: the run whose rows are inconsistent.
        node: the node whose rows are at fault, if one is.
        step: the step (sequence number) of the row at fault, if one is.
        table: the table of the row at fault (``"graphflow_messages"``...), when a row's checksum
            named it.
        seq: the message's seq in the thread, when the row at fault is a message.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        run_id: str | None = None,
        node: str | None = None,
        step: int | None = None,
        table: str | None = None,
        seq: int | None = None,
    ) -> None:
        StoreError.__init__(self, message, url=url, run_id=run_id)
        self.node = node
        self.step = step
        self.table = table
        self.seq = seq


class ConflictError(StoreError):
    """Another writer won: a commit expected a head that is no longer the run's head, or another
    process created the same run first. Nothing of this call was written; reload and retry.

    Attributes:
        run_id: the run.
        expected_head: the head sequence number the commit expected, if it was a commit.
        actual_head: the run's head in the store, when it was read.
        url: the database URL, password hidden (when known).
        action: always ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        expected_head: int | None = None,
        actual_head: int | None = None,
        url: str | None = None,
    ) -> None:
        StoreError.__init__(self, message, url=url, run_id=run_id)
        self.expected_head = expected_head
        self.actual_head = actual_head


class LeaseLostError(ConflictError):
    """This worker's lease on the run was taken over; it may not write another step.

    Attributes:
        run_id: the run.
        token: this worker's (stale) fencing token.
        current_token: the run's fencing token now.
        owner: who holds the run's lease now (``None``: nobody, the lease was released).
        expires_at: when the current holder's lease expires (epoch seconds), if held.
        expected_head, actual_head, url, action: ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        current_token: int | None = None,
        owner: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        ConflictError.__init__(self, message, run_id=run_id)
        self.token = token
        self.current_token = current_token
        self.owner = owner
        self.expires_at = expires_at


class RunLockedError(StoreError):
    """The run is being driven by another live worker (its lease has not expired).

    Attributes:
        run_id: the run.
        owner: the worker holding its lease.
        host, pid: the holder's process.
        expires_at: when the holder's lease expires (epoch seconds).
        url, action: ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        expires_at: float | None = None,
    ) -> None:
        StoreError.__init__(self, message, run_id=run_id)
        self.owner = owner
        self.host = host
        self.pid = pid
        self.expires_at = expires_at


class RunNotFoundError(UsageError, StoreError, LookupError):
    """No run with the given id exists in the store: the caller named a run that is not there.

    A :class:`UsageError`; also a :class:`StoreError` and a ``LookupError``, as it always was.

    Attributes:
        run_id: the id that was not found.
        url: the database URL, password hidden (when known).
        option, action: ``None``.
    """

    def __init__(self, message: str, *, run_id: str | None = None, url: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.url = url
        self.option = None
        self.action = None
