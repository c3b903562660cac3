"""When a round ends: GraphFlow's termination checks and the park for human input.

:class:`RoundStops` is held by the :class:`~graphflow_durable._runtime.manager.DurableGraphFlowManager`
and decides, without committing anything, whether a round stops: the checks at the end of a batch
(natural end, termination condition, ``max_turns``, in GraphFlow's order, mirroring
``GraphFlowManager._apply_termination_condition``), the termination condition's replay of a
resumed round's history, and which in-flight nodes wait for a person (it is the one owner of
those parked nodes). The manager commits what it decides and signals the end.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from autogen_agentchat.base import TerminationCondition
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, StopMessage
from autogen_agentchat.teams._group_chat._graph._digraph_group_chat import _DIGRAPH_STOP_MESSAGE

from graphflow_durable._runtime.gate import GroupChatInputPending
from graphflow_durable.scheduler import GraphSpec, SchedulerState, finish

__all__ = ["RoundStops"]

#: The stops are the manager's decisions: they log as the manager does, so log filters keep working.
logger = logging.getLogger("graphflow_durable._runtime.manager")


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
