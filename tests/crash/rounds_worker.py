"""A worker process for the round-lifecycle crash tests: a chain stopped by its termination
condition, continued by ``run()`` with no task, optionally SIGKILLed during one agent's turn.

Usage: ``python tests/crash/rounds_worker.py STORE_URL RUN_ID (start|continue) [KILL_NODE]``.
``start`` calls ``run(task="go")``, ``continue`` calls ``run()``; both print the returned
``TaskResult`` as JSON (``{"messages": [[source, content], ...], "stop_reason": ...}``). Graph:
``A -> B -> C -> D -> E`` with ``MaxMessageTermination(3)``. Every agent turn is appended to
``$GFD_EXEC_LOG`` as ``pid node turn``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable.flow import DurableGraphFlow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain, die, log_turn

KILL_NODE: str | None = None


async def record_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    log_turn(agent.name, agent.turn)
    if agent.name == KILL_NODE:
        die()


async def main(argv: list[str]) -> int:
    global KILL_NODE
    url, run_id, mode = argv[0], argv[1], argv[2]
    KILL_NODE = argv[3] if len(argv) > 3 else None
    agents = [Scripted(n, before=record_turn) for n in "ABCDE"]
    team = DurableGraphFlow(
        agents, chain(*agents), termination_condition=MaxMessageTermination(3), store=url, run_id=run_id
    )
    result = await team.run(task="go" if mode == "start" else None)
    messages = [[m.source, m.to_text()] for m in result.messages if isinstance(m, BaseChatMessage)]
    sys.stdout.write(json.dumps({"messages": messages, "stop_reason": result.stop_reason}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
