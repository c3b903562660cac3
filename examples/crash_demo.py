"""Crash-and-resume demo: a research -> validate -> summarize -> report pipeline survives SIGKILL.

Run it with no API key:

    python examples/crash_demo.py

What happens:
1. A worker process starts the run. When ``summarize`` starts, this script SIGKILLs the worker --
   ``research`` and ``validate`` were already committed, ``summarize`` was in flight.
2. A fresh worker process constructs the same team with the same run id and calls ``run()``
   with the same task. It resumes at ``summarize``: research and validate never run again.
3. The timeline shows which process ran which node.

The agents are deterministic stand-ins for model calls. ``--db PATH`` keeps the SQLite file
(default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow

RUN_ID = "quarterly-report"
TASK = "Write the quarterly report on durable agent workflows."
STEPS = {
    "research": "Found 3 sources on durable execution.",
    "validate": "All 3 sources check out.",
    "summarize": "Durable runs resume where they stopped; completed work is never redone.",
    "report": "REPORT: Durable agent workflows resume exactly where they crashed.",
}


class Step(BaseChatAgent):
    """A pipeline stage that announces when it starts and ends (a stand-in for a model call)."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name, f"the {name} stage")
        self._seconds = seconds

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        print(f"  [worker pid {os.getpid()}] {self.name}: started", flush=True)
        await asyncio.sleep(self._seconds)
        print(f"  [worker pid {os.getpid()}] {self.name}: done", flush=True)
        return Response(chat_message=TextMessage(content=STEPS[self.name], source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


def build_team(db: Path) -> DurableGraphFlow:
    """The team; the only change from plain GraphFlow is the class name, store= and run_id=."""
    agents = [Step("research", 0.2), Step("validate", 0.2), Step("summarize", 1.0), Step("report", 0.2)]
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    for a, b in itertools.pairwise(agents):
        builder.add_edge(a, b)
    return DurableGraphFlow(agents, builder.build(), store=f"sqlite:///{db}", run_id=RUN_ID)


async def work(db: Path) -> None:
    """One worker: start the run, or continue it if it already exists."""
    team = build_team(db)
    result = await team.run(task=TASK)
    print(f"  [worker pid {os.getpid()}] finished: {result.messages[-1].to_text()}", flush=True)


def spawn(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", "--db", str(db)],
        stdout=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", type=Path, help="SQLite file for the run (default: a temporary directory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(work(args.db))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.db"
        timeline: list[tuple[str, str]] = []

        print("== worker 1: starts the run; it is SIGKILLed when 'summarize' starts")
        first = spawn(db)
        assert first.stdout is not None
        for line in first.stdout:
            print(line, end="")
            timeline.append(("worker 1", line.strip()))
            if "summarize: started" in line:
                first.send_signal(signal.SIGKILL)
                break
        first.wait()
        print(f"  worker 1 exited with {first.returncode} (SIGKILL)\n")

        print("== worker 2: a fresh process, same team, same run id, same task")
        second = spawn(db)
        output, _ = second.communicate()
        print(output, end="")
        timeline.extend(("worker 2", line.strip()) for line in output.splitlines())
        if second.returncode != 0:
            print("worker 2 failed", file=sys.stderr)
            return 1

        print("\n== timeline: which process ran which node")
        for worker, line in timeline:
            if line.endswith(": done") or line.endswith(": started"):
                print(f"  {worker}: {line.split('] ', 1)[1]}")
        ran = [(w, line.split("] ", 1)[1].split(":")[0]) for w, line in timeline if line.endswith(": done")]
        again = {node for w, node in ran if w == "worker 2"} & {node for w, node in ran if w == "worker 1"}
        print(f"\ncompleted nodes that ran twice: {sorted(again) or 'none'}")
        return 1 if again else 0


if __name__ == "__main__":
    sys.exit(main())
