"""A process driving several runs of the crash graph at once on one store, optionally SIGKILLing
itself inside the store's group writer.

Usage: ``python tests/crash/group_worker.py STORE_URL RUNS [KILL]``: RUNS concurrent runs
``group-0`` ... in one event loop. KILL is ``group:K:PHASE``: at the K-th group of at least two
commits the writer writes, PHASE ``before`` (before its transaction begins), ``inside``
(its statements done, before COMMIT) or ``after`` (committed, before any caller learns it).

Every COMMIT waits for two more commits behind it (up to 0.1 s) once all runs exist, so that
groups form whatever the machine's load.
Agent turns are logged to ``$GFD_EXEC_LOG`` as in ``worker.py``. On a normal end it prints one
JSON line: ``{run_id: [[source, content], ...]}`` and the largest group written.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from graphflow_durable.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker import KillOnCommit, crash_team, die


def arm(store: Store, kill: str) -> None:
    """Install the SIGKILL in the store's group writer."""
    _, number, phase = kill.split(":")
    target = int(number)
    writer = store._writer
    shared = 0
    armed: list[Any] | None = None  # the target group, once it is being written

    def hook(begin: Any) -> Any:
        def hooked(group: list[Any], *args: Any) -> None:
            nonlocal shared, armed
            if len(group) >= 2:
                shared += 1
                if shared == target:
                    armed = group
                    if phase == "before":
                        die()
                    if phase == "inside":
                        writer._kept = KillOnCommit(writer._kept or store._e.engine.raw_connection())
            begin(group, *args)

        return hooked

    # a group's statements run on a caller's loop (a SQLite file) or in the thread (PostgreSQL)
    writer._write_here = hook(writer._write_here)  # type: ignore[method-assign]
    writer._write = hook(writer._write)  # type: ignore[method-assign]
    finish = writer._finish

    def finished(group: list[Any]) -> None:
        if phase == "after" and group is armed and all(item.error is None for item in group):
            die()  # committed, before any caller learns it
        finish(group)

    writer._finish = finished  # type: ignore[method-assign]


def slow_disk(store: Store, runs: int) -> None:
    """Once all ``runs`` exist, each COMMIT waits (up to 0.1 s, a slow disk) until two more commits
    wait behind it, so that the runs' commits form groups of several whatever the machine's load.
    (Before, a held write lock would only starve the runs' creation, which uses a connection of its
    own and SQLite's busy handler.)"""
    writer = store._writer
    commit = writer._commit
    create_run = store.create_run
    created = 0

    def create(*args: Any, **kwargs: Any) -> Any:
        nonlocal created
        run = create_run(*args, **kwargs)
        created += 1
        return run

    def slow(dbapi: Any, group: list[Any]) -> None:
        deadline = time.monotonic() + 0.1
        while created >= runs and len(writer._waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.002)
        commit(dbapi, group)

    store.create_run = create  # type: ignore[method-assign]
    writer._commit = slow  # type: ignore[method-assign]


async def main(argv: list[str]) -> int:
    url, count = argv[0], int(argv[1])
    kill = argv[2] if len(argv) > 2 else None
    store = Store(url)
    slow_disk(store, count)
    if kill:
        arm(store, kill)
    largest = 0
    finish = store._writer._finish

    def measured(group: list[Any]) -> None:
        nonlocal largest
        largest = max(largest, len(group))
        finish(group)

    store._writer._finish = measured  # type: ignore[method-assign]
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
