"""Team factories for ``graphflow-durable check``: one team as it was deployed and the same team
changed in each way the check must notice. Every agent counts each call the check must never make
(``on_messages``, ``on_messages_stream``, ``on_reset``) and each state it loads, in :data:`CALLS`.

The team: A -> B -> C, or A -> B / A -> C by :func:`to_b` / :func:`to_c` (:func:`rerouted`). The
conditions read :data:`ROUTE`, so a test changes what they decide without changing their names (the
graph's fingerprint describes a callable condition by its name only).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_agentchat.teams import DiGraph, DiGraphBuilder
from autogen_core import CancellationToken

from agents import OPEN_TEAMS, Scripted, fail_once
from graphflow_durable import DurableGraphFlow

#: Calls made on the agents, by kind: "on_messages", "on_messages_stream", "on_reset", "load_state".
CALLS: Counter[str] = Counter()
#: Where the conditional edges of :func:`rerouted` send A's answer ("B" or "C").
ROUTE = "B"


class Counted(Scripted):
    """A :class:`Scripted` agent that counts its calls in :data:`CALLS`."""

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        CALLS["on_messages"] += 1
        return await super().on_messages(messages, cancellation_token)

    async def on_messages_stream(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | Response, None]:
        CALLS["on_messages_stream"] += 1
        async for item in super().on_messages_stream(messages, cancellation_token):
            yield item

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        CALLS["on_reset"] += 1
        await super().on_reset(cancellation_token)

    async def load_state(self, state: Mapping[str, Any]) -> None:
        CALLS["load_state"] += 1
        await super().load_state(state)


class Remembering(Counted):
    """The new B: its state holds a memory, and it refuses a state saved without one."""

    async def save_state(self) -> Mapping[str, Any]:
        return {"turn": self.turn, "memory": []}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        CALLS["load_state"] += 1
        if "memory" not in state:
            raise ValueError(f"state of {self.name!r} has no 'memory' (saved by an older version?)")
        self.turn = int(state["turn"])


def to_b(message: BaseChatMessage) -> bool:
    return ROUTE == "B"


def to_c(message: BaseChatMessage) -> bool:
    return ROUTE == "C"


def _team(
    run_id: str, agents: Sequence[Scripted], graph: DiGraph, durable: dict[str, Any]
) -> DurableGraphFlow:
    team = DurableGraphFlow(list(agents), graph, run_id=run_id, **durable)
    OPEN_TEAMS.append(team)
    return team


def _chain(agents: Sequence[Scripted], *extra: tuple[str, str]) -> DiGraph:
    builder = DiGraphBuilder()
    named = {a.name: a for a in agents}
    for agent in agents:
        builder.add_node(agent)
    for source, target in itertools.pairwise(agents):
        builder.add_edge(source, target)
    for source_name, target_name in extra:
        builder.add_edge(named[source_name], named[target_name])
    builder.set_entry_point(agents[0])
    return builder.build()


def make_team(run_id: str, *, b_fails: bool = False, **durable: Any) -> DurableGraphFlow:
    """The deployed team: A -> B -> C (``b_fails``: B's first turn raises)."""
    agents = [Counted("A"), Counted("B", before=fail_once() if b_fails else None), Counted("C")]
    return _team(run_id, agents, _chain(agents), durable)


def with_extra_node(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> B -> C -> D: a node added."""
    agents = [Counted("A"), Counted("B"), Counted("C"), Counted("D")]
    return _team(run_id, agents, _chain(agents), durable)


def with_changed_edge(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> B -> C plus A -> C: an edge added (C now waits for A and B)."""
    agents = [Counted("A"), Counted("B"), Counted("C")]
    return _team(run_id, agents, _chain(agents, ("A", "C")), durable)


def with_new_agent(run_id: str, **durable: Any) -> DurableGraphFlow:
    """The same graph with B's new class, whose ``load_state`` refuses B's old state."""
    agents = [Counted("A"), Remembering("B"), Counted("C")]
    return _team(run_id, agents, _chain(agents), durable)


def rerouted(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> B if :func:`to_b`, A -> C if :func:`to_c` (both "any": either may run alone)."""
    agents = [Counted("A"), Counted("B"), Counted("C")]
    a, b, c = agents
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    builder.add_edge(a, b, condition=to_b).add_edge(a, c, condition=to_c)
    builder.set_entry_point(a)
    return _team(run_id, agents, builder.build(), durable)


def not_a_team(run_id: str, **durable: Any) -> object:
    """A factory that returns something else."""
    return {"run_id": run_id}


def needs_more(run_id: str, *, store: Any, lease_owner: str) -> DurableGraphFlow:
    """A factory that cannot be called as ``factory(run_id, store=...)``."""
    raise AssertionError("never called")
