"""Agent states that grow every turn are stored as deltas: bytes per turn stay flat, resume is exact."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from graphflow_durable import DurableGraphFlow, Store


class Remembering(BaseChatAgent):
    """Keeps every message it heard in its state, like a model context; says "again" until told."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "remembers everything")
        self.heard: list[dict[str, str]] = []

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

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


def team(url: str, turns: int) -> tuple[DurableGraphFlow, Remembering, Remembering]:
    a, b, c = Remembering("A"), Remembering("B"), Remembering("C")
    builder = DiGraphBuilder().add_node(a).add_node(b).add_node(c)
    builder.add_edge(a, b).add_edge(b, a, condition="again").add_edge(b, c, condition="done")
    builder.set_entry_point(a)
    flow = DurableGraphFlow(
        [a, b, c],
        builder.build(),
        termination_condition=MaxMessageTermination(turns),
        store=url,
        run_id="grow",
    )
    return flow, a, b


def state_bytes(url: str) -> list[tuple[int, int, bool]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT step_seq, length(body), base_step IS NULL FROM graphflow_agent_states ORDER BY step_seq"
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
