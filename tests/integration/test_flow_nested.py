"""Nested durable teams with no configuration: an inner DurableGraphFlow given no store and no run
id, run inside an agent's turn of a durable run, stores where the outer run does and drives the
run of that turn (its id from the outer turn's idempotency key), so it resumes inside."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from autogen_agentchat.agents import SocietyOfMindAgent
from autogen_agentchat.base import Response, TaskResult
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken
from autogen_core.models import CreateResult, LLMMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from agents import Gate, Hook, Scripted, TextAgent, chain, close_stores, durable, fail_once
from graphflow_durable import DurableGraphFlow, current_execution
from graphflow_durable.flow import DEFAULT_STORE_ENV


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class InnerTeamAgent(TextAgent):
    """An agent whose turn runs an inner durable team built once, given neither store nor run id."""

    def __init__(self, name: str, calls: list[str], i2_hook: Hook | None = None) -> None:
        super().__init__(name, "runs an inner team")
        self.inner_agents = [
            Scripted(n, calls=calls, before=i2_hook if n == "I2" else None) for n in ("I1", "I2")
        ]
        self.inner = DurableGraphFlow(self.inner_agents, chain(*self.inner_agents), name="inner")
        self.keys: list[str] = []

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


async def test_an_inner_teams_run_records_the_outer_run_as_its_parent_and_is_deleted_with_it(
    store_url: str,
) -> None:
    calls: list[str] = []
    outer, t = _outer(store_url, "outer", calls)
    await outer.run(task="go")
    inner_run = outer.store.get_run(t.inner.run_id)
    assert inner_run is not None and inner_run.parent_run_id == "outer"
    removed = outer.store.delete_run("outer")
    assert removed.run_ids == ("outer", t.inner.run_id)
    assert outer.store.get_run(t.inner.run_id) is None and outer.store.list_runs() == []


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


class Summariser(ReplayChatCompletionClient):
    """A SocietyOfMindAgent's model: answers "summary", records the sources of what it is given,
    and, with a gate, waits (cancellably) before it answers."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        super().__init__(["summary"])
        self.gate = gate
        self.started = asyncio.Event()
        self.seen: list[list[str]] = []

    async def create(  # type: ignore[override]
        self,
        messages: Sequence[LLMMessage],
        *,
        cancellation_token: CancellationToken | None = None,
        **kw: Any,
    ) -> CreateResult:
        self.seen.append([getattr(m, "source", "system") for m in messages])
        if self.gate is not None:
            self.started.set()
            waiting = asyncio.ensure_future(self.gate.wait())
            if cancellation_token is not None:
                cancellation_token.link_future(waiting)
            await waiting
        return await super().create(messages, cancellation_token=cancellation_token, **kw)


#: What the SocietyOfMindAgent's model is given in an uninterrupted turn: its instruction, the
#: inner round's two answers, its response prompt.
SUMMARY_INPUT = ["user", "I1", "I2", "user"]


class SomTeam:
    """A -> som -> C, ``som`` a SocietyOfMindAgent over an unconfigured durable inner team I1 -> I2."""

    def __init__(
        self,
        calls: list[str],
        *,
        run_id: str | None = None,
        inner: DurableGraphFlow | None = None,
        i2_hook: Hook | None = None,
        model_gate: asyncio.Event | None = None,
    ) -> None:
        if inner is None:
            inner_agents = [Scripted("I1", calls=calls), Scripted("I2", calls=calls, before=i2_hook)]
            inner = DurableGraphFlow(inner_agents, chain(*inner_agents), name="inner")  # type: ignore[list-item]
        self.inner = inner
        self.model = Summariser(model_gate)
        som = SocietyOfMindAgent("som", team=inner, model_client=self.model)
        a, c = Scripted("A", calls=calls), Scripted("C", calls=calls)
        # no store: the default store; no run id (unless given): a new random one
        self.outer = DurableGraphFlow([a, som, c], chain(a, som, c), run_id=run_id)  # type: ignore[list-item]

    def close(self) -> None:
        for team in (self.outer, self.inner):
            if team._session.opened_store is not None:
                team._session.opened_store.close()


async def _cancel_when(team: SomTeam, started: asyncio.Event) -> None:
    """Run the outer team and cancel it with its token once ``started`` is set."""
    token = CancellationToken()
    running = asyncio.ensure_future(team.outer.run(task="go", cancellation_token=token))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def _move(first: SomTeam, calls: list[str], how: str) -> tuple[SomTeam, TaskResult]:
    """Resume the interrupted outer run: ``rerun`` (the same team object), ``resume`` (a new team
    object, same run id), or ``save_state()`` / ``load_state()`` into a new run, through JSON text or
    not, with new inner team objects or ``same_inner`` (the first team's inner team object reused)."""
    if how == "rerun":
        return first, await first.outer.run()
    if how == "resume":
        second = SomTeam(calls, run_id=first.outer.run_id)
    else:
        state = await first.outer.save_state()
        if how.startswith("json"):
            state = json.loads(json.dumps(state))
        second = SomTeam(calls, inner=first.inner if how.endswith("same_inner") else None)
        await second.outer.load_state(state)
    return second, await second.outer.run()


@pytest.mark.parametrize("how", ["json", "dict", "json_same_inner", "dict_same_inner", "resume", "rerun"])
async def test_a_society_of_mind_inner_team_interrupted_mid_node_resumes_that_node_in_a_new_outer_team(
    store_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The outer run is cancelled while I2 is in flight (I1 answered), then resumed by a new outer
    team: the outer turn's inner run resumes at I2, and its agent sums up the whole inner round."""
    monkeypatch.setenv(DEFAULT_STORE_ENV, store_url)
    calls: list[str] = []
    gate = Gate()
    first = SomTeam(calls, i2_hook=gate)
    try:
        await _cancel_when(first, gate.started)
        gate.open()  # a reused I2 answers at once on its next turn
        assert calls == ["A", "I1", "I2"]

        second, result = await _move(first, calls, how)
        try:
            # I1 answered before the cancel and never runs again; I2 was in flight and runs again
            assert calls == ["A", "I1", "I2", "I2", "C"]
            assert second.model.seen == [SUMMARY_INPUT]
            said = {m.source: m.to_text() for m in result.messages if isinstance(m, BaseChatMessage)}
            assert said["som"] == "summary"
            assert said["C"].startswith("C#1 ")
        finally:
            if second is not first:
                second.close()
    finally:
        first.close()


@pytest.mark.parametrize("how", ["json", "resume"])
async def test_a_society_of_mind_interrupted_after_its_inner_run_finished_sums_up_that_run(
    store_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Cancelled while the agent's model sums up (its inner run finished, the outer turn not yet
    committed): the new outer team's re-run of the turn runs no inner agent again, and its agent
    sums up the inner round it finished."""
    monkeypatch.setenv(DEFAULT_STORE_ENV, store_url)
    calls: list[str] = []
    first = SomTeam(calls, model_gate=asyncio.Event())
    try:
        await _cancel_when(first, first.model.started)
        assert calls == ["A", "I1", "I2"]

        second, result = await _move(first, calls, how)
        try:
            assert calls == ["A", "I1", "I2", "C"]
            assert second.model.seen == [SUMMARY_INPUT]
            said = {m.source: m.to_text() for m in result.messages if isinstance(m, BaseChatMessage)}
            assert said["som"] == "summary"
        finally:
            second.close()
    finally:
        first.close()


class LoadingTeamAgent(InnerTeamAgent):
    """An agent whose turn loads a given state into its unconfigured inner team, then continues it."""

    def __init__(self, name: str, calls: list[str], seed: Mapping[str, Any]) -> None:
        super().__init__(name, calls)
        self.seed = seed

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        await self.inner.load_state(self.seed)
        result = await self.inner.run()
        return Response(chat_message=TextMessage(content=result.messages[-1].to_text(), source=self.name))


async def test_a_state_loaded_into_a_nested_team_inside_the_outer_turn_is_where_that_turns_run_starts(
    store_url: str,
) -> None:
    seed_calls: list[str] = []
    seed_agents = [Scripted(n, calls=seed_calls) for n in ("I1", "I2")]
    seeder = durable(
        seed_agents, chain(*seed_agents), store_url, "seed", MaxMessageTermination(2), name="inner"
    )
    await seeder.run(task="x")
    assert seed_calls == ["I1"]  # stopped after I1: I2 is left to run
    seed = await seeder.save_state()

    calls: list[str] = []
    a, z = Scripted("A", calls=calls), Scripted("Z", calls=calls)
    t = LoadingTeamAgent("T", calls, seed)
    outer = durable([a, t, z], chain(a, t, z), store_url, "outer")  # type: ignore[list-item]
    await outer.run(task="go")
    assert calls == ["A", "I2", "Z"]  # the loaded state's I1 answered: the turn's run continued it
    inner_run = outer.store.get_run("outer/T/3/inner")
    assert inner_run is not None and inner_run.status == "finished"


class StreamTeamAgent(InnerTeamAgent):
    """An agent that answers with the sources its inner team's stream yielded (as SocietyOfMindAgent
    sums up the stream), and keeps its inner team's state out of its own."""

    def __init__(self, name: str, calls: list[str], i2_hook: Hook | None = None) -> None:
        super().__init__(name, calls, i2_hook)
        self.heard: list[list[str]] = []

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        heard = [
            m.source
            async for m in self.inner.run_stream(task=list(messages), output_task_messages=False)
            if not isinstance(m, TaskResult)
        ]
        self.heard.append(heard)
        return Response(chat_message=TextMessage(content=" ".join(heard), source=self.name))


async def test_another_attempt_of_the_outer_turn_hears_the_inner_rounds_earlier_messages_again(
    store_url: str,
) -> None:
    """The same team objects run the outer run again after a failure inside the inner team: the
    outer turn's second attempt resumes the inner run at I2 and its stream yields I1's answer too."""
    calls: list[str] = []
    a, z = Scripted("A", calls=calls), Scripted("Z", calls=calls)
    t = StreamTeamAgent("T", calls, i2_hook=fail_once())
    outer = durable([a, t, z], chain(a, t, z), store_url, "outer")  # type: ignore[list-item]
    with pytest.raises(RuntimeError):
        await outer.run(task="go")
    await outer.run()
    assert calls == ["A", "I1", "I2", "I2", "Z"]
    assert t.heard == [["I1", "I2"]]  # the failed attempt raised before it answered
