"""Agent states that grow every turn are stored as deltas: bytes per turn stay flat, resume is exact."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from agents import TextAgent
from graphflow_durable import DurableGraphFlow, Store
from graphflow_durable.errors import StoreError


class Remembering(TextAgent):
    """Keeps every message it heard in its state, like a model context; says "again" until told."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "remembers everything")
        self.heard: list[dict[str, str]] = []

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        self.heard.extend({"source": m.source, "text": m.to_text()} for m in messages)
        reply = f"{self.name} has heard {len(self.heard)} messages " + "x" * 200 + " again"
        return Response(chat_message=TextMessage(content=reply, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        self.heard = []

    async def save_state(self) -> Mapping[str, Any]:
        return {"heard": list(self.heard)}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.heard = list(state["heard"])


def team(
    url: str, turns: int, kind: type[Remembering] = Remembering, run_id: str = "grow"
) -> tuple[DurableGraphFlow, Remembering, Remembering]:
    """A loop A <-> B (exit to C on "done"), stopped after ``turns`` messages."""
    a, b, c = kind("A"), kind("B"), kind("C")
    builder = DiGraphBuilder().add_node(a).add_node(b).add_node(c)
    builder.add_edge(a, b).add_edge(b, a, condition="again").add_edge(b, c, condition="done")
    builder.set_entry_point(a)
    flow = DurableGraphFlow(
        [a, b, c],
        builder.build(),
        termination_condition=MaxMessageTermination(turns),
        store=url,
        run_id=run_id,
    )
    return flow, a, b


def state_bytes(url: str) -> list[tuple[int, int, bool]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT step_seq, length(body), coalesce(base_step, 0) = 0 FROM graphflow_agent_states ORDER BY step_seq"
            )
        ).all()
    engine.dispose()
    return [(int(s), int(n), bool(full)) for s, n, full in rows]


async def test_growing_agent_state_is_written_as_deltas_with_flat_bytes_per_turn(sqlite_url: str) -> None:
    flow, a, _ = team(sqlite_url, 120)
    await flow.run(task="start")
    rows = state_bytes(sqlite_url)
    turn_rows = rows[3:]  # after the three whole snapshots of the "created" step
    assert sum(1 for _, _, full in turn_rows if not full) > len(turn_rows) * 0.8
    last_state = len(str(a.heard))
    total = sum(n for _, n, _ in turn_rows)
    # Whole states every turn would write ~ turns * last_state / 2; deltas write a bounded multiple
    # of what changed (the new messages), plus a snapshot whenever the deltas add up to one.
    assert total < len(turn_rows) * 1200
    assert total < len(turn_rows) * last_state / 8


async def test_a_resumed_run_sees_the_exact_state_rebuilt_from_deltas(sqlite_url: str) -> None:
    flow, a, b = team(sqlite_url, 60)
    await flow.run(task="start")
    with Store(sqlite_url) as store:
        log = store.load("grow")
    assert log.agent_states["A"] == await a.save_state()
    assert log.agent_states["B"] == await b.save_state()
    fresh, _, _ = team(sqlite_url, 60)
    state = await fresh.save_state()
    assert state["agent_states"]["A"]["agent_state"] == {"heard": a.heard}


class Chatting(Remembering):
    """Keeps what it heard and what it said verbatim, like a model context; long, unique replies."""

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        self.heard.extend({"role": "user", "content": m.to_text()} for m in messages)
        reply = f"{self.name} turn {len(self.heard)}: " + os.urandom(600).hex() + " again"
        self.heard.append({"role": "assistant", "content": reply})
        return Response(chat_message=TextMessage(content=reply, source=self.name))

    async def save_state(self) -> Mapping[str, Any]:
        return {"context": [dict(m) for m in self.heard], "turns": len(self.heard)}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.heard = [dict(m) for m in state["context"]]


def chatting_team(url: str, turns: int) -> tuple[DurableGraphFlow, Remembering, Remembering]:
    return team(url, turns, Chatting, "chat")


async def test_an_agent_state_repeating_the_messages_references_them_instead_of_storing_them_twice(
    store_url: str,
) -> None:
    flow, a, b = chatting_team(store_url, 80)
    await flow.run(task="start")
    flow.store.close()
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT step_seq, base_step, body FROM graphflow_agent_states WHERE node = 'A' ORDER BY step_seq"
            )
        ).all()
        message_chars = conn.execute(sa.text("SELECT sum(length(body)) FROM graphflow_messages")).scalar_one()
    engine.dispose()
    bodies = [json.loads(body) for _, _, body in rows]
    splices = [body for (_, base, _), body in zip(rows, bodies, strict=True) if base]
    assert len(splices) > len(rows) * 0.8
    # Every turn adds the partner's message and A's own reply (~1.2 KB each) to A's context; the
    # rows refer to both messages by their sequence number instead of holding them.
    assert all(any(isinstance(p, int) for p in s["put"]) for s in splices)
    state_chars = sum(len(body) for _, _, body in rows)
    assert state_chars < message_chars / 6
    with Store(store_url) as store:
        log = store.load("chat")
    assert log.agent_states["A"] == json.loads(json.dumps(await a.save_state()))
    assert log.agent_states["B"] == json.loads(json.dumps(await b.save_state()))


async def test_a_run_resumed_from_splices_goes_on_writing_them_and_resumes_exactly_again(
    sqlite_url: str,
) -> None:
    flow, _, _ = chatting_team(sqlite_url, 30)
    await flow.run(task="start")
    second, a, b = chatting_team(sqlite_url, 30)
    await second.run(task="go on")  # a new round: restored from the log, then more splices
    assert len(a.heard) > 30
    with Store(sqlite_url) as store:
        log = store.load("chat")
    assert log.agent_states["A"] == await a.save_state()
    assert log.agent_states["B"] == await b.save_state()
    third, _, _ = chatting_team(sqlite_url, 30)
    state = await third.save_state()
    assert state["agent_states"]["A"]["agent_state"] == await a.save_state()


async def test_a_splice_referring_to_a_message_the_log_lacks_is_reported_as_corruption(
    sqlite_url: str,
) -> None:
    flow, _, _ = chatting_team(sqlite_url, 10)
    await flow.run(task="start")
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        step, body = conn.execute(
            sa.text(
                "SELECT step_seq, body FROM graphflow_agent_states WHERE node = 'A' AND base_step > 0 "
                "ORDER BY step_seq DESC LIMIT 1"
            )
        ).one()
        patch = json.loads(body)
        patch["put"] = [999999 if isinstance(p, int) else p for p in patch["put"]]
        conn.execute(
            # checksum NULL (as a row written before schema 6): this test is about the fold check
            sa.text(
                "UPDATE graphflow_agent_states SET body = :b, checksum = NULL WHERE node = 'A' AND step_seq = :s"
            ),
            {"b": json.dumps(patch), "s": step},
        )
    engine.dispose()
    with (
        Store(sqlite_url) as store,
        pytest.raises(StoreError, match=rf"node 'A' saved at step {step}.*corrupt"),
    ):
        store.load("chat")
