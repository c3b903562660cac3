"""The parts of a GraphFlow team the durable runtime reaches into, in one place.

:class:`TeamView` gives the run session what it needs of the team -- its participants and their
states, its message factory, and a way to put the team at a stored position -- without the
session knowing AutoGen's private attribute names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_agentchat.teams import GraphFlow
from autogen_core import AgentId, SingleThreadedAgentRuntime

from graphflow_durable._model.restore import Plan
from graphflow_durable._runtime.container import DurableChatAgentContainer
from graphflow_durable._runtime.manager import DurableGraphFlowManager
from graphflow_durable.store import AgentStateRecord

__all__ = ["TeamView"]


class TeamView:
    """A GraphFlow team as the run session sees it."""

    def __init__(self, team: GraphFlow) -> None:
        self._team = team

    @property
    def participant_names(self) -> list[str]:
        return list(self._team._participant_names)

    @property
    def manager_name(self) -> str:
        """The key of the manager's entry in a saved team state."""
        return self._team._group_chat_manager_name

    def create_message(self, body: Mapping[str, Any]) -> BaseAgentEvent | BaseChatMessage:
        """A message object from its dump, through the team's message factory."""
        return self._team._message_factory.create(body)

    async def agent_states(self) -> list[AgentStateRecord]:
        """Every participant's state, as its ``save_state()`` returns it."""
        return [AgentStateRecord(p.name, await p.save_state()) for p in self._team._participants]

    async def agent_state(self, name: str) -> Mapping[str, Any]:
        participant = next(p for p in self._team._participants if p.name == name)
        return await participant.save_state()

    async def reset_if_used(self) -> None:
        """Reset the team as GraphFlow does if it has run before (a new run starts from nothing)."""
        if self._team._initialized:
            await GraphFlow.reset(self._team)

    async def load_plain(self, state: Mapping[str, Any]) -> None:
        """Load a team state into the team in memory, as GraphFlow does."""
        await GraphFlow.load_state(self._team, state)

    def cancel_in_flight(self) -> int:
        """Cancel the embedded runtime's message handlers still running (the agents' turns) after an
        interrupt whose wait ran out; the number cancelled (0 on another runtime: not ours to stop)."""
        runtime = self._team._runtime
        if not isinstance(runtime, SingleThreadedAgentRuntime) or not self._team._embedded_runtime:
            return 0
        tasks = [t for t in runtime._background_tasks if not t.done()]
        for task in tasks:
            task.cancel()
        return len(tasks)

    async def restore(self, at: Plan, agent_states: Mapping[str, Mapping[str, Any]], run_id: str) -> None:
        """Put the team at ``at``. On the embedded runtime every message is created once and shared
        by the thread and the buffers; elsewhere the state goes through ``load_state``."""
        team = self._team
        runtime = team._runtime
        if not isinstance(runtime, SingleThreadedAgentRuntime):
            states = {
                name: agent_states[name] if name in agent_states else await self.agent_state(name)
                for name in self.participant_names
            }
            await self.load_plain(at.team_state(run_id, self.manager_name, states))
            return
        if not team._initialized:
            await team._init(runtime)
        thread = [self.create_message(e.body) for e in at.entries]
        manager = await runtime.try_get_underlying_agent_instance(
            AgentId(team._group_chat_manager_topic_type, team._team_id), DurableGraphFlowManager
        )
        await manager.restore(thread, at.cursor)
        for name, topic in zip(team._participant_names, team._participant_topic_types, strict=True):
            container = await runtime.try_get_underlying_agent_instance(
                AgentId(topic, team._team_id), DurableChatAgentContainer
            )
            buffer, deferred = at.buffers[name]
            await container.restore(
                [thread[i] for i in buffer], [thread[i] for i in deferred], agent_states.get(name)
            )
