"""The exception tree of graphflow-durable.

Every error the package raises on purpose derives from :class:`GraphflowDurableError`.
Where plain ``GraphFlow`` raised ``ValueError`` or ``RuntimeError`` for the same situation,
the matching class also derives from that built-in, so existing ``except`` clauses keep working.

Each error carries the facts its message states as keyword attributes (``run_id``, ``node``,
``owner``, ``expires_at``, ``expected_head``/``actual_head``...), ``None`` where the raiser did not
know them; ``str(exc)`` is the message. The categories are exact, so a caller (the worker pool, a
CLI) can act on the class alone:

- :class:`UsageError`: the caller asked for something wrong (an argument, an option, a run id, a
  graph); retrying the same call fails the same way.
- :class:`StoreError` (not one of its subclasses below): the database failed (unreachable, locked,
  a driver error); the same call may succeed later.
- :class:`ConflictError` / :class:`LeaseLostError` / :class:`RunLockedError`: another writer got
  there first or holds the run; nothing of this call was written.
- :class:`StoreCorruptError`: the stored rows contradict each other; retrying does not help.

The classes below are grouped by category: the roots, the store's errors, refusals about runs,
values that cannot be used. This module imports nothing else from the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

__all__ = [
    "ConflictError",
    "GraphMismatchError",
    "GraphflowDurableError",
    "InputDeadlineError",
    "LeaseLostError",
    "NodeFailedError",
    "NodeTimeoutError",
    "NotSerializableError",
    "NotWaitingError",
    "ReplayError",
    "RunExistsError",
    "RunLockedError",
    "RunNotFoundError",
    "RunStateError",
    "SchemaVersionError",
    "StateFormatError",
    "StoreConfigError",
    "StoreCorruptError",
    "StoreError",
    "UnrepairableStateError",
    "UsageError",
]


# The root of the tree and the two roots of its categories: the caller's mistake (UsageError) and
# the database's failure (StoreError).


class GraphflowDurableError(Exception):
    """Root of every error raised by graphflow-durable. ``str(exc)`` is the message."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)


class UsageError(GraphflowDurableError, ValueError):
    """The caller's mistake: a bad argument, option or run id for this call; nothing was done.

    Retrying the same call fails the same way: fix the call (or the configuration). A ``ValueError``.

    Attributes:
        run_id: the run the call named, if any.
        option: the argument or option at fault, if one is.
    """

    def __init__(self, message: str, *, run_id: str | None = None, option: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.option = option


class StoreError(GraphflowDurableError, RuntimeError):
    """The database could not do what was asked (the cause is chained with ``raise ... from``).

    A plain ``StoreError`` (none of the subclasses) is a database problem -- the server is
    unreachable, the file is locked, the driver failed -- not the caller's mistake: the same call
    may succeed later.

    Attributes:
        url: the database URL, password hidden.
        run_id: the run the store was working on, if one.
        action: what the store was doing (``"committing step 4 of run r1"``).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        run_id: str | None = None,
        action: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.url = url
        self.run_id = run_id
        self.action = action


# What the store raises: a bad URL, a newer schema, corrupt rows, another writer first (a
# conflict, a lost lease, a locked run), and a run that is not there.


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


# Refusals about runs and the people who answer them: a run's status or id does not allow the
# call, an answer with nothing to answer, a graph that is not the run's, an input deadline passed.


class RunStateError(UsageError):
    """The run's status (or a live driver) does not allow this operation: deleting or pruning a
    running run without ``force``, cancelling or retrying a run whose graph completed. Nothing was
    changed. A :class:`UsageError`.

    Attributes:
        run_id: the run.
        status: its status when the operation was refused.
        option: ``None``.
    """

    def __init__(self, message: str, *, run_id: str | None = None, status: str | None = None) -> None:
        UsageError.__init__(self, message, run_id=run_id)
        self.status = status


class RunExistsError(UsageError):
    """The run id is taken: it was submitted with another task or team, or a run with this id
    exists without having been submitted. Submit the new work under a new run id.

    Attributes:
        run_id: the id.
        team: the team key of the existing submission (``None``: none, or submitted without one).
        option: ``None``.
    """

    def __init__(self, message: str, *, run_id: str | None = None, team: str | None = None) -> None:
        UsageError.__init__(self, message, run_id=run_id)
        self.team = team


class NotWaitingError(UsageError):
    """An answer that has nothing to answer: the run has no pending input request (it is not
    waiting), the named request was already answered (another process answered first), the run
    waits on several requests and the answer names none of them, or the run is cancelled (resumed,
    its node asks again). Nothing was changed.

    Attributes:
        run_id: the run.
        request_id: the request named or found, if one.
        pending: the ids of the run's pending requests.
        option: ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        request_id: str | None = None,
        pending: Sequence[str] = (),
    ) -> None:
        UsageError.__init__(self, message, run_id=run_id)
        self.request_id = request_id
        self.pending = tuple(pending)


class InputDeadlineError(GraphflowDurableError, RuntimeError):
    """A request for human input passed its deadline unanswered, and no default answer was
    configured: the asking node's turn fails (the run is ``failed``).

    Attributes:
        run_id: the run.
        request_id: the request.
        deadline: its deadline (epoch seconds).
    """

    def __init__(self, message: str, *, run_id: str, request_id: str, deadline: float) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.request_id = request_id
        self.deadline = deadline


class GraphMismatchError(UsageError):
    """The graph given to a team differs from the graph the stored run (or saved state) was started
    with: the caller's mistake (a :class:`UsageError`, so a ``ValueError`` as before).

    Attributes:
        run_id: the stored run, when there is one.
        differences: what differs, one line each (may be empty).
        option: ``None``.
    """

    def __init__(self, message: str, *, run_id: str | None = None, differences: Sequence[str] = ()) -> None:
        UsageError.__init__(self, message, run_id=run_id)
        self.differences = tuple(differences)


# A node's turn that did not succeed: it ran out of time, or out of attempts.


class NodeTimeoutError(GraphflowDurableError, TimeoutError):
    """A node's turn passed a limit of its ``TimeoutPolicy``: it ran past ``run_timeout``, or yielded
    no event for ``idle_timeout`` seconds. The turn was cancelled through its ``CancellationToken``.
    Retryable: under a ``RetryPolicy`` the node is attempted again. A ``TimeoutError``.

    Attributes:
        node: the node.
        limit: the limit passed, in seconds.
        kind: which limit: ``"run_timeout"`` or ``"idle_timeout"``.
        attempt: the attempt that timed out (1 = the first).
        run_id: the run, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str,
        limit: float,
        kind: str,
        attempt: int,
        run_id: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.node = node
        self.limit = limit
        self.kind = kind
        self.attempt = attempt
        self.run_id = run_id

    def __reduce__(self) -> Any:  # its facts are keyword-only and required: pickle them as such
        return (partial(type(self), str(self), **vars(self)), ())


class NodeFailedError(GraphflowDurableError, RuntimeError):
    """A node's turn failed and its attempts are spent (or its error is not retryable): the run is
    ``failed`` until ``graphflow-durable runs retry RUN`` (``Store.retry_run``) gives the node a fresh
    budget. A ``RuntimeError``, as GraphFlow's own error for a failed agent is. In the process where
    the last attempt failed, ``__cause__`` is that attempt's exception.

    Args:
        message: the message; by default one built from the attributes (node, attempts, last
            error, how to retry) and ``allowed`` and ``reason``.
        allowed: the attempts the node's retry policy allowed (``None``: no retry policy).
        reason: why no further attempt was made, when the attempts were not spent (the error is
            not retryable under the policy, and how to make it so).

    Attributes:
        node: the node.
        attempts: how many attempts were made.
        error_type: the last error's class name.
        error: the last error's message.
        run_id: the run, when known.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        node: str,
        attempts: int,
        error_type: str,
        error: str,
        run_id: str | None = None,
        allowed: int | None = None,
        reason: str | None = None,
    ) -> None:
        if message is None:
            run = run_id or "RUN"
            where = f"run {run_id}: " if run_id else ""
            last = f"{error_type}: {error}" if error else error_type
            tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
            if allowed is not None:
                tries = f"{attempts} of {allowed} allowed attempt{'s' if allowed != 1 else ''}"
            message = (
                f"{where}node {node!r} failed after {tries}{f': {reason}' if reason else ''}; "
                f"last error: {last}. Once the cause is fixed, retry it with "
                f"`graphflow-durable runs retry {run}` (or Store.retry_run({run!r}))"
            )
        GraphflowDurableError.__init__(self, message)
        self.node = node
        self.attempts = attempts
        self.error_type = error_type
        self.error = error
        self.run_id = run_id

    def __reduce__(self) -> Any:  # its facts are keyword-only and required: pickle them as such
        return (partial(type(self), str(self), **vars(self)), ())


# Values and saved states that cannot be used: not JSON, a saved state of the wrong shape, a
# thread the graph cannot explain, a corruption repair cannot fix.


class NotSerializableError(GraphflowDurableError, TypeError, ValueError):
    """A value that must be stored is not JSON-serialisable (not a JSON type, a NaN, a lone surrogate
    UTF-8 cannot encode, nested too deep); the message names the node and where in the value it is.
    Raised before anything of the commit is written.

    Attributes:
        where: the JSON Pointer-like path of the first bad value (``agent_states/A/x/3``), or the
            configuration item (``edge 'A' -> 'B'``).
        type_name: the type of the bad value, when known.
        node: the node whose message or agent state it is, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        type_name: str | None = None,
        node: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.where = where
        self.type_name = type_name
        self.node = node


class StateFormatError(GraphflowDurableError, ValueError):
    """A saved team state (or a stored scheduler state) has the wrong shape or an unknown format version.

    Attributes:
        run_id: the run, when the state belongs to one.
        code: the repair finding code (``GFD001-not-a-team-state``...), when there is one.
        pointer: where in the state (a JSON Pointer), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        code: str | None = None,
        pointer: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.code = code
        self.pointer = pointer


class ReplayError(GraphflowDurableError, ValueError):
    """A message thread cannot be explained by the graph (names the first message that does not fit).

    Attributes:
        index: the position of that message in the thread.
        node: the message's source, the node that was not allowed to speak then.
    """

    def __init__(self, message: str, *, index: int | None = None, node: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.index = index
        self.node = node


class UnrepairableStateError(GraphflowDurableError, ValueError):
    """A saved state is corrupt in a way repair cannot fix without inventing progress.

    Attributes:
        code: the repair finding code (``GFD101-participant-missing``...).
        pointer: where in the state (a JSON Pointer).
        node: the node concerned, if one is.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        pointer: str | None = None,
        node: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.code = code
        self.pointer = pointer
        self.node = node
