"""The always-resume test mode ($GRAPHFLOW_DURABLE_ALWAYS_RESUME=1, ``pytest --gfd-always-resume``):
a run is torn down after each answer's commit and resumed from the store, within one call."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination

from agents import Scripted, chain, close_stores, durable, loop_agents, loop_graph, stored_transcript, text
from graphflow_durable._runtime.config import ALWAYS_RESUME_ENV
from graphflow_durable.context import current_execution
from graphflow_durable.store import StepKind


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class DropsTurn(Scripted):
    """A broken agent: its saved state drops its turn counter, so an agent rebuilt from the store
    counts from 0 again (its replies say ``#1`` where the uninterrupted run said ``#2``)."""

    async def save_state(self) -> Mapping[str, Any]:
        return {}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        pass


async def _loop_run(url: str, run_id: str, broken: str | None = None) -> tuple[list[str], TaskResult, Any]:
    calls: list[str] = []
    agents = loop_agents(calls)
    if broken is not None:
        agents[broken] = DropsTurn(broken, calls=calls)
    team = durable(agents, loop_graph(agents), url, run_id, MaxMessageTermination(60))
    return calls, await team.run(task="go"), team


async def test_always_resume_gives_a_correct_team_the_uninterrupted_transcript(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain_calls, plain, _ = await _loop_run(store_url, "plain")
    monkeypatch.setenv(ALWAYS_RESUME_ENV, "1")
    calls, result, team = await _loop_run(store_url, "resumed")
    assert text(result.messages) == text(plain.messages)
    assert result.stop_reason == plain.stop_reason
    assert stored_transcript(team) == text(plain.messages)
    assert calls == plain_calls, "every turn ran once: a resume re-runs nothing that was committed"
    assert team.run_info().status == "finished"
    # Torn down and resumed after every answer that dispatched a next batch (one resume each:
    # linear), the parallel batch P1 | P2 ending before its resume.
    kinds = [s.kind for s in team.store.load("resumed").steps]
    answers_that_dispatched = len(plain_calls) - 1 - 1  # not E (the end), and P1's answer waits for P2's
    assert kinds.count(StepKind.RESUME) == answers_that_dispatched
    assert kinds.count(StepKind.INTERRUPT) == answers_that_dispatched


async def test_always_resume_streams_what_the_uninterrupted_run_streams(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = [Scripted(n) for n in "ABC"]
    plain = [m async for m in durable(agents, chain(*agents), sqlite_url, "plain").run_stream(task="go")]
    monkeypatch.setenv(ALWAYS_RESUME_ENV, "1")
    again = [Scripted(n) for n in "ABC"]
    items = [m async for m in durable(again, chain(*again), sqlite_url, "resumed").run_stream(task="go")]
    assert text([m for m in items if not isinstance(m, TaskResult)]) == text(
        [m for m in plain if not isinstance(m, TaskResult)]
    )
    last, reference = items[-1], plain[-1]
    assert isinstance(last, TaskResult) and isinstance(reference, TaskResult)
    assert text(last.messages) == text(reference.messages)
    assert last.stop_reason == reference.stop_reason


async def test_always_resume_shows_an_agent_whose_saved_state_drops_a_field(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, plain, _ = await _loop_run(store_url, "plain", broken="J")
    monkeypatch.setenv(ALWAYS_RESUME_ENV, "1")
    _, result, _ = await _loop_run(store_url, "resumed", broken="J")
    assert text(result.messages) != text(plain.messages)
    # J's turns: it counted from 0 again after each rebuild from the store.
    assert [c.split()[0] for source, c in text(plain.messages) if source == "J"] == ["J#1", "J#2", "J#3"]
    assert [c.split()[0] for source, c in text(result.messages) if source == "J"] == ["J#1"] * 3


async def test_without_the_switch_a_run_is_never_torn_down(sqlite_url: str) -> None:
    _, _, team = await _loop_run(sqlite_url, "plain")
    kinds = [s.kind for s in team.store.load("plain").steps]
    assert StepKind.RESUME not in kinds and StepKind.INTERRUPT not in kinds


async def test_always_resume_runs_each_turn_as_its_first_attempt(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node dispatched in the last commit before the tear-down had not started: its turn after the
    resume is its first attempt (its key's step is the dispatch's step, which counts the mode's
    interrupt and resume steps too)."""

    async def runs(label: str) -> list[tuple[str, int, str]]:
        seen: list[tuple[str, int, str]] = []

        async def note(agent: Scripted, messages: object) -> None:
            ctx = current_execution()
            assert ctx is not None
            seen.append((agent.name, ctx.attempt, ctx.idempotency_key.replace(label, "run")))

        agents = [Scripted(n, before=note) for n in "ABC"]
        await durable(agents, chain(*agents), sqlite_url, label).run(task="go")
        return seen

    plain = await runs("plain")
    monkeypatch.setenv(ALWAYS_RESUME_ENV, "1")
    resumed = await runs("resumed")
    assert [(node, attempt) for node, attempt, _ in resumed] == [(n, a) for n, a, _ in plain]
    assert [attempt for _, attempt, _ in plain] == [1, 1, 1]
    assert len({key for _, _, key in resumed}) == 3
