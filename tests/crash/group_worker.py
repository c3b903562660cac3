"""A process driving several runs of the crash graph at once on one store, optionally SIGKILLing
itself inside the store's group writer.

Usage: ``python tests/crash/group_worker.py STORE_URL RUNS [KILL]``: RUNS concurrent runs
``group-0`` ... in one event loop. KILL is ``group:K:PHASE``: at the K-th group of at least two
commits the writer thread writes, PHASE ``before`` (before its transaction begins), ``inside``
(its statements done, before COMMIT) or ``after`` (committed, before any caller learns it).

Agent turns are logged to ``$GFD_EXEC_LOG`` as in ``worker.py``. On a normal end it prints one
JSON line: ``{run_id: [[source, content], ...]}`` and the largest group written.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from graphflow_durable.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker import KillOnCommit, crash_team, die


def arm(store: Store, kill: str) -> None:
    """Install the SIGKILL in the store's writer thread."""
    _, number, phase = kill.split(":")
    target = int(number)
    writer = store._writer
    transaction = writer._transaction
    shared = 0

    def hooked(group: list[Any], *args: Any) -> None:
        nonlocal shared
        if len(group) >= 2:
            shared += 1
        if shared != target or len(group) < 2:
            transaction(group, *args)
            return
        if phase == "before":
            die()
        if phase == "inside":
            writer._kept = KillOnCommit(writer._kept or store._e.engine.raw_connection())
        transaction(group, *args)
        if phase == "after":
            die()

    writer._transaction = hooked  # type: ignore[method-assign]


async def main(argv: list[str]) -> int:
    url, count = argv[0], int(argv[1])
    kill = argv[2] if len(argv) > 2 else None
    store = Store(url)
    if kill:
        arm(store, kill)
    largest = 0
    transaction = store._writer._transaction

    def measured(group: list[Any], *args: Any) -> None:
        nonlocal largest
        largest = max(largest, len(group))
        transaction(group, *args)

    store._writer._transaction = measured  # type: ignore[method-assign]
    teams = [crash_team(store, f"group-{i}") for i in range(count)]  # one store: one writer
    await asyncio.gather(*(team.run(task="build the report") for team in teams))
    out = {
        f"group-{i}": [[m.body["source"], m.body.get("content")] for m in store.load(f"group-{i}").messages]
        for i in range(count)
    }
    sys.stdout.write(json.dumps({"transcripts": out, "largest_group": largest}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
