"""Recorded model and tool calls: a turn killed half-way does not pay for its model calls twice.

Run it with no API key:

    python examples/recorded_calls.py

The team is one ``AssistantAgent``, ``clerk``, whose turn makes three model calls and two tool
calls: the model asks for ``lookup_order``, then for ``issue_refund``, then says it is done. The
model is ``ScriptedModel`` (``examples/scripted_model.py``), a stand-in that answers from a script
by the request, so it answers a resumed turn exactly as the first time. The only change from a
plain ``GraphFlow`` team: ``DurableGraphFlow(..., record_calls=True)``.

What happens:
1. Worker 1 starts the run. The clerk's first two model calls and ``lookup_order`` are made, each
   recorded as it returns. When ``issue_refund`` starts contacting the bank, this script SIGKILLs
   the worker: the turn was never committed.
2. Worker 2, a fresh process, constructs the same team with the same run id and runs the same
   task. The clerk's turn runs again, but its recorded calls are replayed from the store: the model
   is called only for the call it had not answered yet, ``lookup_order`` does not run again, and
   ``issue_refund`` (killed before it acted) acts once.
3. ``graphflow-durable runs history RUN --calls`` lists the clerk's calls: which were made live,
   which replayed, and the tokens of each.

``--db PATH`` keeps the SQLite file (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core.models import CreateResult, LLMMessage

from graphflow_durable import DurableGraphFlow, Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted_model import CLERK_SCRIPT, ScriptedModel, ledger_tools

RUN_ID = "refund-a17"
TASK = "Customer asks for a refund of order A17."


class Narrated(ScriptedModel):
    """The scripted model, saying each time it is really called (a replayed call never gets here)."""

    def _live(self, messages: Sequence[LLMMessage]) -> CreateResult:
        result = super()._live(messages)
        answer = result.content if isinstance(result.content, str) else f"call {result.content[0].name}"
        print(f"  [worker pid {os.getpid()}] model called: {answer}", flush=True)
        return result


async def slow_bank(tool: str) -> None:
    if tool == "issue_refund":
        print(f"  [worker pid {os.getpid()}] issue_refund: contacting the bank", flush=True)
        await asyncio.sleep(1.0)


async def announce(tool: str) -> None:
    print(f"  [worker pid {os.getpid()}] {tool}: done (written to the ledger)", flush=True)


def build_team(db: Path, ledger: Path) -> DurableGraphFlow:
    clerk = AssistantAgent(
        "clerk",
        model_client=Narrated("clerk", CLERK_SCRIPT),
        tools=ledger_tools(ledger, before=slow_bank, during=announce),
        max_tool_iterations=3,
    )
    graph = DiGraphBuilder().add_node(clerk).build()
    return DurableGraphFlow([clerk], graph, store=f"sqlite:///{db}", run_id=RUN_ID, record_calls=True)


async def work(db: Path, ledger: Path) -> None:
    """One worker: start the run, or continue it if it already exists."""
    result = await build_team(db, ledger).run(task=TASK)
    print(f"  [worker pid {os.getpid()}] finished: {result.messages[-1].to_text()}", flush=True)


def spawn(db: Path, ledger: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", "--db", str(db), "--ledger", str(ledger)],
        stdout=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", type=Path, help="SQLite file for the run (default: a temporary directory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ledger", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(work(args.db, args.ledger))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.db"
        ledger = Path(tmp) / "ledger.txt"
        live: dict[str, int] = {}

        print("== worker 1: starts the run; SIGKILLed while issue_refund contacts the bank")
        first = spawn(db, ledger)
        assert first.stdout is not None
        for line in first.stdout:
            print(line, end="")
            live["worker 1"] = live.get("worker 1", 0) + ("model called" in line)
            if "issue_refund: contacting the bank" in line:
                first.send_signal(signal.SIGKILL)
                break
        first.wait()
        print(f"  worker 1 exited with {first.returncode} (SIGKILL)\n")

        print("== worker 2: a fresh process, same team, same run id, same task")
        second = spawn(db, ledger)
        output, _ = second.communicate()
        print(output, end="")
        if second.returncode != 0:
            print("worker 2 failed", file=sys.stderr)
            return 1
        live["worker 2"] = output.count("model called")

        print("\n== the clerk's calls, as recorded: graphflow-durable runs history RUN --calls")
        url = f"sqlite:///{db}"
        history = [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", "history", RUN_ID, "--calls"]
        sys.stdout.flush()  # the command writes to the same stdout
        subprocess.run([*history, "--store", url], check=True)
        with Store(url) as store:
            records = store.calls.list(RUN_ID)
            summary = store.calls.summary(RUN_ID)

        acted = [line.split()[1] for line in ledger.read_text().splitlines()]
        replayed_models = sum(1 for r in records if r.kind == "model" and r.outcome == "replayed")
        print(
            f"\nmodel calls made: worker 1: {live['worker 1']}, worker 2: {live['worker 2']} "
            f"(worker 2 replayed {replayed_models} from the store; {summary.tokens_saved} tokens saved)"
        )
        for tool in ("lookup_order", "issue_refund"):
            print(f"{tool} ran {acted.count(tool)} time(s)")
        once = all(acted.count(tool) == 1 for tool in ("lookup_order", "issue_refund"))
        paid_once = live["worker 1"] + live["worker 2"] == len(CLERK_SCRIPT)
        print(f"each model call paid once: {paid_once}; each tool ran once: {once}")
        return 0 if once and paid_once else 1


if __name__ == "__main__":
    sys.exit(main())
