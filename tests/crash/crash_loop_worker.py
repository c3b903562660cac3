"""A process driving a graph whose middle node may kill its own process, for the crash-loop tests.

Usage: ``python tests/crash/crash_loop_worker.py STORE_URL RUN_ID MAX_CRASH_ATTEMPTS MODE`` where
MODE is ``kill`` (node K SIGKILLs its process on every turn), ``slow`` (K sleeps long: the test
interrupts the process) or ``ok`` (K answers). The graph is A -> K -> B. Every turn of K is appended
to ``$GFD_EXEC_LOG`` as ``pid K`` before it acts. The last line printed is JSON: the run's status
(exit 0), or the ``NodeFailedError`` run() raised (exit 3).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable.errors import NodeFailedError
from graphflow_durable.flow import DurableGraphFlow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain, die, log_turn


def team(url: str, run_id: str, max_crash_attempts: int, mode: str) -> DurableGraphFlow:
    async def poison(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        log_turn(agent.name)
        if mode == "kill":
            die()
        if mode == "slow":
            await asyncio.sleep(60)

    a, k, b = Scripted("A"), Scripted("K", before=poison), Scripted("B")
    return DurableGraphFlow(
        [a, k, b],
        chain(a, k, b),
        store=url,
        run_id=run_id,
        max_crash_attempts=max_crash_attempts,
        lease_seconds=2.0,
        interrupt_grace_seconds=0.5,
    )


async def main(argv: list[str]) -> int:
    url, run_id, most, mode = argv[0], argv[1], int(argv[2]), argv[3]
    flow = team(url, run_id, most, mode)
    try:
        await flow.run(task="go")
    except NodeFailedError as exc:
        out = {"error": type(exc).__name__, "message": str(exc), "node": exc.node, "attempts": exc.attempts}
        sys.stdout.write(json.dumps(out) + "\n")
        return 3
    run = flow.run_info()
    sys.stdout.write(json.dumps({"status": None if run is None else run.status}) + "\n")
    return 0


if __name__ == "__main__":
    code = asyncio.run(main(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(code)  # a cancelled run's slow turn may still sleep in the background: not waited for
