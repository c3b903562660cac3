"""A worker whose middle node runs a nested DurableGraphFlow, for the nested-resume crash test.

Usage: ``python tests/crash/nested_worker.py STORE_URL [kill] [inherit]``. Outer graph:
``A -> T -> Z``; ``T`` runs an inner durable team ``I1 -> I2 -> I3`` whose run id is T's
idempotency key, so a re-run of T after a crash resumes the inner run instead of starting it
again. By default the inner team is given its store and run id explicitly (the documented
pattern); with ``inherit`` it is given neither and takes both from the outer turn. With ``kill``
the process SIGKILLs itself during I2's turn. Agent turns are logged to ``$GFD_EXEC_LOG``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, current_execution

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, TextAgent, chain, die, log_turn  # tests/agents.py

KILL = False
INHERIT = False


async def record(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    log_turn(agent.name, agent.turn)
    if KILL and agent.name == "I2":
        die()


class TeamAgent(TextAgent):
    """An agent whose turn is a whole inner durable team, resumable through the execution context."""

    def __init__(self, name: str, url: str) -> None:
        super().__init__(name, "runs an inner team")
        self._url = url

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        ctx = current_execution()
        assert ctx is not None, "a durable node runs inside an execution context"
        inner_agents = [Scripted(n, before=record) for n in ("I1", "I2", "I3")]
        if INHERIT:
            inner = DurableGraphFlow(inner_agents, chain(*inner_agents), name="inner")
        else:
            inner = DurableGraphFlow(
                inner_agents, chain(*inner_agents), store=self._url, run_id=f"inner:{ctx.idempotency_key}"
            )
        result = await inner.run(task=list(messages))
        last = result.messages[-1]
        return Response(chat_message=TextMessage(content=f"T got: {last.to_text()}", source=self.name))


async def main(argv: list[str]) -> int:
    global KILL, INHERIT
    url = argv[0]
    KILL, INHERIT = "kill" in argv[1:], "inherit" in argv[1:]
    a, z = Scripted("A", before=record), Scripted("Z", before=record)
    t = TeamAgent("T", url)
    team = DurableGraphFlow([a, t, z], chain(a, t, z), store=url, run_id="outer")  # type: ignore[list-item]
    info = team.run_info()
    result = await team.run(task=None if info is not None and info.status == "finished" else "go")
    sys.stdout.write(json.dumps([[m.source, m.to_text()] for m in result.messages]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
