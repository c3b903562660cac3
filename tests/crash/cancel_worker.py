"""A process driving the crash graph slowly, for the cancel tests.

Usage: ``python tests/crash/cancel_worker.py STORE_URL RUN_ID LEASE_SECONDS TURN_SECONDS``: every
agent turn appends ``time node`` to ``$GFD_TURN_TIMES`` and then sleeps TURN_SECONDS; the lease is
LEASE_SECONDS. It runs (or resumes) the run with the crash tests' task and prints, as JSON on its
last line, the run's status, its stored transcript and the result's messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.messages import BaseChatMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker as crash

from agents import Scripted


async def main(argv: list[str]) -> int:
    url, run_id, lease, pause = argv[0], argv[1], float(argv[2]), float(argv[3])
    record = crash.record_turn

    async def slow_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        await record(agent, messages)
        with open(os.environ["GFD_TURN_TIMES"], "a") as f:
            f.write(f"{time.time()} {agent.name}\n")
        await asyncio.sleep(pause)

    crash.record_turn = slow_turn  # crash_team looks it up when it builds the agents
    team = crash.crash_team(url, run_id, lease_seconds=lease)
    result = await team.run(task="build the report")
    run = team.run_info()
    log = team.store.load(run_id)
    sys.stdout.write(
        json.dumps(
            {
                "status": None if run is None else run.status,
                "transcript": [[m.body["source"], m.body.get("content")] for m in log.messages],
                "result": [[m.source, getattr(m, "content", None)] for m in result.messages],
            }
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
