"""The parts of a GraphFlow team the durable runtime reaches into, in one place; and the team and
its stored run, each made from the other.

:class:`TeamView` gives the run session what it needs of the team -- its participants and their
states, its message factory, and a way to put the team at a stored position -- without the
session knowing AutoGen's private attribute names.

:func:`record_calls` wraps the participants' model clients and workbenches (``record_calls=True``);
:func:`limit_calls` their model clients in their rate limits (``rate_limits=[...]``).

The functions below (they hold nothing; each takes what it needs) put the team at the store's
head (:func:`restore`), turn a loaded state into the commit that makes it a run's new starting
point (:func:`imported`), and read the team's state or last result from the store. The session
calls them as it attaches, loads and restarts; the flow reads results and states through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from autogen_agentchat.base import ChatAgent, TaskResult, Team
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_agentchat.teams import GraphFlow
from autogen_core import AgentId, CancellationToken, SingleThreadedAgentRuntime
from autogen_core.models import ChatCompletionClient
from autogen_core.tools import Workbench

from graphflow_durable._agentstate.encoder import StateLog
from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.records import RunLog, RunRecord, RunStatus
from graphflow_durable._model.restore import Plan, cursor_from_log, plan
from graphflow_durable._runtime.container import DurableChatAgentContainer
from graphflow_durable._runtime.manager import DurableGraphFlowManager
from graphflow_durable._runtime.stops import flow_logger
from graphflow_durable.ratelimit import (
    RateLimit,
    RateLimitedChatCompletionClient,
    rate_limited,
    rate_limits_of,
)
from graphflow_durable.recorded import RecordedChatCompletionClient, recorded
from graphflow_durable.scheduler import GraphSpec
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunUpdate, Step, StepKind, Store

__all__ = [
    "TeamView",
    "imported",
    "last_round",
    "limit_calls",
    "record_calls",
    "restore",
    "state_of",
    "stored_result",
]

#: Where AutoGen's agents and teams hold the agents and teams inside them: a SocietyOfMindAgent's
#: inner team, a group chat's participants, a MessageFilterAgent's wrapped agent.
_INNER = ("_team", "_participants", "_wrapped_agent")


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

    async def reset_agents(self) -> None:
        """Reset every participant agent (``on_reset``): what its saved state does not hold is gone,
        as in a new process. A nested team is left alone: its own run restores it."""
        for participant in self._team._participants:
            if isinstance(participant, ChatAgent):
                await participant.on_reset(CancellationToken())

    async def load_plain(self, state: Mapping[str, Any]) -> None:
        """Load a team state into the team in memory, as GraphFlow does."""
        await GraphFlow.load_state(self._team, state)

    async def wind_down(self, advance: asyncio.Future[Any], grace: float, run_id: str) -> bool:
        """After an interrupt: wait up to ``grace`` seconds (``interrupt_grace_seconds``) for
        GraphFlow's stream (``advance``) to end: the agents already running answer and are recorded.
        Past it, or on a second cancellation, cancel the embedded runtime's message handlers still
        running (the agents' turns; on another runtime they are not ours to stop) and stop waiting.
        Returns whether the stream ended."""
        try:
            await asyncio.wait({advance}, timeout=grace)
        except asyncio.CancelledError:
            pass  # a second interrupt: stop waiting at once
        if advance.done():
            if not advance.cancelled():
                advance.exception()  # retrieved: the interrupt is what the caller sees
            return True
        cancelled = 0
        runtime = self._team._runtime
        if isinstance(runtime, SingleThreadedAgentRuntime) and self._team._embedded_runtime:
            running = [t for t in runtime._background_tasks if not t.done()]
            for task in running:
                task.cancel()
            cancelled = len(running)
            if not running:  # no agent turn was running: nothing is lost, nothing to warn of
                flow_logger.info("run %s: interrupted; no agent turn was running, stopped waiting", run_id)
                return False
        flow_logger.warning(
            "run %s: interrupted, but %d agent turn(s) did not end within interrupt_grace_seconds=%g; "
            "stopped waiting: the run is left interrupted and those nodes run again on resume",
            run_id,
            cancelled,
            grace,
        )
        return False

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


async def restore(team: TeamView, store: Store, run_id: str, spec: GraphSpec, states: StateLog) -> Plan:
    """Put ``team`` at the store's head of ``run_id``; ``states`` (the agent-state writer) learns
    the run's message count. The log is read in a thread: a long run's takes tens of milliseconds
    (more while the database is unreachable), which the process's other runs would otherwise wait
    through."""
    log = await asyncio.to_thread(store.load, run_id)
    at = plan(log, spec, team.participant_names)
    await team.restore(at, log.agent_states, run_id)
    states.prime(log.run.message_count)
    return at


def imported(
    team: TeamView, spec: GraphSpec, state: Mapping[str, Any], *, origin: int
) -> tuple[Step, list[MessageRecord], list[AgentStateRecord], RunUpdate]:
    """The commit that seeds a run with a loaded state: its thread (from message ``origin`` on),
    agent states and cursor."""
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
    step = Step(StepKind.IMPORT, None, cursor.to_json(spec), {"dispatches": ext.get("dispatches", {})})
    return step, records, states, RunUpdate(status=status, result={"stop_reason": reason})


def stored_result(
    log: RunLog, spec: GraphSpec, run: RunRecord, create: Callable[[Mapping[str, Any]], Any]
) -> TaskResult:
    """The result of the run's last round (``log``: the run's), as its uninterrupted run returned it."""
    cursor = cursor_from_log(log, spec)
    thread = [m for m in log.messages if m.seq >= cursor.origin + cursor.round_start]
    result = run.result if isinstance(run.result, Mapping) else {}
    return TaskResult(messages=[create(m.body) for m in thread], stop_reason=result.get("stop_reason"))


def last_round(team: TeamView, log: RunLog, spec: GraphSpec) -> list[tuple[Mapping[str, Any], bool]]:
    """The run's last round (``log``: the run's): each message's dump and whether it was user input."""
    return plan(log, spec, team.participant_names).current_round()


async def state_of(
    team: TeamView, log: RunLog, spec: GraphSpec, run_id: str, fingerprint: str
) -> dict[str, Any]:
    """The team state (TeamState dump, durable format) at the head of ``log`` (the run, or its
    cut at a past step); a participant with no stored state there gives its current one."""
    at = plan(log, spec, team.participant_names)
    states = {
        name: log.agent_states[name] if name in log.agent_states else await team.agent_state(name)
        for name in team.participant_names
    }
    result = log.run.result if isinstance(log.run.result, Mapping) else {}
    return at.team_state(run_id, team.manager_name, states, fingerprint, result.get("stop_reason"))


def _agents(participants: Sequence[ChatAgent | Team]) -> Iterator[Any]:
    """Every participant, and the agents inside nested teams and SocietyOfMindAgents, once each."""
    seen: set[int] = set()
    pending: list[Any] = list(participants)
    while pending:
        agent = pending.pop()
        if id(agent) in seen:
            continue
        seen.add(id(agent))
        yield agent
        for attribute in _INNER:
            inner = getattr(agent, attribute, None)
            if isinstance(inner, (ChatAgent, Team)):
                pending.append(inner)
            elif isinstance(inner, Sequence) and not isinstance(inner, str):
                pending.extend(p for p in inner if isinstance(p, (ChatAgent, Team)))


def _recording(client: ChatCompletionClient) -> bool:
    """Whether ``client`` records already: it, or a client it wraps (``rate_limited(recorded(c))``)."""
    found: Any = client
    while isinstance(found, ChatCompletionClient):
        if isinstance(found, RecordedChatCompletionClient):
            return True
        found = getattr(found, "inner", None)
    return False


def record_calls(participants: Sequence[ChatAgent | Team]) -> None:
    """Wrap the model client (``_model_client``: AssistantAgent and its subclasses,
    SocietyOfMindAgent, CodeExecutorAgent) and the workbenches (``_workbench``) of every
    participant, and of the agents inside nested teams and SocietyOfMindAgents, with
    :func:`~graphflow_durable.recorded`; a client that records already (itself or a client it wraps)
    is never wrapped again."""
    for agent in _agents(participants):
        client = getattr(agent, "_model_client", None)
        if isinstance(client, ChatCompletionClient) and not _recording(client):
            agent._model_client = recorded(client)
        benches = getattr(agent, "_workbench", None)
        if isinstance(benches, Sequence) and benches and all(isinstance(w, Workbench) for w in benches):
            agent._workbench = [recorded(w) for w in benches]


def limit_calls(participants: Sequence[ChatAgent | Team], given: Any) -> tuple[RateLimit, ...]:
    """Wrap the model client of every agent :func:`record_calls` reaches with
    :func:`~graphflow_durable.rate_limited` (``given``: a RateLimit or a list, ``None``: none; the
    run's store), inside a recording wrapper (a replayed call spends nothing); a client already
    rate-limited is left as it is. Return the limits (a ``UsageError`` for a bad ``given``)."""
    limits = () if given is None else rate_limits_of(given)
    if not limits:
        return limits
    for agent in _agents(participants):
        client = getattr(agent, "_model_client", None)
        if isinstance(client, RecordedChatCompletionClient):
            if not isinstance(client.inner, RateLimitedChatCompletionClient):
                agent._model_client = RecordedChatCompletionClient(rate_limited(client.inner, limits))
        elif isinstance(client, ChatCompletionClient) and not isinstance(
            client, RateLimitedChatCompletionClient
        ):
            agent._model_client = rate_limited(client, limits)
    return limits
