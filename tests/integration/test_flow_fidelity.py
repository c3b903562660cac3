"""Drop-in fidelity: where GraphFlow is right, DurableGraphFlow does the same.

Each test runs the same script on plain GraphFlow and on the durable flow and compares what the
caller sees; durability only adds (the store's status, history and results).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from autogen_agentchat.base import TaskResult, TerminationCondition
from autogen_agentchat.conditions import (
    ExternalTermination,
    MaxMessageTermination,
    SourceMatchTermination,
    TextMentionTermination,
)
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import GraphFlow

from agents import Scripted, chain, close_stores, durable, fail_once, stored_transcript, text
from graphflow_durable import DurableGraphFlow, RunLockedError, Store

Setup = Callable[[list[Scripted]], tuple[TerminationCondition | None, int | None]]


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _external(agents: list[Scripted]) -> tuple[TerminationCondition | None, int | None]:
    external = ExternalTermination()

    async def stop_after_b(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if agent.name == "B":
            external.set()

    agents[1].before = stop_after_b
    return external, None


# A chain A -> B -> C -> D stopped after B by each kind of stop GraphFlow knows.
STOPS: dict[str, Setup] = {
    "MaxMessageTermination": lambda agents: (MaxMessageTermination(3), None),
    "SourceMatchTermination": lambda agents: (SourceMatchTermination(["B"]), None),
    "TextMentionTermination": lambda agents: (TextMentionTermination("B#1"), None),
    "ExternalTermination": _external,
    "max_turns": lambda agents: (None, 2),
}


def _agents(setup: Setup) -> tuple[list[Scripted], TerminationCondition | None, int | None]:
    agents = [Scripted(n) for n in "ABCD"]
    condition, max_turns = setup(agents)
    return agents, condition, max_turns


def _seen(results: Sequence[TaskResult]) -> list[tuple[list[tuple[str, str]], str | None]]:
    return [(text(r.messages), r.stop_reason) for r in results]


@pytest.mark.parametrize("stop", sorted(STOPS))
async def test_run_with_no_task_continues_a_round_stopped_by_a_termination_condition(
    store_url: str, stop: str
) -> None:
    agents, condition, max_turns = _agents(STOPS[stop])
    plain = GraphFlow(agents, chain(*agents), termination_condition=condition, max_turns=max_turns)
    expected = _seen([await plain.run(task="go"), await plain.run()])
    assert [[s for s, _ in m] for m, _ in expected] == [["user", "A", "B"], ["C", "D"]]

    agents, condition, max_turns = _agents(STOPS[stop])
    team = durable(agents, chain(*agents), store_url, "run", condition, max_turns=max_turns)
    first = await team.run(task="go")
    assert team.run_info().status == "stopped"
    assert team.run_info().result == {"stop_reason": first.stop_reason}
    second = await team.run()
    assert _seen([first, second]) == expected
    assert team.run_info().status == "finished"
    # the graph completed: unlike GraphFlow (which would start the graph over), nothing runs again
    third = await team.run()
    assert _seen([third]) == _seen([second])
    assert [a.calls for a in agents] == [["A"], ["B"], ["C"], ["D"]]


async def test_a_stopped_round_moved_by_save_and_load_state_continues_in_the_new_team(
    store_url: str,
) -> None:
    agents = [Scripted(n) for n in "ABCD"]
    plain = GraphFlow(agents, chain(*agents), termination_condition=MaxMessageTermination(3))
    await plain.run(task="go")
    state = await plain.save_state()
    fresh = [Scripted(n) for n in "ABCD"]
    plain_moved = GraphFlow(fresh, chain(*fresh), termination_condition=MaxMessageTermination(3))
    await plain_moved.load_state(state)
    expected = await plain_moved.run()
    assert [m.source for m in expected.messages] == ["C", "D"]

    agents = [Scripted(n) for n in "ABCD"]
    team = durable(agents, chain(*agents), store_url, "first", MaxMessageTermination(3))
    first = await team.run(task="go")
    durable_state = await team.save_state()
    assert durable_state["agent_states"][team._group_chat_manager_name]["graphflow_durable"]["status"] == (
        "stopped"
    )
    assert durable_state["agent_states"][team._group_chat_manager_name]["graphflow_durable"][
        "stop_reason"
    ] == (first.stop_reason)
    moved_agents = [Scripted(n) for n in "ABCD"]
    moved = durable(moved_agents, chain(*moved_agents), store_url, "moved", MaxMessageTermination(3))
    await moved.load_state(durable_state)
    assert moved.run_info() is None  # a new run is created when it first runs
    result = await moved.run()
    assert text(result.messages) == text(expected.messages)
    assert result.stop_reason == expected.stop_reason


async def test_the_stop_reason_of_a_finished_run_survives_save_and_load_state(store_url: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), store_url, "first")
    done = await team.run(task="go")
    state = await team.save_state()
    other_agents = [Scripted(n) for n in "AB"]
    other = durable(other_agents, chain(*other_agents), store_url, "other")
    await other.load_state(state)
    again = await other.run()
    assert other.run_info().status == "finished"
    assert (text(again.messages), again.stop_reason) == (text(done.messages), done.stop_reason)
    assert other_agents[0].calls == []  # a finished run runs nothing


async def test_a_plain_graphflow_state_saved_after_a_stop_runs_on_as_graphflow_does(store_url: str) -> None:
    """GraphFlow resets the condition when it fires; the old round must not count again."""
    agents = [Scripted(n) for n in "ABCDE"]
    plain = GraphFlow(agents, chain(*agents), termination_condition=MaxMessageTermination(3))
    await plain.run(task="go")
    state = await plain.save_state()
    expected = await plain.run()
    assert [m.source for m in expected.messages] == ["C", "D", "E"]

    fresh = [Scripted(n) for n in "ABCDE"]
    team = durable(fresh, chain(*fresh), store_url, "legacy", MaxMessageTermination(3))
    await team.load_state(state)
    result = await team.run()
    assert [m.source for m in result.messages] == ["C", "D", "E"]
    assert result.stop_reason == expected.stop_reason
    assert team.run_info().status == "finished"


async def test_load_state_into_a_team_that_already_ran_makes_it_the_new_starting_point(
    store_url: str,
) -> None:
    def script(team: GraphFlow) -> Any:
        async def go() -> list[Any]:
            first = await team.run(task="go")
            state = await team.save_state()
            second = await team.run()
            await team.load_state(state)
            third = await team.run()
            return [text(first.messages), text(second.messages), text(third.messages), third.stop_reason]

        return go()

    plain_agents = [Scripted(n) for n in "ABC"]
    expected = await script(
        GraphFlow(plain_agents, chain(*plain_agents), termination_condition=MaxMessageTermination(3))
    )
    agents = [Scripted(n) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", MaxMessageTermination(3))
    assert await script(team) == expected
    # the earlier history stays in the store; the loaded state continued from its own point
    sources = [s for s, _ in stored_transcript(team)]
    assert sources == ["user", "A", "B", "C", "user", "A", "B", "C"]
    assert team.run_info().status == "finished"
    assert [a.calls for a in agents] == [["A"], ["B"], ["C", "C"]]


async def test_load_state_refuses_a_run_another_process_drives_and_changes_nothing(store_url: str) -> None:
    agents = [Scripted(n) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", MaxMessageTermination(3))
    await team.run(task="go")
    state = await team.save_state()
    before = team.store.load("run")
    with Store(store_url) as other:
        other._driver.acquire_lease("run", "elsewhere", lease_seconds=60, host="another-host", pid=1)
    with pytest.raises(RunLockedError, match="elsewhere"):
        await team.load_state(state)
    after = team.store.load("run")
    assert (after.run.head_seq, len(after.messages)) == (before.run.head_seq, len(before.messages))


# -- the component round trip --------------------------------------------------------------------


async def test_a_component_round_trip_keeps_every_setting(sqlite_url: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    store = Store(sqlite_url, synchronous="NORMAL")
    try:
        team = DurableGraphFlow(
            agents,
            chain(*agents),
            store=store,
            run_id="chosen",
            lease_seconds=12.5,
            allow_graph_change=True,
            interrupt_grace_seconds=2.5,
        )
        config = team.dump_component()
        assert config.config["store"] == f"{sqlite_url}?synchronous=NORMAL"
        assert config.config["interrupt_grace_seconds"] == 2.5
        loaded = DurableGraphFlow.load_component(config)
        assert loaded.dump_component() == config
        assert (loaded.run_id, loaded._session.lease_seconds, loaded._session.allow_graph_change) == (
            "chosen",
            12.5,
            True,
        )
        assert loaded._interrupt_grace == 2.5
        assert loaded.store.config_url == store.config_url
        await team.run(task="go")
        # the reloaded team drives the same run in the same store: it is finished
        assert (await loaded.run()).stop_reason == "Digraph execution is complete"
        assert [a.calls for a in agents] == [["A"], ["B"]]
        loaded.store.close()
    finally:
        store.close()


async def test_a_generated_run_id_is_not_written_so_a_reloaded_team_is_independent(sqlite_url: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), sqlite_url, "unused")
    team._session.run_id_given = False  # as if constructed without run_id
    config = team.dump_component()
    assert config.config.get("run_id") is None
    loaded = DurableGraphFlow.load_component(config)
    assert loaded.run_id != team.run_id
    await team.run(task="go")
    result = await loaded.run(task="go")
    assert [m.source for m in result.messages] == ["user", "A", "B"]
    assert loaded.store.load(loaded.run_id).run.status == "finished"
    loaded.store.close()


def test_a_component_config_never_holds_the_store_password(caplog: pytest.LogCaptureFixture) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = DurableGraphFlow(
        agents, chain(*agents), store="postgresql://app:s3cret@db.example:5432/agents?connect_timeout=5"
    )
    with caplog.at_level(logging.WARNING, logger="graphflow_durable.flow"):
        config = team.dump_component()
    dumped = json.dumps(config.model_dump())
    assert "s3cret" not in dumped
    assert config.config["store"] == "postgresql://app@db.example:5432/agents?connect_timeout=5"
    assert "PGPASSWORD" in caplog.text and "s3cret" not in caplog.text


# -- what a re-run script sees --------------------------------------------------------------------


async def test_rerunning_a_finished_script_returns_the_stored_result_and_runs_nothing(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "AB"]
    done = await durable(agents, chain(*agents), store_url, "run").run(task="report")

    again_agents = [Scripted(n, calls=calls) for n in "AB"]
    again = durable(again_agents, chain(*again_agents), store_url, "run")
    with caplog.at_level(logging.INFO, logger="graphflow_durable.flow"):
        same = await again.run(task="report")
    assert calls == ["A", "B"]
    assert (text(same.messages), same.stop_reason) == (text(done.messages), done.stop_reason)
    assert "returning the stored result" in caplog.text and "reset()" in caplog.text
    # later calls on the same object keep GraphFlow's habit: a task starts a new round
    await again.run(task="report")
    assert calls == ["A", "B", "A", "B"]


async def test_resume_logs_one_info_line_naming_the_run_step_and_nodes_re_run(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agents = [Scripted(n, before=fail_once() if n == "B" else None) for n in "ABC"]
    with pytest.raises(RuntimeError):
        await durable(agents, chain(*agents), store_url, "run").run(task="go")
    fresh = [Scripted(n) for n in "ABC"]
    team = durable(fresh, chain(*fresh), store_url, "run")
    head = team.run_info().head_seq
    with caplog.at_level(logging.INFO, logger="graphflow_durable"):
        await team.run()
    lines = [r.getMessage() for r in caplog.records if "resuming" in r.getMessage()]
    assert lines == [f"run run: resuming after step {head}; re-running B (attempt 2)"]


async def test_loading_a_repaired_plain_state_logs_one_warning_line(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agents = [Scripted(n) for n in "ABCDE"]
    plain = GraphFlow(agents, chain(*agents), termination_condition=MaxMessageTermination(3))
    await plain.run(task="go")
    state = await plain.save_state()
    fresh = [Scripted(n) for n in "ABCDE"]
    team = durable(fresh, chain(*fresh), store_url, "legacy", MaxMessageTermination(3))
    with caplog.at_level(logging.DEBUG, logger="graphflow_durable.flow"):
        await team.load_state(state)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "plain GraphFlow state (3 messages) as stopped" in warnings[0].getMessage()
    assert any(r.levelno == logging.DEBUG and "repaired" in r.getMessage() for r in caplog.records)
