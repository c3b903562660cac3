"""Console demo: a worker pool drives a few runs, one waits for a person, and the run console shows
them all in the browser. One command, no API key (needs the console's extra:
``pip install 'graphflow-durable[ui]'``):

    python examples/console_demo.py                    # prints the console's URL; Ctrl+C stops it all
    python examples/console_demo.py --store sqlite:///demo.db --port 8765
    python examples/console_demo.py --smoke            # start, check the inbox, stop (what the tests run)

What happens:
1. Runs are submitted to the store (SQLite in a temporary directory unless ``--store``): a few of
   the report team of ``worker_pool.py`` (plan -> research, critique -> write), one ``refund`` run
   whose ``approver`` (a ``UserProxyAgent``, ``human_input="wait"``, as in
   ``human_in_the_loop.py``) waits for a person, and one ``digest`` run whose ``summarize`` node
   fails twice, waiting between its attempts, then fails the run.
2. A ``graphflow-durable worker`` process claims and drives them (this file and ``worker_pool.py``
   are its team modules).
3. ``graphflow-durable ui`` serves the console: open the URL it prints. The refund run is in the
   Inbox: answer it there, and the worker finishes it while you watch its page. On the failed run,
   "supply" writes the failed node's answer, and the worker continues it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder

from graphflow_durable import DurableGraphFlow, RetryPolicy, Store
from human_in_the_loop import Writer, never_asked
from worker_pool import TEAM_KEY, Step

HERE = Path(__file__).resolve().parent
URL_LINE = "graphflow-durable ui: "
REFUND_RUN = "refund-1234"


def approval(run_id: str, **durable: Any) -> DurableGraphFlow:
    """``draft -> approver -> publish``: the approver waits for a person (the Inbox answers it)."""
    draft, publish = Writer("draft", "drafted a refund of 42 EUR"), Writer("publish", "refund issued")
    approver = UserProxyAgent("approver", input_func=never_asked)
    graph = (
        DiGraphBuilder().add_node(draft).add_node(approver).add_node(publish)
        .add_edge(draft, approver).add_edge(approver, publish)
        .build()
    )  # fmt: skip
    return DurableGraphFlow([draft, approver, publish], graph, run_id=run_id, human_input="wait", **durable)


class Unreachable(Step):
    """A step whose service is down: every attempt fails."""

    async def on_messages(self, messages: Any, cancellation_token: Any) -> Any:
        await super().on_messages(messages, cancellation_token)
        raise ConnectionError(f"{self.name}: the summarizer's service is unreachable")


def digest(run_id: str, **durable: Any) -> DurableGraphFlow:
    """``fetch -> summarize -> publish``; ``summarize`` fails on both of its attempts."""
    fetch, summarize, publish = Step("fetch"), Unreachable("summarize"), Step("publish")
    graph = (
        DiGraphBuilder().add_node(fetch).add_node(summarize).add_node(publish)
        .add_edge(fetch, summarize).add_edge(summarize, publish)
        .build()
    )  # fmt: skip
    retry = {"summarize": RetryPolicy(max_attempts=2, initial_interval=1.0, jitter=False)}
    return DurableGraphFlow([fetch, summarize, publish], graph, run_id=run_id, retry=retry, **durable)


def submit(store: Store, reports: int) -> list[str]:
    """Submit the demo's runs; their ids."""
    runs = [(f"report-{i}", f"Write report number {i}.", TEAM_KEY) for i in range(reports)]
    runs += [
        (REFUND_RUN, "Refund 42 EUR to order 1234?", "refund"),
        ("digest-7", "Digest the news.", "digest"),
    ]
    for run_id, task, team in runs:
        store.queue.submit(run_id, task=task, team=team)
    return [run_id for run_id, _, _ in runs]


def graphflow_durable(*args: str, **popen: Any) -> subprocess.Popen[Any]:
    """``graphflow-durable ARGS`` in a child process that imports this directory's team modules."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("WORKER_POOL_DELAY", "1.0")
    return subprocess.Popen([sys.executable, "-m", "graphflow_durable.cli.runs", *args], env=env, **popen)


@contextmanager
def child(proc: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """Stop ``proc`` at the end, whatever happens (SIGTERM, then SIGKILL after 20 s)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def console_url(proc: subprocess.Popen[str]) -> str:
    """The address the console prints as its first line once it accepts connections."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(URL_LINE):
        raise SystemExit(f"graphflow-durable ui did not start (it printed {line!r}); see its messages above")
    return line[len(URL_LINE) :].strip()


def smoke(store: Store, url: str) -> bool:
    """Whether the refund run waits for a person and the console's inbox lists it (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = store.get_run(REFUND_RUN)
        if run is not None and run.status == "waiting":
            with urllib.request.urlopen(f"{url.rstrip('/')}/api/inbox", timeout=10) as answer:
                inbox = json.load(answer)
            items = inbox if isinstance(inbox, list) else inbox.get("requests", inbox.get("inbox", []))
            return any(item.get("run_id") == REFUND_RUN for item in items)
        time.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="database URL (default: SQLite in a temporary directory)")
    parser.add_argument("--port", type=int, default=8765, help="the console's port (0: a free one)")
    parser.add_argument("--reports", type=int, default=4, help="how many report runs to submit")
    parser.add_argument(
        "--smoke", action="store_true", help="start, check the inbox lists the waiting run, stop"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        store_url = args.store or f"sqlite:///{Path(tmp) / 'console-demo.db'}"
        store = stack.enter_context(Store(store_url))
        run_ids = submit(store, args.reports)
        print(f"submitted {len(run_ids)} runs: {', '.join(run_ids)}", flush=True)
        teams = [f"{TEAM_KEY}=worker_pool:team", "refund=console_demo:approval", "digest=console_demo:digest"]
        worker = graphflow_durable(
            "worker", "--store", store_url, *[a for t in teams for a in ("--team", t)],
            "--concurrency", "4", "--poll-interval", "0.2",
        )  # fmt: skip
        stack.enter_context(child(worker))
        port = "0" if args.smoke else str(args.port)
        ui = graphflow_durable("ui", "--store", store_url, "--port", port, stdout=subprocess.PIPE, text=True)
        stack.enter_context(child(ui))
        url = console_url(ui)
        print(f"the console: {url}  (the run {REFUND_RUN} waits for you in its Inbox)", flush=True)
        if args.smoke:
            ok = smoke(store, url)
            print("smoke: the inbox lists the waiting run" if ok else "smoke: FAILED", flush=True)
            return 0 if ok else 1
        print("Ctrl+C stops the worker and the console", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops them too
        try:
            while worker.poll() is None and ui.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
            return 0
        print("the worker or the console stopped on its own", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
