"""The worker-pool test team: fan-out, join and a loop, with slow deterministic agents.

``team(run_id, **durable)`` is the factory workers load (``poolteam:team``). Each agent answers with
its name, its turn and a digest of its input (see tests/agents.py), after sleeping
``$GFD_AGENT_DELAY`` seconds (default 0.05). Each turn is appended to ``$GFD_EXEC_LOG`` if set.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable.flow import DurableGraphFlow


class Slow(BaseChatAgent):
    def __init__(self, name: str, says: Sequence[str] = ()) -> None:
        super().__init__(name, f"slow scripted agent {name}")
        self.turn = 0
        self.says = list(says)

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        self.turn += 1
        await asyncio.sleep(float(os.environ.get("GFD_AGENT_DELAY", "0.05")))
        log = os.environ.get("GFD_EXEC_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {self.name} {self.turn}\n")
        seen = hashlib.sha256("|".join(m.to_text() for m in messages).encode()).hexdigest()[:8]
        extra = self.says[self.turn - 1] if self.turn <= len(self.says) else ""
        content = f"{self.name}#{self.turn} saw {len(messages)}:{seen} {extra}".rstrip()
        return Response(chat_message=TextMessage(content=content, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        self.turn = 0

    async def save_state(self) -> Mapping[str, Any]:
        return {"turn": self.turn}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.turn = int(state["turn"])


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """S -> (P1, P2, P3) in parallel -> J (join) -> R; R -> J again twice ("any"), then R -> E."""
    s, p1, p2, p3, j, e = (Slow(n) for n in ("S", "P1", "P2", "P3", "J", "E"))
    r = Slow("R", says=["again", "again", "done"])
    b = DiGraphBuilder()
    for agent in (s, p1, p2, p3, j, r, e):
        b.add_node(agent)
    for p in (p1, p2, p3):
        b.add_edge(s, p).add_edge(p, j, activation_group="join")
    b.add_edge(j, r)
    b.add_edge(r, j, condition="again", activation_group="loop", activation_condition="any")
    b.add_edge(r, e, condition="done")
    b.set_entry_point(s)
    return DurableGraphFlow(
        [s, p1, p2, p3, j, r, e],
        b.build(),
        termination_condition=MaxMessageTermination(60),
        run_id=run_id,
        **durable,
    )


#: Completions per node of one uninterrupted run.
EXPECTED_COMPLETIONS = {"S": 1, "P1": 1, "P2": 1, "P3": 1, "J": 3, "R": 3, "E": 1}
