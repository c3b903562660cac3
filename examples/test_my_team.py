"""A user's own test of a durable team: does it survive a crash at any point?

Run it with ``pytest examples/test_my_team.py`` (pytest-asyncio installed; ``--gfd-crash-sample=N``
tries N crash points instead of all, ``--gfd-always-resume`` runs every test of the session with
each run torn down and resumed from the store after every commit).

Three ``AssistantAgent``s in a chain (researcher -> writer -> reviewer) on autogen-ext's
``ReplayChatCompletionClient``: deterministic, no API key. A note on determinism: a replay
client's position in its script is *not* part of the agent's saved state, so an agent resumed
after a crash starts its script from the top again. Give each agent one answer per turn it takes
(here: one agent per turn, each speaks once), or use a scripted client whose answer depends on the
request (``examples/scripted_model.py``), so a resumed agent answers as it did the first time.

The last test puts a person in the loop: an editor (a ``UserProxyAgent``, ``human_input="wait"``)
approves the draft; the run parks until answered, and the crash kit answers for the editor
(``answers=``), so the park and the resume after the answer are crash points too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from autogen_agentchat.agents import AssistantAgent, UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_ext.models.replay import ReplayChatCompletionClient

from graphflow_durable import DurableGraphFlow, Store

ANSWERS = {
    "researcher": "Facts: the bridge opened in 1932 and carries 160,000 vehicles a day.",
    "writer": "Draft: Opened in 1932, the bridge now carries 160,000 vehicles a day.",
    "reviewer": "Approved: the draft matches the facts.",
}


def make_team(run_id: str, *, store: Store | str) -> DurableGraphFlow:
    """A fresh team with fresh agents (the crash kit calls it once per run it makes)."""
    agents = [
        AssistantAgent(name, model_client=ReplayChatCompletionClient([answer]))
        for name, answer in ANSWERS.items()
    ]
    builder = DiGraphBuilder()
    for agent in agents:
        builder.add_node(agent)
    builder.add_edge(agents[0], agents[1]).add_edge(agents[1], agents[2])
    return DurableGraphFlow(agents, builder.build(), store=store, run_id=run_id)


@pytest.mark.asyncio
async def test_the_team_reviews_the_draft(tmp_path: Path) -> None:
    """An ordinary test of the team; ``--gfd-always-resume`` runs it resumed after every commit."""
    result = await make_team("trip", store=f"sqlite:///{tmp_path / 'runs.db'}").run(
        task="Write about the bridge."
    )
    assert [m.source for m in result.messages] == ["user", "researcher", "writer", "reviewer"]
    assert result.messages[-1].to_text() == ANSWERS["reviewer"]


@pytest.mark.asyncio
async def test_the_team_survives_a_crash_at_every_commit(durable_crash_matrix, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Crash the run at each of its commits (and inside each turn), resume it with a fresh team,
    and compare with the uninterrupted run: a difference fails the test, naming the point."""
    await durable_crash_matrix(
        make_team, "Write about the bridge.", store=f"sqlite:///{tmp_path / 'crash.db'}", points="both"
    )


def make_team_with_an_editor(run_id: str, *, store: Store | str) -> DurableGraphFlow:
    """writer -> editor (a person: the run waits for their answer) -> reviewer."""
    writer = AssistantAgent("writer", model_client=ReplayChatCompletionClient([ANSWERS["writer"]]))
    editor = UserProxyAgent("editor")
    reviewer = AssistantAgent("reviewer", model_client=ReplayChatCompletionClient([ANSWERS["reviewer"]]))
    builder = DiGraphBuilder()
    for agent in (writer, editor, reviewer):
        builder.add_node(agent)
    builder.add_edge(writer, editor).add_edge(editor, reviewer)
    return DurableGraphFlow(
        [writer, editor, reviewer], builder.build(), store=store, run_id=run_id, human_input="wait"
    )


@pytest.mark.asyncio
async def test_the_team_with_an_editor_survives_a_crash_at_every_commit(
    durable_crash_matrix, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The editor's answer is given by the kit each time the run waits for it."""
    await durable_crash_matrix(
        make_team_with_an_editor,
        "Write about the bridge.",
        store=f"sqlite:///{tmp_path / 'editor.db'}",
        points="both",
        answers={"editor": "Approved, publish it."},
    )
