"""A worker process for the recorded-call tests: an ``AssistantAgent`` turn of three model calls and
two tools with side effects, under ``DurableGraphFlow(record_calls=True)``; it may SIGKILL itself.

Usage: ``python tests/crash/calls_worker.py STORE_URL RUN_ID [options]``

- ``--kill model:N``: SIGKILL at the start of this process's N-th live model call (before it is made:
  the calls before it and their tools are recorded);
- ``--kill tool:NAME``: SIGKILL inside the tool NAME, after its side effect is on the ledger;
- ``--kill commit``: SIGKILL just before the clerk's completion is committed (its last model call
  recorded, the turn not);
- ``--stream``: ``model_client_stream=True``;
- ``--lease S``: the lease period; ``--hold-tool NAME:S``: the tool NAME logs ``start NAME`` and
  then waits S seconds before its side effect (a test freezes the process meanwhile);
- ``--fail-model N``: this process's N-th live model call raises ``ConnectionError`` (retryable);
  ``--retry K``: ``retry=RetryPolicy(max_attempts=K)`` on every node;
- ``--unrecorded``: without ``record_calls=True`` (what the tests prove fails without it);
- ``--shared-id``: the clerk asks for two refunds in one answer, both calls with the id ``""`` (as
  some OpenAI-compatible servers send), then says so (model calls at positions 0 and 2).

The graph: ``clerk`` (looks the order up, refunds it, says so: model calls at positions 0, 1, 2,
tools ``lookup_order`` and ``issue_refund``) -> ``auditor`` (one model call). Every live model call
(``<pid> model <agent> <position>``) and every tool's side effect (``<pid> <tool> <args>``) is
appended to ``$GFD_EXEC_LOG``. On a normal end one JSON line is printed: the stored transcript
(without message ids and times), the stored agent states, and the streamed chunks this process saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ModelClientStreamingChunkEvent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, LLMMessage, RequestUsage

from graphflow_durable import DurableGraphFlow, RetryPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from agents import die, log_turn
from scripted_model import CLERK_SCRIPT, ScriptedModel, ledger_tools

TASK = "Refund order A17."


class Counted(ScriptedModel):
    """The scripted model, with this process's kill or failure at its N-th live call."""

    kill_at: int | None = None
    fail_at: int | None = None
    process_calls = 0  # live calls in this process, every agent's

    def _live(self, messages: Sequence[LLMMessage]) -> CreateResult:
        Counted.process_calls += 1
        if Counted.process_calls == Counted.kill_at:
            die()
        if Counted.process_calls == Counted.fail_at:
            raise ConnectionError(f"{self.agent}: connection reset by peer")
        return super()._live(messages)


class SharedIds(Counted):
    """The clerk of ``--shared-id``: two refunds in one answer, each call with the id ``""``."""

    def answer(self, messages: Sequence[LLMMessage]) -> CreateResult:
        results = self.tool_results(messages)
        prompt = sum(len(str(m.content)) for m in messages) // 4 + 1
        if results:
            text = f"Refunds done ({'; '.join(results)})"
            usage = RequestUsage(prompt_tokens=prompt, completion_tokens=len(text) // 4 + 1)
            return CreateResult(finish_reason="stop", content=text, usage=usage, cached=False)
        calls = [
            FunctionCall(id="", name="issue_refund", arguments=json.dumps({"order_id": o, "amount": a}))
            for o, a in (("A17", 40.0), ("B42", 15.0))
        ]
        usage = RequestUsage(prompt_tokens=prompt, completion_tokens=20)
        return CreateResult(finish_reason="function_calls", content=list(calls), usage=usage, cached=False)


def build(url: str, run_id: str, args: argparse.Namespace) -> DurableGraphFlow:
    log = os.environ.get("GFD_EXEC_LOG")
    hold_name, _, hold_seconds = (args.hold_tool or "").partition(":")
    kill_tool = args.kill.partition(":")[2] if args.kill and args.kill.startswith("tool:") else None

    async def before(name: str) -> None:
        if name == hold_name:
            log_turn("start", name)
            await asyncio.sleep(float(hold_seconds))

    async def during(name: str) -> None:
        if name == kill_tool:
            die()

    clerk = AssistantAgent(
        "clerk",
        model_client=(SharedIds if args.shared_id else Counted)("clerk", CLERK_SCRIPT, log=log),
        tools=ledger_tools(log, before=before, during=during),
        max_tool_iterations=3,
        model_client_stream=args.stream,
    )
    auditor = AssistantAgent(
        "auditor",
        model_client=Counted("auditor", ["Audited"], log=log),
        model_client_stream=args.stream,
    )
    graph = DiGraphBuilder().add_node(clerk).add_node(auditor).add_edge(clerk, auditor).build()
    extra: dict[str, Any] = {}
    if args.lease is not None:
        extra["lease_seconds"] = args.lease
    if args.retry is not None:
        extra["retry"] = RetryPolicy(max_attempts=args.retry, initial_interval=0.05, jitter=False)
    if not args.unrecorded:
        extra["record_calls"] = True
    return DurableGraphFlow([clerk, auditor], graph, store=url, run_id=run_id, **extra)


def arm_commit_kill(team: DurableGraphFlow, node: str) -> None:
    """SIGKILL just before ``node``'s completion is handed to the store."""
    commits = team._session.commits
    write = commits.write

    async def dying_write(step: Any, *rest: Any, **how: Any) -> int:
        if step.kind == "complete" and step.node == node:
            die()
        return await write(step, *rest, **how)

    commits.write = dying_write  # type: ignore[method-assign]


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("run_id")
    parser.add_argument("--kill")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--lease", type=float)
    parser.add_argument("--hold-tool")
    parser.add_argument("--fail-model", type=int)
    parser.add_argument("--retry", type=int)
    parser.add_argument("--unrecorded", action="store_true")
    parser.add_argument("--shared-id", action="store_true")
    args = parser.parse_args(argv)
    if args.kill and args.kill.startswith("model:"):
        Counted.kill_at = int(args.kill.partition(":")[2])
    Counted.fail_at = args.fail_model
    team = build(args.url, args.run_id, args)
    if args.kill == "commit":
        arm_commit_kill(team, "clerk")
    chunks: list[str] = []
    async for item in team.run_stream(task=TASK):
        if isinstance(item, ModelClientStreamingChunkEvent):
            chunks.append(f"{item.source}:{item.content}")
    log = team.store.load(args.run_id)
    transcript = [
        {k: v for k, v in m.body.items() if k not in ("id", "created_at", "full_message_id")}
        for m in log.messages
    ]
    states = {node: dict(state) for node, state in log.agent_states.items()}
    sys.stdout.write(json.dumps({"transcript": transcript, "states": states, "chunks": chunks}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
