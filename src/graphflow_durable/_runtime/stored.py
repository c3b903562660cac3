"""A session's team and its stored run, each made from the other: the team put at the store's head,
a loaded state written as the run's new starting point, and the team's state or last result read
from the store.

Functions over a :class:`~graphflow_durable._runtime.session.RunSession` (they hold nothing): the
session calls them as it attaches, loads and restarts; the flow reads results and states with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.restore import Plan, cursor_from_log, plan
from graphflow_durable.store import (
    AgentStateRecord,
    MessageRecord,
    RunLog,
    RunRecord,
    RunStatus,
    RunUpdate,
    Step,
    StepKind,
)

if TYPE_CHECKING:  # the session calls these
    from graphflow_durable._runtime.session import RunSession

__all__ = ["import_state", "last_round", "restore", "state_at_head", "state_of", "stored_result"]


async def restore(session: RunSession) -> Plan:
    """Put the session's team at the store's head. The log is read in a thread: a long run's takes
    tens of milliseconds (more while the database is unreachable), which the process's other runs
    would otherwise wait through."""
    log = await asyncio.to_thread(session.store.load, session.run_id)
    at = plan(log, session.spec, session.team.participant_names)
    await session.team.restore(at, log.agent_states, session.run_id)
    session.states.prime(log.run.message_count)
    return at


async def import_state(session: RunSession, state: Mapping[str, Any], *, origin: int) -> None:
    """Seed the session's run with a loaded state: its thread (from message ``origin`` on), agent
    states and cursor in one commit."""
    session.pending_import = None
    team = session.team
    agent_states = state["agent_states"]
    manager = agent_states[team.manager_name]
    ext = manager["graphflow_durable"]
    thread = [team.create_message(m) for m in manager["message_thread"]]
    records = [
        MessageRecord(origin + i, m.dump(), isinstance(m, BaseChatMessage)) for i, m in enumerate(thread)
    ]
    states = [
        AgentStateRecord(name, agent_states[name]["agent_state"])
        for name in team.participant_names
        if name in agent_states
    ]
    cursor = replace(Cursor.from_extension(ext), origin=origin)
    status: RunStatus = "interrupted" if cursor.status == "running" else cursor.status
    reason = ext.get("stop_reason") if cursor.finished else None
    session.states.clear()  # the loaded agent states are written whole
    await session.write(
        Step(StepKind.IMPORT, None, cursor.to_json(session.spec), {"dispatches": ext.get("dispatches", {})}),
        records,
        states,
        RunUpdate(status=status, result={"stop_reason": reason}),
    )


def stored_result(
    session: RunSession, run: RunRecord, create: Callable[[Mapping[str, Any]], Any]
) -> TaskResult:
    """The result of the run's last round, as its uninterrupted run returned it."""
    log = session.store.load(session.run_id)
    cursor = cursor_from_log(log, session.spec)
    thread = [m for m in log.messages if m.seq >= cursor.origin + cursor.round_start]
    result = run.result if isinstance(run.result, Mapping) else {}
    return TaskResult(messages=[create(m.body) for m in thread], stop_reason=result.get("stop_reason"))


def last_round(session: RunSession) -> list[tuple[Mapping[str, Any], bool]]:
    """The stored run's last round: each message's dump and whether it was user input, in order."""
    log = session.store.load(session.run_id)
    return plan(log, session.spec, session.team.participant_names).current_round()


async def state_at_head(session: RunSession) -> dict[str, Any]:
    """The team state (TeamState dump, durable format) at the store's head."""
    return await state_of(session, session.store.load(session.run_id))


async def state_of(session: RunSession, log: RunLog) -> dict[str, Any]:
    """The team state (TeamState dump, durable format) at the head of ``log`` (the run, or its
    cut at a past step); a participant with no stored state there gives its current one."""
    team = session.team
    at = plan(log, session.spec, team.participant_names)
    states = {
        name: log.agent_states[name] if name in log.agent_states else await team.agent_state(name)
        for name in team.participant_names
    }
    result = log.run.result if isinstance(log.run.result, Mapping) else {}
    return at.team_state(
        session.run_id, team.manager_name, states, session.fingerprint, result.get("stop_reason")
    )
