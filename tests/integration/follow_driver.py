"""A process that drives a run the follow tests watch from another process.

Usage: ``python tests/integration/follow_driver.py STORE_URL RUN_ID GATE``. Graph: the chain
``A -> B -> C -> D -> E -> F`` run with ``run(task="go")``. B's turn first creates ``GATE.waiting``
and then waits until the file ``GATE`` exists, so the test can attach while the run is mid-round;
the turns after it take a little time each, so their commits land one by one while it watches.
Prints the returned ``TaskResult`` as JSON: ``{"ids": [message ids], "stop_reason": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable.flow import DurableGraphFlow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain

GATE = Path()


async def pace(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    if agent.name == "B":
        GATE.with_suffix(".waiting").touch()
        while not GATE.exists():
            await asyncio.sleep(0.02)
    elif agent.name != "A":
        await asyncio.sleep(0.05)


async def main(argv: list[str]) -> int:
    global GATE
    url, run_id, GATE = argv[0], argv[1], Path(argv[2])
    agents = [Scripted(n, before=pace) for n in "ABCDEF"]
    team = DurableGraphFlow(agents, chain(*agents), store=url, run_id=run_id)
    result = await team.run(task="go")
    sys.stdout.write(
        json.dumps({"ids": [m.id for m in result.messages], "stop_reason": result.stop_reason}) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
