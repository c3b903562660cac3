"""The team state at a past step (``DurableGraphFlow.save_state(at=...)``): the store's cut at that
step rendered in the saved-state format, as ``RunSession.state_at_head`` renders the head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphflow_durable._model.restore import plan
from graphflow_durable._runtime.session import RunSession
from graphflow_durable.store import RunLog

__all__ = ["team_state_of"]


async def team_state_of(session: RunSession, log: RunLog) -> dict[str, Any]:
    """The team state (TeamState dump, durable format) at the head of ``log`` (a run, or its cut at a
    step); a participant with no stored state (none before its first row) gives its current one."""
    at = plan(log, session.spec, session.team.participant_names)
    states = {
        name: log.agent_states[name] if name in log.agent_states else await session.team.agent_state(name)
        for name in session.team.participant_names
    }
    result = log.run.result if isinstance(log.run.result, Mapping) else {}
    return at.team_state(
        session.run_id, session.team.manager_name, states, session.fingerprint, result.get("stop_reason")
    )
