"""A process for the human-in-the-loop tests: a fan-out with a person on one branch.

Usage: ``python tests/crash/human_worker.py STORE_URL RUN_ID MODE [KILL]`` where MODE is

- ``start``: ``run(task="go")`` with ``human_input="wait"``;
- ``resume``: ``run()`` with ``human_input="wait"``;
- ``inline``: ``run(task="go")`` with ``human_input="inline"`` (the input function answers);
- ``plain``: the same team as a plain ``GraphFlow``, the input function answering (the reference).

Graph: ``A -> (H, B) -> C`` (C joins both); H is a ``UserProxyAgent`` whose input function answers
``$GFD_ANSWER`` (default ``"approved"``). Each line of ``$GFD_EXEC_LOG``: ``pid node`` for a
scripted agent's turn, ``pid ASK`` for a call of the input function. With ``KILL`` = ``H``, the
process SIGKILLs itself after H's turn produced its answer and before the manager commits it.
Prints the returned ``TaskResult`` as JSON: ``{"messages": [[source, text], ...], "stop_reason"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow
from autogen_core import CancellationToken

from graphflow_durable.flow import DurableGraphFlow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, die, log_turn

KILL: str | None = None
URL, RUN_ID = "", ""
#: B has answered: the person answers only then, so H's answer always follows B's in the thread
#: (the two branches race otherwise, and a plain GraphFlow's transcript order would vary).
B_DONE = threading.Event()


async def record_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    log_turn(agent.name)


def person(prompt: str) -> str:
    log_turn("ASK")
    B_DONE.wait(30)
    time.sleep(0.2)  # B's answer is on its way to the manager before H's
    if URL.startswith(("sqlite", "postgresql")):  # a durable run: wait until B's answer is committed
        from graphflow_durable import Store

        with Store(URL) as store:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if any(m.body.get("source") == "B" for m in store.load(RUN_ID).messages):
                    break
                time.sleep(0.02)
    return os.environ.get("GFD_ANSWER", "approved")


class Branch(Scripted):
    """A scripted agent that tells the person when B has answered."""

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        response = await super().on_messages(messages, cancellation_token)
        if self.name == "B":
            B_DONE.set()
        return response


class Human(UserProxyAgent):
    """A UserProxyAgent that can die right after its answer, before the manager records it."""

    async def on_messages_stream(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | Response, None]:
        async for item in super().on_messages_stream(messages, cancellation_token):
            if isinstance(item, Response) and self.name == KILL:
                die()
            yield item


def team(url: str, run_id: str, mode: str) -> GraphFlow:
    a, b, c = (Branch(n, before=record_turn) for n in "ABC")
    h = Human("H", input_func=person)
    graph = (
        DiGraphBuilder().add_node(a).add_node(h).add_node(b).add_node(c)
        .add_edge(a, h).add_edge(a, b).add_edge(h, c).add_edge(b, c)
        .build()
    )  # fmt: skip
    if mode == "plain":
        return GraphFlow([a, h, b, c], graph)
    human = "inline" if mode == "inline" else "wait"
    return DurableGraphFlow([a, h, b, c], graph, store=url, run_id=run_id, human_input=human)


async def main(argv: list[str]) -> int:
    global KILL, URL, RUN_ID
    url, run_id, mode = argv[0], argv[1], argv[2]
    URL, RUN_ID = url, run_id
    KILL = argv[3] if len(argv) > 3 else None
    result = await team(url, run_id, mode).run(task=None if mode == "resume" else "go")
    messages = [[m.source, m.to_text()] for m in result.messages if isinstance(m, BaseChatMessage)]
    sys.stdout.write(json.dumps({"messages": messages, "stop_reason": result.stop_reason}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))


def pool(run_id: str, **durable: Any) -> DurableGraphFlow:
    """The worker-pool factory (``human_worker:pool``): the same team, ``human_input="wait"``."""
    a, b, c = (Branch(n, before=record_turn) for n in "ABC")
    h = Human("H", input_func=person)
    graph = (
        DiGraphBuilder().add_node(a).add_node(h).add_node(b).add_node(c)
        .add_edge(a, h).add_edge(a, b).add_edge(h, c).add_edge(b, c)
        .build()
    )  # fmt: skip
    return DurableGraphFlow([a, h, b, c], graph, run_id=run_id, human_input="wait", **durable)
