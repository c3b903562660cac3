"""Encryption at rest: a run whose every message, state and task is sealed in the database.

Run it with no API key (it needs the ``crypto`` extra: ``pip install 'graphflow-durable[crypto]'``):

    python examples/encrypted.py

What happens:
1. A key is generated (32 random bytes) and given the way a deployment gives it, in
   ``GRAPHFLOW_DURABLE_KEYS="k1=<base64>"``; ``Keys.from_env()`` reads it. The key is never printed.
2. A refund team (intake -> lookup -> reply) runs on ``Store(url, codec=AESGCMCodec(keys))``.
   The only change from an unencrypted store is ``codec=``.
3. With the key, the transcript reads as usual. The database file itself (its WAL checkpointed)
   holds none of the task's or the messages' text: a stored message body is ``gfd1:k1:<base64>``.
4. Opened without the key, the store refuses the run's content in one line naming the key it
   needs; it never hands out the stored ciphertext as if it were text.

``--db PATH`` keeps the SQLite file (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, Store
from graphflow_durable.crypto import AESGCMCodec, Keys
from graphflow_durable.errors import StoreConfigError

RUN_ID = "refund-jane"
TASK = "Jane Roe (IBAN DE89 3704 0044 0532 0130 00) asks for a refund of order 1234."
SAYS = {
    "intake": "Refund request from Jane Roe for order 1234, card ending 4242.",
    "lookup": "Order 1234: 42.00 EUR paid on 2026-11-02 by Jane Roe, jane.roe@example.com.",
    "reply": "Dear Jane, your refund of 42.00 EUR for order 1234 is on its way.",
}


class Clerk(BaseChatAgent):
    """Says its line (a stand-in for a model call that handles personal data)."""

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        return Response(chat_message=TextMessage(content=SAYS[self.name], source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


def build_team(store: Store) -> DurableGraphFlow:
    agents = [Clerk(name, f"the {name} clerk") for name in SAYS]
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    builder.add_edge(agents[0], agents[1]).add_edge(agents[1], agents[2])
    return DurableGraphFlow(agents, builder.build(), store=store, run_id=RUN_ID)


def plaintext_in(db: Path, texts: Sequence[str]) -> list[str]:
    """The ``texts`` (or any 12-character piece of them) found in the database file's bytes."""
    with sqlite3.connect(db) as conn:  # fold the WAL into the main file first
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    wal = db.with_name(db.name + "-wal")
    data += wal.read_bytes() if wal.exists() else b""
    found = []
    for text in texts:
        pieces = {text[i : i + 12] for i in range(0, max(1, len(text) - 11), 6)}
        if any(piece.encode() in data for piece in pieces):
            found.append(text)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", type=Path, help="SQLite file for the run (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "sealed.db"
        url = f"sqlite:///{db}"

        print("== a key, as a deployment gives it (GRAPHFLOW_DURABLE_KEYS; never printed)")
        os.environ["GRAPHFLOW_DURABLE_KEYS"] = "k1=" + base64.b64encode(os.urandom(32)).decode()
        keys = Keys.from_env()
        print(f"  {keys!r}")

        print("\n== the run, on Store(url, codec=AESGCMCodec(keys))")
        with Store(url, codec=AESGCMCodec(keys)) as store:
            result = asyncio.run(build_team(store).run(task=TASK))
            print(f"  finished with {len(result.messages)} messages; the transcript, read with the key:")
            for message in store.transcript(RUN_ID):
                print(f"  [{message.body['source']}] {message.body.get('content')}")

        print("\n== the database file")
        with sqlite3.connect(db) as conn:
            (body,) = conn.execute("SELECT body FROM graphflow_messages ORDER BY seq LIMIT 1").fetchone()
        print(f"  a stored message body: {body[:40]}...")
        found = plaintext_in(db, [TASK, *SAYS.values()])
        print(f"  plaintext of the task and messages in the file: {', '.join(found) or 'none'}")

        print("\n== the same store opened without the key")
        with Store(url) as keyless:
            try:
                keyless.transcript(RUN_ID)
            except StoreConfigError as exc:
                print(f"  its transcript is refused: {exc}")
            else:
                print("  its transcript was read without the key", file=sys.stderr)
                return 1
        return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
