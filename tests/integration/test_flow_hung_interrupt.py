"""Ctrl+C on a hung agent stops ``run()`` within ``interrupt_grace_seconds``.

A real process runs A -> B -> C; B's turn ignores cancellation (it swallows the first
``CancelledError`` and keeps sleeping). A real SIGINT while B runs: the process ends within the
grace and a few seconds, the stored run is ``interrupted`` with B to run again and its lease free,
and a new process resumes it to the end with A not run again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from graphflow_durable.store import Store

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parents[1]
GRACE = 1.0

SCRIPT = """
import asyncio, os, signal, sys
# Ctrl+C as in a terminal, however the tests were started (a shell's background job inherits SIGINT
# ignored, and so would this process).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
from agents import Scripted
from autogen_agentchat.teams import DiGraphBuilder
from graphflow_durable.flow import DurableGraphFlow

async def turn(agent, messages):
    with open({log!r}, "a") as f:
        f.write(agent.name + "\\n")
    if agent.name == "B" and os.environ.get("HANG") == "1":
        print("B is running", flush=True)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)  # ignores the cancellation (once)

async def main():
    a, b, c = (Scripted(n, before=turn) for n in "ABC")
    graph = DiGraphBuilder().add_node(a).add_node(b).add_node(c).add_edge(a, b).add_edge(b, c).build()
    team = DurableGraphFlow(
        [a, b, c], graph, store={url!r}, run_id="r", interrupt_grace_seconds={grace!r}
    )
    result = await team.run(task="go")
    print("finished", len(result.messages), flush=True)

try:
    asyncio.run(main())
except KeyboardInterrupt:
    sys.exit(130)
"""


def completions(store: Store) -> Counter[str]:
    return Counter(s.node for s in store.load("r").steps if s.kind == "complete" and s.node)


def test_ctrl_c_on_a_hung_agent_stops_the_run_within_the_grace_and_a_new_process_resumes_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "turns.log"
    script = tmp_path / "hung.py"
    script.write_text(SCRIPT.format(tests=str(TESTS), log=str(log), url=sqlite_url, grace=GRACE))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "HANG": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "B is running"
        time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=GRACE + 10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert code == 130, err
    assert took < GRACE + 4, (took, err)
    assert "did not end within interrupt_grace_seconds" in err
    with Store(sqlite_url) as store:
        run = store.get_run("r")
        assert run is not None and run.status == "interrupted", run
        assert run.lease_owner is None, run
        assert completions(store) == Counter({"A": 1})  # B was in flight: it runs again
    resumed = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "HANG": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("finished")
    with Store(sqlite_url) as store:
        run = store.get_run("r")
        assert run is not None and run.status == "finished"
        assert completions(store) == Counter({"A": 1, "B": 1, "C": 1})
    assert log.read_text().split() == ["A", "B", "B", "C"]  # A ran once; B again after the interrupt
