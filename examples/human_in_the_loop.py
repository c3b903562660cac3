"""Human in the loop, durably: a run waits for a person across processes, then goes on exactly.

Run it with no API key:

    python examples/human_in_the_loop.py

What happens (each step in its own process, as across a restart or a day):
1. ``draft`` writes a draft, then ``approver`` (a ``UserProxyAgent``) asks for approval. With
   ``human_input="wait"`` the request is committed, the run's status becomes ``waiting``, and
   ``run()`` returns with a stop reason naming the node and the prompt. The process exits.
2. Another process answers: ``graphflow-durable runs respond release-notes "approved"`` (here the
   same through ``Store.respond``).
3. A third process calls ``run()``: the approver's turn completes with the answer, ``publish``
   runs, and ``draft`` does not run again.

``--db PATH`` keeps the SQLite file (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.agents import BaseChatAgent, UserProxyAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, Store

RUN_ID = "release-notes"


class Writer(BaseChatAgent):
    """A deterministic stand-in for a model: says what it did with what it heard last."""

    def __init__(self, name: str, verb: str) -> None:
        super().__init__(name, verb)
        self._verb = verb

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        heard = messages[-1].to_text() if messages else ""
        print(f"  [{self.name}] runs (heard: {heard!r})", flush=True)
        return Response(chat_message=TextMessage(content=f"{self._verb} ({heard})", source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


def never_asked(prompt: str) -> str:
    raise AssertionError("in wait mode the input function is not called: the answer comes from respond()")


def team(db: str) -> DurableGraphFlow:
    draft, publish = Writer("draft", "drafted the notes"), Writer("publish", "published")
    approver = UserProxyAgent("approver", input_func=never_asked)
    graph = (
        DiGraphBuilder().add_node(draft).add_node(approver).add_node(publish)
        .add_edge(draft, approver).add_edge(approver, publish)
        .build()
    )  # fmt: skip
    return DurableGraphFlow(
        [draft, approver, publish], graph, store=f"sqlite:///{db}", run_id=RUN_ID, human_input="wait"
    )


async def step(db: str, name: str) -> None:
    if name == "start":
        result = await team(db).run(task="Write the release notes.")
        print(f"  run() returned: {result.stop_reason}")
    elif name == "answer":
        with Store(f"sqlite:///{db}") as store:
            print(f"  pending: {[(r.node, r.prompt) for r in store.pending_requests(RUN_ID)]}")
            store.respond(RUN_ID, "approved")
            print(f"  answered; the run is {store.get_run(RUN_ID).status}")  # type: ignore[union-attr]
    else:
        result = await team(db).run()
        print(f"  run() returned: {result.stop_reason}")
        print(
            f"  transcript: {[(m.source, m.to_text()) for m in result.messages if isinstance(m, TextMessage)]}"
        )
    with Store(f"sqlite:///{db}") as store:
        print(f"  status: {store.get_run(RUN_ID).status}")  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLite file to keep (default: a temporary one)")
    parser.add_argument("--step", choices=("start", "answer", "finish"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        asyncio.run(step(args.db, args.step))
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or str(Path(tmp) / "hitl.db")
        for name, title in (("start", "process 1: start; the run parks and the process exits"),
                            ("answer", "process 2: a person answers"),
                            ("finish", "process 3: the run goes on")):  # fmt: skip
            print(f"== {title}", flush=True)
            subprocess.run([sys.executable, __file__, "--db", db, "--step", name], check=True)


if __name__ == "__main__":
    main()
