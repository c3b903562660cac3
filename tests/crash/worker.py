"""A worker process for the crash tests: runs the crash graph, optionally SIGKILLing itself.

Usage: ``python tests/crash/worker.py STORE_URL RUN_ID [KILL]`` where KILL is one of
``create:before``/``create:after`` (creating the run), ``commit:K:before`` (entering the K-th commit), ``commit:K:inside`` (inside its transaction,
before COMMIT), ``commit:K:after`` (after it returned), ``agent:J`` (during the J-th agent turn).

With ``$GRAPHFLOW_DURABLE_KEYS`` set, the store seals the run's content with those keys.

Every agent turn is appended to the file named by ``$GFD_EXEC_LOG`` as ``pid node turn run_id``. On a
normal end the transcript is printed to stdout as JSON: ``[[source, content], ...]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraph, DiGraphBuilder

from graphflow_durable.context import current_execution
from graphflow_durable.crypto import AESGCMCodec, Keys
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, die, log_turn

AGENT_CALLS = 0
KILL_AGENT_CALL: int | None = None


class KillOnCommit:
    """A DBAPI connection that dies when COMMIT is about to be sent, if ``armed()`` says so."""

    def __init__(self, conn: Any, armed: Callable[[], bool] = lambda: True) -> None:
        self._conn = conn
        self._armed = armed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        if self._armed():
            die()
        self._conn.commit()


async def record_turn(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    """Log every agent turn to $GFD_EXEC_LOG (durably), and die during the KILL_AGENT_CALL-th one."""
    global AGENT_CALLS
    AGENT_CALLS += 1
    execution = current_execution()
    log_turn(agent.name, agent.turn, execution.run_id if execution is not None else "-")
    if KILL_AGENT_CALL is not None and AGENT_CALLS == KILL_AGENT_CALL:
        die()


def crash_team(url: str | Store, run_id: str, **durable: Any) -> DurableGraphFlow:
    """Fan-out S->(P1,P2), join ->J, inner loop J->R->J ("any", when R says "again"), outer loop
    R->S (when R says "restart": the fan-out runs again), exit R->E (when R says "done")."""
    s, p1, p2, j, e = (Scripted(n, before=record_turn) for n in ("S", "P1", "P2", "J", "E"))
    r = Scripted("R", says=["again", "restart", "again", "done"], before=record_turn)
    b = DiGraphBuilder()
    for agent in (s, p1, p2, j, r, e):
        b.add_node(agent)
    b.add_edge(s, p1).add_edge(s, p2)
    b.add_edge(p1, j, activation_group="join").add_edge(p2, j, activation_group="join")
    b.add_edge(j, r)
    b.add_edge(r, j, condition="again", activation_group="loop", activation_condition="any")
    b.add_edge(r, s, condition="restart", activation_group="outer", activation_condition="any")
    b.add_edge(r, e, condition="done")
    b.set_entry_point(s)
    graph: DiGraph = b.build()
    return DurableGraphFlow(
        [s, p1, p2, j, r, e],
        graph,
        termination_condition=MaxMessageTermination(60),
        store=url,
        run_id=run_id,
        **durable,
    )


def arm(store: Store, kill: str) -> None:
    """Install the SIGKILL at the requested point."""
    global KILL_AGENT_CALL
    kind, _, rest = kill.partition(":")
    if kind == "agent":
        KILL_AGENT_CALL = int(rest)
        return
    if kind == "create":  # creating the run (with its first snapshot, in one transaction)
        submit_create_run = store._driver.submit_create_run

        def create(*args: Any, **kwargs: Any) -> Any:
            if rest == "before":
                die()
            future = submit_create_run(*args, **kwargs)
            future.add_done_callback(lambda f: die() if f.exception() is None else None)  # durable
            return future

        store._driver.submit_create_run = create  # type: ignore[method-assign]
        return
    number, _, phase = rest.partition(":")
    target = int(number)
    calls = 0
    inside = False
    handed: list[Any] = []  # the K-th commit's parameters, once handed to the writer
    writer = store._writer
    submit, transaction = writer.submit_async, writer._transaction

    def counted_submit(params: Any, loop: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == target and phase == "before":
            die()
        if calls == target:
            handed.append(params)
        future = submit(params, loop)
        if calls == target and phase == "after":  # durable, before the committer goes on
            future.add_done_callback(lambda f: die() if f.exception() is None else None)
        return future

    def watched_transaction(group: Any, nowait: bool = False) -> Any:
        # A batch's answers are handed over without waiting: the K-th commit may share a group
        # with others, or follow one still being written. "inside" is the group that holds it.
        nonlocal inside
        inside = phase == "inside" and any(item.params is params for item in group for params in handed)
        return transaction(group, nowait)

    engine = store._e.engine
    raw_connection = engine.raw_connection
    engine.raw_connection = lambda: KillOnCommit(raw_connection(), lambda: inside)  # type: ignore[method-assign]
    writer.submit_async = counted_submit  # type: ignore[method-assign]
    writer._transaction = watched_transaction  # type: ignore[method-assign]


async def main(argv: list[str]) -> int:
    url, run_id = argv[0], argv[1]
    kill = argv[2] if len(argv) > 2 else None
    sealed = os.environ.get("GRAPHFLOW_DURABLE_KEYS")
    team = crash_team(Store(url, codec=AESGCMCodec(Keys.from_env())) if sealed else url, run_id)
    if kill:
        arm(team.store, kill)
    # Re-running the same task resumes an unfinished run; a finished run's result is read back
    # with run() and no task (the same task again would start a new round, as in GraphFlow).
    info = team.run_info()
    finished = info is not None and info.status == "finished"
    result = await team.run(task=None if finished else "build the report")
    store = team.store
    log = store.load(run_id)
    transcript = [[m.body["source"], m.body.get("content")] for m in log.messages]
    sys.stdout.write(json.dumps({"transcript": transcript, "stop_reason": result.stop_reason}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
