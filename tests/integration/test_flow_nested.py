"""Nested durable teams with no configuration: an inner DurableGraphFlow given no store and no run
id, run inside an agent's turn of a durable run, stores where the outer run does and drives the
run of that turn (its id from the outer turn's idempotency key), so it resumes inside (issue 10)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from autogen_agentchat.agents import BaseChatAgent, SocietyOfMindAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken
from autogen_ext.models.replay import ReplayChatCompletionClient

from agents import Hook, Scripted, chain, close_stores, durable, fail_once
from graphflow_durable import DurableGraphFlow, current_execution


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class InnerTeamAgent(BaseChatAgent):
    """An agent whose turn runs an inner durable team built once, given neither store nor run id."""

    def __init__(self, name: str, calls: list[str], i2_hook: Hook | None = None) -> None:
        super().__init__(name, "runs an inner team")
        self.inner_agents = [
            Scripted(n, calls=calls, before=i2_hook if n == "I2" else None) for n in ("I1", "I2")
        ]
        self.inner = DurableGraphFlow(self.inner_agents, chain(*self.inner_agents), name="inner")
        self.keys: list[str] = []

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        ctx = current_execution()
        assert ctx is not None
        self.keys.append(ctx.idempotency_key)
        result = await self.inner.run(task=list(messages))
        return Response(
            chat_message=TextMessage(content=f"T got {result.messages[-1].to_text()}", source=self.name)
        )

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        await self.inner.reset()


def _outer(
    url: str, run_id: str, calls: list[str], i2_hook: Hook | None = None
) -> tuple[DurableGraphFlow, InnerTeamAgent]:
    a, z = Scripted("A", calls=calls), Scripted("Z", calls=calls)
    t = InnerTeamAgent("T", calls, i2_hook)
    return durable([a, t, z], chain(a, t, z), url, run_id), t  # type: ignore[list-item]


async def test_an_inner_team_with_no_configuration_stores_in_the_outer_store_under_the_outer_key(
    store_url: str,
) -> None:
    calls: list[str] = []
    outer, t = _outer(store_url, "outer", calls)
    await outer.run(task="go")
    assert calls == ["A", "I1", "I2", "Z"]
    assert t.inner.store is outer.store
    assert t.inner.run_id == f"{t.keys[0]}/inner"
    inner_run = outer.store.get_run(t.inner.run_id)
    assert inner_run is not None and inner_run.status == "finished"
    # a second round of the outer team: T's new turn drives a run of its own
    await outer.run(task="again")
    assert len({*t.keys}) == 2
    assert {r.run_id for r in outer.store.list_runs()} == {"outer", *(f"{k}/inner" for k in t.keys)}


async def test_an_interrupted_inner_team_resumes_inside_when_a_new_outer_team_reruns_the_turn(
    store_url: str,
) -> None:
    calls: list[str] = []
    outer, t = _outer(store_url, "outer", calls, i2_hook=fail_once())
    with pytest.raises(RuntimeError):
        await outer.run(task="go")
    assert calls == ["A", "I1", "I2"]

    again, t2 = _outer(store_url, "outer", calls)
    await again.run(task="go")
    # A and I1 answered before the failure: neither runs again; the inner run resumed at I2
    assert calls == ["A", "I1", "I2", "I2", "Z"]
    assert t2.keys == t.keys


async def test_the_outer_turns_key_survives_save_and_load_state_so_the_inner_team_resumes_inside(
    store_url: str,
) -> None:
    calls: list[str] = []
    outer, t = _outer(store_url, "outer", calls, i2_hook=fail_once())
    with pytest.raises(RuntimeError):
        await outer.run(task="go")
    state = await outer.save_state()
    manager = state["agent_states"][outer._group_chat_manager_name]["graphflow_durable"]
    assert manager["keys"] == {"T": t.keys[0]}

    moved, t2 = _outer(store_url, "moved", calls)
    await moved.load_state(state)
    await moved.run()
    assert calls == ["A", "I1", "I2", "I2", "Z"]
    assert t2.keys == t.keys  # the moved turn kept its key, so its inner run was found again


async def test_a_society_of_mind_agent_with_an_unconfigured_durable_inner_team_runs_durably(
    store_url: str,
) -> None:
    calls: list[str] = []
    inner_agents = [Scripted(n, calls=calls) for n in ("I1", "I2")]
    inner = DurableGraphFlow(inner_agents, chain(*inner_agents), name="inner")
    som = SocietyOfMindAgent(
        "som", team=inner, model_client=ReplayChatCompletionClient(["summary 1", "summary 2"])
    )
    a, z = Scripted("A", calls=calls), Scripted("Z", calls=calls)
    outer = durable([a, som, z], chain(a, som, z), store_url, "outer")  # type: ignore[list-item]
    result = await outer.run(task="go")
    assert calls == ["A", "I1", "I2", "Z"]
    assert [m.source for m in result.messages] == [
        "user",
        "A",
        "I1",
        "I2",
        "som",
        "Z",
    ]  # inner ones as events
    inner_runs = [r for r in outer.store.list_runs() if r.run_id != "outer"]
    # SocietyOfMindAgent resets its team after each run: the stored inner run stays finished
    assert [(r.run_id.split("/")[1:], r.status) for r in inner_runs] == [(["som", "3", "inner"], "finished")]
