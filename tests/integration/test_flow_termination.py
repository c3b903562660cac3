"""Termination conditions continue across a resume, see every message of a
parallel batch, and are reset by a stop for the next round (as GraphFlow does)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import GraphFlow

from agents import (
    CommitSpy,
    Scripted,
    chain,
    close_stores,
    durable,
    fail_once,
    fan,
    stored_transcript,
    text,
    wait_for,
)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def test_max_message_budget_continues_across_resume_instead_of_restarting(store_url: str) -> None:
    ref_agents = [Scripted(n) for n in "ABCDE"]
    reference = await durable(ref_agents, chain(*ref_agents), store_url, "ref", MaxMessageTermination(4)).run(
        task="go"
    )
    assert [m.source for m in reference.messages] == ["user", "A", "B", "C"]

    agents = [Scripted(n, before=fail_once() if n == "B" else None) for n in "ABCDE"]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), store_url, "run", MaxMessageTermination(4)).run(task="go")

    calls: list[str] = []
    fresh = [Scripted(n, calls=calls) for n in "ABCDE"]
    team = durable(fresh, chain(*fresh), store_url, "run", MaxMessageTermination(4))
    result = await team.run()
    # a restarted budget would have let B, C, D and E speak (4 new messages)
    assert calls == ["B", "C"]
    assert result.stop_reason == reference.stop_reason
    assert stored_transcript(team) == text(reference.messages)


def _stop_said_first(calls: list[str]) -> tuple[list[Scripted], list[CommitSpy]]:
    """A -> (B, C) -> D where B says STOP and finishes (is committed) before C."""
    holder: list[CommitSpy] = []

    async def after_b(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if holder:
            await wait_for(lambda: holder[0].completed("B"))
        else:
            await wait_for(lambda: "B" in calls)

    agents = [
        Scripted("A", calls=calls),
        Scripted("B", ["STOP"], calls=calls),
        Scripted("C", calls=calls, before=after_b),
        Scripted("D", calls=calls),
    ]
    return agents, holder


async def test_every_message_of_a_parallel_batch_reaches_the_termination_condition(store_url: str) -> None:
    calls: list[str] = []
    agents, holder = _stop_said_first(calls)
    team = durable(agents, fan(*agents), store_url, "batch", TextMentionTermination("STOP"))
    holder.append(CommitSpy(team))
    result = await team.run(task="go")
    # B (first to finish) said STOP; C finished the batch; the run stops before D
    assert result.stop_reason == "Text 'STOP' mentioned"
    assert calls == ["A", "B", "C"]
    assert team.run_info().status == "stopped"  # D is left ready: run() with no task continues


async def test_plain_graphflow_misses_a_stop_word_said_by_the_first_finishing_sibling() -> None:
    """The contrast for the test above (autogen-agentchat 0.7.x checks only the last answer)."""
    calls: list[str] = []
    agents, _ = _stop_said_first(calls)
    result = await GraphFlow(agents, fan(*agents), termination_condition=TextMentionTermination("STOP")).run(
        task="go"
    )
    assert calls == ["A", "B", "C", "D"]
    assert result.stop_reason == "Digraph execution is complete"


async def test_stop_by_a_condition_resets_it_for_the_next_round_as_graphflow_does(store_url: str) -> None:
    plain_agents = [Scripted(n) for n in "ABC"]
    plain = GraphFlow(plain_agents, chain(*plain_agents), termination_condition=MaxMessageTermination(3))
    plain_rounds = [await plain.run(task="go"), await plain.run(task="next")]

    agents = [Scripted(n) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "rounds", MaxMessageTermination(3))
    first = await team.run(task="go")
    assert first.stop_reason == "Maximum number of messages 3 reached, current message count: 3"
    second = await team.run(task="next")
    # the condition starts from zero in the new round: it does not fire at once on "next"
    assert text(second.messages) == [("user", "next"), ("C", text(second.messages)[1][1])]
    assert second.stop_reason == "Digraph execution is complete"
    assert [text(r.messages) for r in (first, second)] == [text(r.messages) for r in plain_rounds]
    assert [r.stop_reason for r in (first, second)] == [r.stop_reason for r in plain_rounds]
