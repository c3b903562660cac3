"""Teams for the crash kit's tests (importable by name, for ``mode="subprocess"``): a correct one
with a conditional loop and idempotent effects, and two broken ones the kit must catch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autogen_agentchat.agents import AssistantAgent, UserProxyAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraph, DiGraphBuilder, DiGraphEdge, DiGraphNode
from autogen_core.models import CreateResult, LLMMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from agents import Scripted
from graphflow_durable import current_execution
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.testing import record_effect

#: The outside world the effects land in: what was done, by idempotency key.
DONE: set[str] = set()
#: A counter kept outside every agent's state (the bug of the counter team).
COUNTER = {"n": 0}


async def send_once(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    """An effect done once per turn, whatever the attempt: checked against its idempotency key."""
    ctx = current_execution()
    assert ctx is not None
    if ctx.idempotency_key not in DONE:
        DONE.add(ctx.idempotency_key)
        record_effect(f"sent by {agent.name}")


async def send_always(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    """The same effect, done again by a turn that runs again (no idempotency key)."""
    record_effect(f"sent by {agent.name}")


def _team(
    run_id: str, store: Any, agents: list[Any], loop: tuple[Any, Any], **conditions: Any
) -> DurableGraphFlow:
    a, b, c, d = agents
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    builder.add_edge(a, b)
    builder.add_edge(b, c)
    builder.add_edge(c, b, condition=loop[0], activation_group="loop", activation_condition="any")
    builder.add_edge(c, d, condition=loop[1])
    builder.set_entry_point(a)
    return DurableGraphFlow(
        agents,
        builder.build(),
        termination_condition=MaxMessageTermination(30),
        store=store,
        run_id=run_id,
        **conditions,
    )


def make_team(run_id: str, *, store: Any, **durable: Any) -> DurableGraphFlow:
    """A -> B -> C, C loops back to B when it says "again" (twice), then C -> D ("done"); B and D
    send an effect once per turn."""
    agents = [
        Scripted("A"),
        Scripted("B", before=send_once),
        Scripted("C", says=["again", "again", "done"]),
        Scripted("D", before=send_once),
    ]
    return _team(run_id, store, agents, ("again", "done"), **durable)


def make_effect_twice_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """As :func:`make_team`, but D sends its effect again when its turn runs again."""
    agents = [
        Scripted("A"),
        Scripted("B"),
        Scripted("C", says=["again", "again", "done"]),
        Scripted("D", before=send_always),
    ]
    return _team(run_id, store, agents, ("again", "done"))


class Forgetful(Scripted):
    """Counts the messages it has heard and says the count; its saved state drops the count."""

    def __init__(self, name: str, says: Sequence[str] = ()) -> None:
        super().__init__(name, says)
        self.heard = 0

    async def on_messages(self, messages: Sequence[BaseChatMessage], cancellation_token: Any) -> Any:
        self.heard += len(messages)
        response = await super().on_messages(messages, cancellation_token)
        response.chat_message.content += f" heard {self.heard}"  # type: ignore[union-attr]
        return response

    async def save_state(self) -> Mapping[str, Any]:
        return {"turn": self.turn}  # the bug: "heard" is not saved

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.turn = int(state["turn"])


def make_forgetful_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """As :func:`make_team`, with C an agent whose save_state drops a field."""
    agents = [Scripted("A"), Scripted("B"), Forgetful("C", says=["again", "again", "done"]), Scripted("D")]
    return _team(run_id, store, agents, ("again", "done"))


async def count(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    COUNTER["n"] += 1


def make_counter_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """C loops back to B while a global counter (of C's turns, outside every agent's state) is
    below 3: a fresh process starts it at 0 again."""
    COUNTER["n"] = 0
    agents = [Scripted("A"), Scripted("B"), Scripted("C", before=count), Scripted("D")]
    return _team(
        run_id,
        store,
        agents,
        (lambda _m: COUNTER["n"] < 3, lambda _m: COUNTER["n"] >= 3),
    )


def make_fanout_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """AutoGen's own GraphFlow test shape of a parallel fan-out joined by "all" (upstream's
    ``test_digraph_group_chat_parallel_join_all``): A -> (B, C) -> D; B and C send an effect once."""
    a, b, c, d = (
        Scripted("A"),
        Scripted("B", before=send_once),
        Scripted("C", before=send_once),
        Scripted("D"),
    )
    builder = DiGraphBuilder()
    for agent in (a, b, c, d):
        builder.add_node(agent)
    builder.add_edge(a, b).add_edge(a, c).add_edge(b, d).add_edge(c, d)
    builder.set_entry_point(a)
    return DurableGraphFlow([a, b, c, d], builder.build(), store=store, run_id=run_id)


class ByRequest(ReplayChatCompletionClient):
    """A ReplayChatCompletionClient that answers by the request, not by its position: the n-th
    answer when A has spoken n times in what it is sent, so a restored agent answers the same."""

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        self._current_index = max(0, sum(getattr(m, "source", None) == "A" for m in messages) - 1)
        return await super().create(messages, **kwargs)


def _loop_with_exit(run_id: str, store: Any, client: ReplayChatCompletionClient) -> DurableGraphFlow:
    """Upstream's ``test_digraph_group_chat_loop_with_exit_condition``: A -> B -> C, B (an
    AssistantAgent) loops back to A on "loop" twice, then exits to C."""
    a, c = Scripted("A"), Scripted("C")
    b = AssistantAgent("B", description="Decision agent B", model_client=client)
    graph = DiGraph(
        nodes={
            "A": DiGraphNode(name="A", edges=[DiGraphEdge(target="B")]),
            "B": DiGraphNode(
                name="B",
                edges=[DiGraphEdge(target="C", condition="exit"), DiGraphEdge(target="A", condition="loop")],
            ),
            "C": DiGraphNode(name="C", edges=[]),
        },
        default_start_node="A",
    )
    return DurableGraphFlow(
        [a, b, c], graph, termination_condition=MaxMessageTermination(20), store=store, run_id=run_id
    )


def make_loop_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """Upstream's loop with an exit condition, B's model answering by the request."""
    return _loop_with_exit(run_id, store, ByRequest(["loop", "loop", "exit"]))


def make_replay_loop_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """The same with upstream's plain ReplayChatCompletionClient: its position is not in B's
    saved state, so a B restored after a crash answers from the start of the list again."""
    return _loop_with_exit(run_id, store, ReplayChatCompletionClient(["loop", "loop", "exit"]))


def _never_asked(prompt: str) -> str:
    raise AssertionError(f"a waiting UserProxyAgent's own input function was called: {prompt!r}")


def make_approval_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """A -> approver (a UserProxyAgent, ``human_input="wait"``: the run parks until answered) -> B,
    where B sends an effect once; the approver's answer decides nothing else."""
    a, b = Scripted("A"), Scripted("B", before=send_once)
    approver = UserProxyAgent("approver", input_func=_never_asked)
    builder = DiGraphBuilder()
    for agent in (a, approver, b):
        builder.add_node(agent)
    builder.add_edge(a, approver).add_edge(approver, b)
    return DurableGraphFlow([a, approver, b], builder.build(), store=store, run_id=run_id, human_input="wait")


def make_two_approvals_team(run_id: str, *, store: Any) -> DurableGraphFlow:
    """A -> legal -> finance -> B: two UserProxyAgents in a row, each ``human_input="wait"`` (the
    run parks twice)."""
    a, b = Scripted("A"), Scripted("B")
    legal = UserProxyAgent("legal", input_func=_never_asked)
    finance = UserProxyAgent("finance", input_func=_never_asked)
    builder = DiGraphBuilder()
    for agent in (a, legal, finance, b):
        builder.add_node(agent)
    builder.add_edge(a, legal).add_edge(legal, finance).add_edge(finance, b)
    return DurableGraphFlow(
        [a, legal, finance, b], builder.build(), store=store, run_id=run_id, human_input="wait"
    )
