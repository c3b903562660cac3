"""What a call of :meth:`DurableGraphFlow.run_stream` does on the run it attached (return the stored
result, or run with which task), and its wind-down after an interrupt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable._model.task import task_key
from graphflow_durable._runtime.human import on_waiting_run
from graphflow_durable._runtime.session import RunSession
from graphflow_durable._runtime.stored import stored_result
from graphflow_durable._runtime.team import TeamView
from graphflow_durable.store import ENDED_STATUSES, RunRecord

__all__ = ["opening", "wind_down"]

#: These are the flow's decisions: they log as the flow does, so log filters keep working.
logger = logging.getLogger("graphflow_durable.flow")


async def opening(
    session: RunSession,
    run: RunRecord | None,
    messages: list[BaseChatMessage] | None,
    first_call: bool,
    create: Callable[[Mapping[str, Any]], Any],
) -> tuple[TaskResult | None, list[BaseChatMessage] | None]:
    """What a call does on the run it attached (``run``: ``None`` when the call created it), given
    the call's task ``messages`` and whether it is this team object's first call on the run.

    Returns the stored result to return without running anything (or ``None``), and the task to
    run with: ``None`` when the task is already the run's (the interrupted round began with it) or
    was the answer to a waiting turn's request.
    """
    if run is None:
        return None, messages
    if run.status == "waiting":
        own = messages is not None and run.task == task_key(messages)  # a re-run script's task
        if await on_waiting_run(session.store, run, None if own else messages):
            return stored_result(session, run, create), messages
        return None, None  # the task was the answer: the waiting turn resumes with it
    if run.status in ENDED_STATUSES:
        same_task = messages is not None and first_call and run.task == task_key(messages)
        if same_task:
            logger.info(
                "run %s is %s and its last round began with this task: returning the stored "
                "result without running anything (give a new task to start another round, or "
                "call reset() to start over)",
                session.run_id,
                run.status,
            )
        if same_task or (messages is None and run.status == "finished"):
            return stored_result(session, run, create), messages
        return None, messages
    if messages is not None and run.task == task_key(messages):
        logger.info("run %s: same task as the interrupted round; resuming it", session.run_id)
        return None, None
    return None, messages


async def wind_down(advance: asyncio.Future[Any], grace: float, team: TeamView, run_id: str) -> bool:
    """After an interrupt: wait up to ``grace`` seconds (``interrupt_grace_seconds``) for GraphFlow's
    stream to end (the agents already running answer and are recorded). Past it, or on a second
    cancellation, cancel the turns still running and stop waiting; returns whether the stream ended."""
    try:
        await asyncio.wait({advance}, timeout=grace)
    except asyncio.CancelledError:
        pass  # a second interrupt: stop waiting at once
    if advance.done():
        if not advance.cancelled():
            advance.exception()  # retrieved: the interrupt is what the caller sees
        return True
    cancelled = team.cancel_in_flight()
    logger.warning(
        "run %s: interrupted, but %d agent turn(s) did not end within interrupt_grace_seconds=%g; "
        "stopped waiting: the run is left interrupted and those nodes run again on resume",
        run_id,
        cancelled,
        grace,
    )
    return False
