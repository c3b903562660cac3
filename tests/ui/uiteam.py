"""The console tests' teams: small graphs of deterministic agents, built by the tests themselves
and by ``graphflow-durable worker`` processes (``--team approval=uiteam:approval``, with tests/ui
on ``PYTHONPATH``).

- :func:`approval`: ``draft -> approver -> publish``; the approver is a ``UserProxyAgent`` that
  waits for a person (``human_input="wait"``): the run parks ``waiting`` until someone answers.
- :func:`slow`: ``step1 -> step2 -> ... -> step8``, each turn sleeping ``$UI_AGENT_DELAY`` seconds
  (default 0.4): a run another process drives while a browser watches it.
- :func:`flaky`: ``fetch -> summarize -> report``; ``summarize`` raises on every call and has one
  attempt, so the run fails on it with its budget spent (what "supply" answers for).
- :func:`literal`: ``say1 -> say2 -> ...``, each saying one of the given words literally (the
  hostile payloads).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from typing import Any

from autogen_agentchat.agents import BaseChatAgent, UserProxyAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, RetryPolicy

SLOW_STEPS = 8


class Says(BaseChatAgent):
    """Answers its ``words`` literally, one per turn (then ``"<name> done"``); sleeps ``delay`` first;
    raises ``ConnectionError`` on every call when ``fails``."""

    def __init__(
        self, name: str, words: Sequence[str] = (), *, delay: float = 0.0, fails: bool = False
    ) -> None:
        super().__init__(name, f"says {name}")
        self.words = list(words)
        self.delay = delay
        self.fails = fails
        self.turn = 0

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        self.turn += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fails:
            raise ConnectionError(f"{self.name}: the summarizer's service is unreachable")
        text = self.words[self.turn - 1] if self.turn <= len(self.words) else f"{self.name} done"
        return Response(chat_message=TextMessage(content=text, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        self.turn = 0

    async def save_state(self) -> dict[str, Any]:
        return {"turn": self.turn}

    async def load_state(self, state: Any) -> None:
        self.turn = int(state["turn"])


def never_asked(prompt: str) -> str:
    raise AssertionError("in wait mode the input function is not called: the answer comes from respond()")


def approval(run_id: str, **durable: Any) -> DurableGraphFlow:
    """``draft -> approver -> publish``, the approver waiting for a person."""
    draft = Says("draft", ["Draft: refund 42 EUR to order 1234."])
    approver = UserProxyAgent("approver", input_func=never_asked)
    publish = Says("publish", ["Refund issued."])
    graph = (
        DiGraphBuilder().add_node(draft).add_node(approver).add_node(publish)
        .add_edge(draft, approver).add_edge(approver, publish)
        .build()
    )  # fmt: skip
    return DurableGraphFlow([draft, approver, publish], graph, run_id=run_id, human_input="wait", **durable)


def slow(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A chain of :data:`SLOW_STEPS` nodes, each turn taking ``$UI_AGENT_DELAY`` seconds."""
    delay = float(os.environ.get("UI_AGENT_DELAY", "0.4"))
    agents = [
        Says(f"step{i}", [f"step {i} of {SLOW_STEPS} done"], delay=delay) for i in range(1, SLOW_STEPS + 1)
    ]
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    for a, b in itertools.pairwise(agents):
        builder.add_edge(a, b)
    return DurableGraphFlow(agents, builder.build(), run_id=run_id, **durable)


def flaky(run_id: str, **durable: Any) -> DurableGraphFlow:
    """``fetch -> summarize -> report``; ``summarize`` always fails and is attempted once."""
    fetch = Says("fetch", ["fetched 3 documents"])
    summarize = Says("summarize", fails=True)
    report = Says("report", ["report written"])
    graph = (
        DiGraphBuilder().add_node(fetch).add_node(summarize).add_node(report)
        .add_edge(fetch, summarize).add_edge(summarize, report)
        .build()
    )  # fmt: skip
    once = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)
    return DurableGraphFlow([fetch, summarize, report], graph, run_id=run_id, retry=once, **durable)


def literal(run_id: str, words: Sequence[str], **durable: Any) -> DurableGraphFlow:
    """A chain ``say1 -> say2 -> ...``, node ``say<i>`` saying ``words[i-1]`` literally."""
    agents = [Says(f"say{i}", [word]) for i, word in enumerate(words, 1)]
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    for a, b in itertools.pairwise(agents):
        builder.add_edge(a, b)
    return DurableGraphFlow(agents, builder.build(), run_id=run_id, **durable)
