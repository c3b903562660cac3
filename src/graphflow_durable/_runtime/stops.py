"""When a round ends, and why a run stops dispatching: GraphFlow's termination checks, the park for
human input, the run's halt signals, and what of that stays out of the ERROR log.

:class:`RoundStops` is held by the :class:`~graphflow_durable._runtime.manager.DurableGraphFlowManager`
and decides, without committing anything, whether a round stops: the checks at the end of a batch
(natural end, termination condition, ``max_turns``, in GraphFlow's order, mirroring
``GraphFlowManager._apply_termination_condition``), the termination condition's replay of a
resumed round's history, and which in-flight nodes wait for a person (it is the one owner of
those parked nodes). The manager commits what it decides and signals the end.

:class:`RunControl` is held by the run session and handed to the lease and the write path: the one
owner of why the run stops dispatching (halted, with a stop reason; a lost lease; a requested
cancel; a fatal error). The lease and the write path report to it; the manager and the flow read it
through the session.

Expected control flow stays out of the ERROR log. A lost lease is a normal event in a worker pool,
and a database outage one a pool rides out; the package says what happened in one line of its own
(``run X: lease lost to OWNER; stopped dispatching``) and the run raises the error to its caller.
Without the filters :func:`install_log_filters` puts on two library loggers, the same event also
surfaces as tracebacks logged by libraries:

- AutoGen's runtime logs ``Error processing publish message for ...`` at ERROR, with the
  traceback, for every exception a message handler raises: the manager's refused commit
  (:class:`~graphflow_durable.errors.LeaseLostError`), a commit that failed in a database outage,
  a turn cancelled by a halt (``CancelledError``), a message published after the runtime stopped
  while a halted run winds down (``QueueShutDown``), a request's deadline that failed its turn
  (:class:`~graphflow_durable.errors.InputDeadlineError`);
- psycopg logs ``error ignored terminating <Pipeline>: pipeline aborted`` at WARNING when the
  statements of a refused commit fail inside pipeline mode (the commit's own error is raised).

The filters drop such records (they are logged again at DEBUG on ``graphflow_durable.flow``,
traceback included). Every other record passes unchanged: an agent's own error is still logged by
AutoGen at ERROR with its traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from autogen_agentchat.base import TerminationCondition
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, StopMessage
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import _DIGRAPH_STOP_MESSAGE

from graphflow_durable._runtime.gate import GroupChatInputPending
from graphflow_durable._storage.lease import iso
from graphflow_durable.errors import (
    ConflictError,
    InputDeadlineError,
    LeaseLostError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.scheduler import GraphSpec, SchedulerState, finish

__all__ = ["ALWAYS_RESUME_STOP", "RoundStops", "RunControl", "expected", "install_log_filters"]

#: The stop reason of a round torn down by the always-resume test mode after an answer's commit
#: (``$GRAPHFLOW_DURABLE_ALWAYS_RESUME``); the flow resumes it from the store at once.
ALWAYS_RESUME_STOP = "always-resume: torn down after a commit, resuming from the store"

#: The stops are the manager's decisions: they log as the manager does, so log filters keep working.
logger = logging.getLogger("graphflow_durable._runtime.manager")

#: The run's control acts for DurableGraphFlow: it logs as the flow does, so log filters keep working.
flow_logger = logging.getLogger("graphflow_durable.flow")


class RoundStops:
    """A manager's stop decisions over its termination condition, ``max_turns`` and parked nodes.

    Args:
        condition: the team's termination condition (the manager's own object, not a copy).
        max_turns: the team's ``max_turns``.
        manager_name: the source of the stop messages.
        spec: the graph's scheduling rules' view of it.
    """

    def __init__(
        self,
        condition: TerminationCondition | None,
        max_turns: int | None,
        manager_name: str,
        spec: GraphSpec,
    ) -> None:
        self._condition = condition
        self._max_turns = max_turns
        self._name = manager_name
        self._spec = spec
        self.parked: dict[str, GroupChatInputPending] = {}  # in-flight nodes waiting for a person

    async def condition_stop(self, delta: Sequence[BaseAgentEvent | BaseChatMessage]) -> StopMessage | None:
        """The termination condition on ``delta``; reset once it fires."""
        if self._condition is None:
            return None
        stop = await self._condition(delta)
        if stop is not None:
            await self._condition.reset()
        return stop

    async def batch_stop(
        self, sched: SchedulerState, batch_delta: Sequence[BaseAgentEvent | BaseChatMessage]
    ) -> tuple[StopMessage | None, SchedulerState, bool]:
        """GraphFlow's end-of-batch checks, in its order: natural end, condition, max turns.

        Returns the stop (if any), the scheduler state after it, and whether it is the graph's
        natural end (otherwise a stop: the scheduler keeps its ready nodes for the next round).
        """
        if not sched.ready:
            if self._condition is not None:
                await self._condition.reset()
            end = StopMessage(content=_DIGRAPH_STOP_MESSAGE, source=self._name)
            return end, finish(self._spec, sched), True
        # Every message of the batch reaches the condition, not only the last answer's.
        stop = await self.condition_stop(batch_delta)
        if stop is not None:
            return stop, sched.with_turn(0), False
        sched = sched.with_turn(sched.turn + 1)
        if self._max_turns is not None and sched.turn >= self._max_turns:
            if self._condition is not None:
                await self._condition.reset()
            stop = StopMessage(
                content=f"Maximum number of turns {self._max_turns} reached.", source=self._name
            )
            return stop, sched.with_turn(0), False
        return None, sched, False

    async def replay(self, seen: Sequence[BaseAgentEvent | BaseChatMessage], run_id: str) -> None:
        """Let the termination condition see the committed history ``seen`` of the current round
        again (empty: a finished round, nothing to see)."""
        if self._condition is None:
            return
        await self._condition.reset()
        if not seen:
            return
        if await self._condition(seen) is not None:
            logger.warning(
                "run %s: the termination condition fires on the replayed history of the round; "
                "it is reset and the run continues as it did before the interruption",
                run_id,
            )
            await self._condition.reset()

    def unpark(self, request_ids: Sequence[str]) -> list[str]:
        """The parked nodes whose request is one of ``request_ids``, no longer parked (in order)."""
        nodes = [name for name, p in self.parked.items() if p.request_id in request_ids]
        for name in nodes:
            del self.parked[name]
        return nodes

    def waiting(self, in_flight: Sequence[str]) -> tuple[str, list[str]] | None:
        """When every node in flight waits for a person: the stop reason naming them and their
        request ids; ``None`` while a node in flight is still running."""
        if not set(in_flight) <= set(self.parked):
            return None
        waiting = [self.parked[n] for n in dict.fromkeys(in_flight)]
        reason = "; ".join(
            f"waiting for input: {w.name} asks {w.prompt!r} (request {w.request_id})" for w in waiting
        )
        return reason, [w.request_id for w in waiting]


class RunControl:
    """Why a run stops dispatching: halted (with the round's stop reason), a lost lease, a requested
    cancel, a fatal error. ``run_id`` names the run in the log lines (the session keeps it current).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.halted = False
        self.halt_reason: str | None = None  # why, when the round's stop reason should say it
        self.cancelling: float | None = None  # when a cancel was requested (seen by a renewal, attach)
        self.fatal: BaseException | None = None
        self.said_lost = False  # the one line about a lost lease was logged (once per attach)
        # The always-resume test mode: nodes dispatched in the last commit and halted before they
        # started; their resume is not another attempt (the session clears it if the run moved on).
        self.unstarted: tuple[str, ...] = ()

    def attached(self) -> None:
        """A new attach: no cancel seen yet, the lost lease not reported yet."""
        self.said_lost, self.cancelling = False, None

    def start_round(self) -> None:
        """A round starts (or resumes): dispatching is allowed again."""
        self.halted, self.halt_reason = False, None

    def halt(self, reason: str | None = None) -> None:
        """Stop dispatching new nodes (an interrupt); answers already running are still recorded.
        ``reason``: the round's stop reason (the first given wins; without one, GraphFlow's)."""
        self.halted = True
        if reason is not None and self.halt_reason is None:
            self.halt_reason = reason

    def lost(self, exc: StoreError) -> None:
        """The lease is gone (another driver took the run, or the run was removed): stop, with it.

        A normal event in a pool: one WARNING line, once, whether the renewal, the check before a
        dispatch or a refused commit found it first.
        """
        self.halted = True
        self.fatal = exc
        if not self.said_lost:
            self.said_lost = True
            if not isinstance(exc, LeaseLostError):
                gone = f"lease lost ({exc})"
            elif exc.owner is None:  # the driver that took the run over released it since
                gone = f"lease lost to another driver (fencing token {exc.current_token}, since released)"
            else:
                gone = f"lease lost to {exc.owner}"
            flow_logger.warning("run %s: %s; stopped dispatching", self.run_id, gone)

    def cancel(self, requested_at: float) -> None:
        """A cancel was requested (``Store.cancel_run``): stop dispatching; the run ends ``cancelled``."""
        if self.cancelling is None:
            flow_logger.warning(
                "run %s: cancel requested at %s; stopped dispatching (agents already running answer "
                "and are recorded); the run is left cancelled: run() with no task resumes it",
                self.run_id,
                iso(requested_at),
            )
        self.cancelling = requested_at
        self.halted = True

    def fail(self, exc: BaseException) -> None:
        """The manager hit an error it cannot record, or a turn one GraphFlow passes on only as text
        (a request's deadline passed): the run ends with it, and ``run()`` raises it."""
        if isinstance(exc, LeaseLostError):  # a commit refused by the fencing token
            self.lost(exc)
        self.fatal = exc


def expected(exc: BaseException) -> bool:
    """Whether ``exc`` is control flow the package handles and reports itself.

    Another driver took the run (:class:`ConflictError` and its subclasses); the database failed
    (a plain :class:`StoreError`: the run raises it, a worker logs it as a database problem); a
    cancellation (a halt or an interrupt); AutoGen's runtime queue shut down under a turn; a request
    for a person past its deadline (:class:`InputDeadlineError`, wrapped by ``UserProxyAgent``: the
    run raises it and records it as its last error).
    """
    if isinstance(exc, (asyncio.CancelledError, ConflictError)):
        return True
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, InputDeadlineError):
            return True
        cause = cause.__cause__
    if isinstance(exc, StoreError):
        return not isinstance(exc, (UsageError, StoreCorruptError))
    # asyncio.QueueShutDown (Python 3.13) or autogen_core's own copy of it before 3.13.
    return any(cls.__name__ == "QueueShutDown" for cls in type(exc).__mro__)


class _HandledByUs(logging.Filter):
    """On ``autogen_core``: drop a handler-exception record whose exception is :func:`expected`."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.levelno < logging.WARNING or not expected(exc):
            return True
        flow_logger.debug(
            "AutoGen logged %r at %s for %s (expected; the run reports it)",
            record.getMessage(),
            record.levelname,
            type(exc).__name__,
            exc_info=record.exc_info,
        )
        return False


class _PipelineAborted(logging.Filter):
    """On ``psycopg``: drop "error ignored ... pipeline aborted" (a consequence of the error raised)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("error ignored") and any(
            type(arg).__name__ == "PipelineAborted" for arg in args
        ):
            flow_logger.debug("psycopg: %s", record.getMessage())
            return False
        return True


def install_log_filters() -> None:
    """Put the filters on the ``autogen_core`` and ``psycopg`` loggers (once; idempotent)."""
    for name, kind in (("autogen_core", _HandledByUs), ("psycopg", _PipelineAborted)):
        target = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in target.filters):
            target.addFilter(kind())


def forget_stale_shutdown(runtime: object) -> None:
    """Before a stopped runtime starts again: forget the ``QueueShutDown`` a message handler of its
    last run raised after the run ended (a publish into the queue AutoGen had shut down, as when a
    turn failed inside an agent's tool loop). AutoGen's runtime keeps it and raises it from its next
    start's message loop, which then ends at once, and that run would wait forever."""
    stale = getattr(runtime, "_background_exception", None)
    stopped = getattr(runtime, "_run_context", True) is None
    if stopped and any(cls.__name__ == "QueueShutDown" for cls in type(stale).__mro__):
        runtime._background_exception = None  # type: ignore[attr-defined]
