"""How often a driver frozen in its dispatch hop starts a turn another driver already committed.

``python benchmarks/frozen_start.py --cycles 50 [--store URL] [--no-container-check]``

A *victim* process drives runs A -> B one after another. Right after the manager's lease check
before B's dispatch passes, the victim says so on its stdout; this process then freezes it at once
(a real SIGSTOP: it lands somewhere in the dispatch hop manager -> runtime -> container -> agent),
waits until the victim's lease expired, resumes the run itself (a successor driver: B runs and is
committed here), and continues the victim (SIGCONT). A cycle *re-starts a committed turn* when the
victim's B starts after the successor committed it (each B start is logged with its process and
time). ``--no-container-check`` disables the participant container's last lease check in the
victim (the code before it), for the comparison. Prints one JSON object. Speed is not the point:
nothing here is timed beyond the lease.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEASE = 0.6  # the victim's lease: fresh for 0.4 s after each confirmation


def _team(url: str, run_id: str, log: Path, **durable: Any) -> Any:
    from autogen_agentchat.agents import BaseChatAgent
    from autogen_agentchat.base import Response
    from autogen_agentchat.messages import BaseChatMessage, TextMessage
    from autogen_agentchat.teams import DiGraphBuilder
    from autogen_core import CancellationToken

    from graphflow_durable.flow import DurableGraphFlow

    class Agent(BaseChatAgent):
        @property
        def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
            return (TextMessage,)

        async def on_messages(
            self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> Response:
            if self.name == "B":  # the side effect that must not happen twice
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {run_id} {time.time():.6f}\n")
            await asyncio.sleep(0.01)
            return Response(chat_message=TextMessage(content=f"{self.name} done", source=self.name))

        async def on_reset(self, cancellation_token: CancellationToken) -> None:
            pass

    a, b = Agent("A", "a"), Agent("B", "b")
    graph = DiGraphBuilder().add_node(a).add_node(b).add_edge(a, b).build()
    return DurableGraphFlow([a, b], graph, store=url, run_id=run_id, lease_seconds=LEASE, **durable)


async def _victim(url: str, cycles: int, log: Path, check: bool) -> None:
    """Drive runs c0, c1...; after the lease check before B's dispatch, say ``checked`` and wait
    (the parent freezes this process now); after each run, say ``done``."""
    from graphflow_durable._runtime.runlease import RunLease

    if not check:

        async def always(self: RunLease, node: str) -> bool:
            return True

        RunLease.may_start = always  # type: ignore[method-assign]
    for n in range(cycles):
        await _drive_one(url, f"c{n}", log)


async def _drive_one(url: str, run_id: str, log: Path) -> None:
    team = _team(url, run_id, log)
    lease = team._session.lease
    valid = lease.valid
    dispatches = 0

    async def checked() -> bool:
        nonlocal dispatches
        ok = await valid()
        dispatches += 1
        if ok and dispatches == 2:  # before B's dispatch
            sys.stdout.write(f"checked {run_id}\n")
            sys.stdout.flush()
        return ok

    lease.valid = checked
    try:
        await team.run(task="go")
    except Exception as exc:  # noqa: BLE001 -- a fenced answer (LeaseLostError) is expected
        sys.stderr.write(f"{run_id}: {type(exc).__name__}\n")
    sys.stdout.write(f"done {run_id}\n")
    sys.stdout.flush()


async def _successor(url: str, run_id: str, log: Path) -> float:
    """Resume ``run_id`` here once the victim's lease expired; the time B's commit was done."""
    team = _team(url, run_id, log, lease_owner="successor")
    await team.run()
    return time.time()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--store", default=None, help="a store URL (default: a new SQLite file)")
    parser.add_argument("--no-container-check", action="store_true")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="frozen-start-"))
    url = args.store or f"sqlite:///{tmp / 'runs.db'}"
    log = tmp / "b-starts.log"
    command = [sys.executable, __file__, "--victim", url, str(args.cycles), str(log)]
    command.append("nocheck" if args.no_container_check else "check")
    with open(tmp / "victim.err", "wb") as err:  # its log lines (lost leases): not the result
        victim = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
    assert victim.stdout is not None
    committed: dict[str, float] = {}
    froze = 0
    try:
        for _ in range(args.cycles):
            line = victim.stdout.readline().split()
            if line[0] == "checked":
                victim.send_signal(signal.SIGSTOP)
                froze += 1
                run_id = line[1]
                time.sleep(LEASE + 0.2)  # the victim's lease expires while it is frozen
                committed[run_id] = asyncio.run(_successor(url, run_id, log))
                victim.send_signal(signal.SIGCONT)
                line = victim.stdout.readline().split()
            assert line[0] == "done", line
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.wait(timeout=60)
    restarted = 0
    for entry in log.read_text().splitlines():
        pid, run_id, started = entry.split()
        if int(pid) == victim.pid and run_id in committed and float(started) > committed[run_id]:
            restarted += 1
    return {
        "cycles": args.cycles,
        "frozen": froze,
        "restarted_committed_turns": restarted,
        "container_check": not args.no_container_check,
        "store": url.split(":", 1)[0],
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--victim":
        _, _, url, cycles, log, mode = sys.argv
        asyncio.run(_victim(url, int(cycles), Path(log), mode == "check"))
    else:
        print(json.dumps(main()))
