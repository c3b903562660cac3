"""Worker-pool demo: submit runs, start two worker processes, SIGKILL one, watch every run finish.

Run it with no API key (SQLite in a temporary directory by default):

    python examples/worker_pool.py
    python examples/worker_pool.py --store postgresql://user@host/db   # the same against PostgreSQL

What happens:
1. Five runs are submitted to the store (``store.queue.submit``), each with its own task, team key "report".
2. Two ``graphflow-durable worker`` processes start (``--team report=worker_pool:team``); each
   claims runs and drives two at a time.
3. When the first worker is in the middle of its runs, this script SIGKILLs it. The other worker
   takes its runs over at once (a dead process on the same host; on another host it would wait for
   the lease to expire) and resumes them from their last commit.
4. The script prints every run's status and how many times each node was recorded: once each.

This file is also the team module the workers import: :func:`team` is the factory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, Store

TEAM_KEY = "report"
NODES = ("plan", "research", "critique", "write")


class Step(BaseChatAgent):
    """A deterministic stand-in for a model call that takes a moment."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"the {name} step")

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        await asyncio.sleep(float(os.environ.get("WORKER_POOL_DELAY", "0.4")))
        content = f"{self.name} done (pid {os.getpid()}), after {len(messages)} new message(s)"
        return Response(chat_message=TextMessage(content=content, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """The factory the workers call: plan -> (research, critique in parallel) -> write."""
    plan, research, critique, write = (Step(name) for name in NODES)
    builder = DiGraphBuilder()
    for agent in (plan, research, critique, write):
        builder.add_node(agent)
    builder.add_edge(plan, research).add_edge(plan, critique)
    builder.add_edge(research, write).add_edge(critique, write)
    return DurableGraphFlow([plan, research, critique, write], builder.build(), run_id=run_id, **durable)


def start_worker(store: str, log: Path) -> subprocess.Popen[bytes]:
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    args = [
        sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", store,
        "--team", f"{TEAM_KEY}=worker_pool:team", "--concurrency", "2", "--lease-seconds", "10",
        "--poll-interval", "0.1",
    ]  # fmt: skip
    with open(log, "wb") as err:
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="database URL (default: SQLite in a temporary directory)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'pool.db'}"
        run_ids = [f"report-{i}" for i in range(args.runs)]
        with Store(url) as store:
            for i, run_id in enumerate(run_ids):
                store.queue.submit(run_id, task=f"Write report number {i}.", team=TEAM_KEY)
            print(f"submitted {len(run_ids)} runs to {store.url}")
            workers = [start_worker(url, Path(tmp) / f"worker-{n}.log") for n in range(2)]
            victim = workers[0]
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # wait until the first worker is mid-run
                    held = [
                        r for r in store.list_runs("running") if r.lease_pid == victim.pid and r.head_seq >= 3
                    ]
                    if held:
                        break
                    time.sleep(0.05)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                print(f"SIGKILLed worker pid {victim.pid} while it drove {[r.run_id for r in held]}")
                while time.monotonic() < deadline:
                    if len(store.list_runs("finished")) == len(run_ids):
                        break
                    time.sleep(0.1)
            finally:
                for worker in workers:
                    if worker.poll() is None:
                        worker.send_signal(signal.SIGTERM)
                        worker.wait(timeout=30)
            ok = True
            for run_id in run_ids:
                run = store.get_run(run_id)
                log = store.load(run_id)
                counts = Counter(s.node for s in log.steps if s.kind == "complete")
                pids = sorted({m.body["content"].split("pid ")[1].split(")")[0] for m in log.messages[1:]})
                once = all(counts[node] == 1 for node in NODES)
                ok = ok and once and run is not None and run.status == "finished"
                status = None if run is None else run.status
                print(f"{run_id}: {status}; recorded {dict(counts)}; agents ran in pids {pids}")
        print("every run finished, every node recorded once" if ok else "SOMETHING IS WRONG")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
