"""Refusals about runs and the people who answer them: a run's status or id does not allow the call,
an answer with nothing to answer, a graph that is not the run's, an input deadline passed."""

from __future__ import annotations

from collections.abc import Sequence

from graphflow_durable._errors.base import GraphflowDurableError, UsageError

__all__ = ["GraphMismatchError", "InputDeadlineError", "NotWaitingError", "RunExistsError", "RunStateError"]


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
