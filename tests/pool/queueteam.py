"""The flow-control test team: A -> B, each turn a slow deterministic agent that logs when it ran.

``team(run_id, **durable)`` is the factory workers load (``queueteam:team``). Each turn sleeps
``$GFD_AGENT_DELAY`` seconds (default 0.2), then appends ``run_id node pid start end`` (epoch
seconds, the agent's own clock) to ``$GFD_EXEC_LOG``: a turn killed while it sleeps is not logged.
While the file ``$GFD_HOLD`` exists, B waits (a test keeps the runs in flight meanwhile).
``$GFD_START_LOG``: each turn also appends ``run_id node pid start`` there when it starts.
``$GFD_SELF_STOP`` (``RUN:NODE`` or ``RUN:build``): the worker process SIGSTOPs itself once, at the
end of that turn (after its log line) or when the factory builds that run's team, and the file
``$GFD_SELF_STOP_MARK`` says it did (a test stalls a driver exactly there).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraphBuilder

from graphflow_durable.context import current_execution
from graphflow_durable.flow import DurableGraphFlow

# Worker processes import this module by ``queueteam:team`` with only tests/pool on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted  # tests/agents.py: the one set of test agents


def self_stop(where: str) -> None:
    """SIGSTOP this process once if ``$GFD_SELF_STOP`` names ``where`` (see the module docstring)."""
    mark = os.environ.get("GFD_SELF_STOP_MARK")
    if os.environ.get("GFD_SELF_STOP") != where or not mark or Path(mark).exists():
        return
    Path(mark).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)


async def timed_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    """Sleep like a model call and log the turn's start and end."""
    started = time.time()
    execution = current_execution()
    start_log = os.environ.get("GFD_START_LOG")
    if start_log and execution is not None:
        with open(start_log, "a") as f:
            f.write(f"{execution.run_id} {agent.name} {os.getpid()} {started:.6f}\n")
    await asyncio.sleep(float(os.environ.get("GFD_AGENT_DELAY", "0.2")))
    hold = os.environ.get("GFD_HOLD")
    while agent.name == "B" and hold and Path(hold).exists():
        await asyncio.sleep(0.05)
    log = os.environ.get("GFD_EXEC_LOG")
    if log and execution is not None:
        with open(log, "a") as f:
            f.write(f"{execution.run_id} {agent.name} {os.getpid()} {started:.6f} {time.time():.6f}\n")
        self_stop(f"{execution.run_id}:{agent.name}")


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> B."""
    self_stop(f"{run_id}:build")
    a, b = Scripted("A", before=timed_turn), Scripted("B", before=timed_turn)
    graph = DiGraphBuilder().add_node(a).add_node(b).add_edge(a, b).build()
    return DurableGraphFlow([a, b], graph, run_id=run_id, **durable)


def turns(log: Path) -> list[tuple[str, str, int, float, float]]:
    """The logged turns: ``(run_id, node, pid, start, end)``."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(r[0], r[1], int(r[2]), float(r[3]), float(r[4])) for r in rows]


def most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    """The most ``(start, end)`` intervals that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best
