"""The worker-pool test team: fan-out, join and a loop, with slow deterministic agents.

``team(run_id, **durable)`` is the factory workers load (``poolteam:team``). Its agents are the
shared :class:`agents.Scripted` (tests/agents.py: each answers with its name, its turn and a digest
of its input); before answering, each turn sleeps ``$GFD_AGENT_DELAY`` seconds (default 0.05) and
is appended to ``$GFD_EXEC_LOG`` (if set) as ``pid node turn``. While the file ``$GFD_HOLD`` exists,
the last node E waits: the chaos test keeps every run unfinished until its kills and stops are done.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraphBuilder

from graphflow_durable.flow import DurableGraphFlow

# Worker processes import this module by ``poolteam:team`` with only tests/pool on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted  # tests/agents.py: the one set of test agents


async def slow_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    """Sleep like a model call, then log the turn (a turn that is killed while sleeping is not logged)."""
    await asyncio.sleep(float(os.environ.get("GFD_AGENT_DELAY", "0.05")))
    hold = os.environ.get("GFD_HOLD")
    while agent.name == "E" and hold and Path(hold).exists():
        await asyncio.sleep(0.05)
    log = os.environ.get("GFD_EXEC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {agent.name} {agent.turn}\n")


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """S -> (P1, P2, P3) in parallel -> J (join) -> R; R -> J again twice ("any"), then R -> E."""
    s, p1, p2, p3, j, e = (Scripted(n, before=slow_turn) for n in ("S", "P1", "P2", "P3", "J", "E"))
    r = Scripted("R", ["again", "again", "done"], before=slow_turn)
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
        interrupt_grace_seconds=float(os.environ.get("GFD_INTERRUPT_GRACE", "5")),
        **durable,
    )


#: Completions per node of one uninterrupted run.
EXPECTED_COMPLETIONS = {"S": 1, "P1": 1, "P2": 1, "P3": 1, "J": 3, "R": 3, "E": 1}
