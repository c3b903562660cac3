"""The crash kit (graphflow_durable.testing.crash_matrix) on correct and broken teams: it passes a
correct team at every crash point, and finds a save_state that drops a field, an edge condition
that reads a global counter and an effect applied again by a resumed turn, naming the point."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow

import crashkit_teams as teams
from agents import Scripted
from graphflow_durable import testing as kit
from graphflow_durable.errors import UsageError
from graphflow_durable.store import Store
from graphflow_durable.testing import SAMPLE_ENV, CrashReport, _sampled, crash_matrix

# The correct team's reference run commits 9 times: the round's start, then its 8 answers (A, B, C
# three times round the loop... D's, the last, records the end); "both" adds a point inside each turn.
COMMITS, TURNS = 9, 8


def matrix(make_team: Callable[..., Any] | str, url: str, **options: Any) -> CrashReport:
    return asyncio.run(crash_matrix(make_team, "write the report", store=url, **options))


def test_a_correct_team_resumes_identically_after_a_crash_at_every_commit_and_inside_every_turn(
    store_url: str,
) -> None:
    report = matrix(teams.make_team, store_url, points="both")
    assert report.failures == []
    assert report.points == COMMITS + TURNS
    report.assert_ok()
    with Store(store_url) as store:  # every point ran under its own run id, none left held
        runs = store.list_runs()
    assert len(runs) == 1 + report.points
    assert {r.status for r in runs} == {"finished"}
    assert all(r.lease_owner is None for r in runs)


def test_every_commit_is_a_point_from_the_rounds_start_to_its_last_commit(sqlite_url: str) -> None:
    assert matrix(teams.make_team, sqlite_url).points == COMMITS
    assert matrix(teams.make_team, sqlite_url, points="mid-turn").points == TURNS


def test_an_agent_whose_save_state_drops_a_field_is_reported_with_the_point_and_the_difference(
    store_url: str,
) -> None:
    report = matrix(teams.make_forgetful_team, store_url, points="both")
    assert report.failures, "the kit missed the dropped field"
    first = report.failures[0]
    assert first.node == "C"
    assert "transcript differs" in first.difference and "heard" in first.difference
    with pytest.raises(AssertionError, match=rf"crash point {first.point} \(node C\): .*transcript differs"):
        report.assert_ok()


def test_an_edge_condition_that_reads_a_global_counter_is_reported(store_url: str) -> None:
    report = matrix(teams.make_counter_team, store_url)
    assert report.failures, "the kit missed the global counter"
    assert "transcript differs" in report.failures[0].difference
    with pytest.raises(AssertionError, match=r"crash point \d+ \(node \w+\)"):
        report.assert_ok()


def test_an_effect_applied_again_by_a_resumed_turn_is_reported_as_applied_twice(sqlite_url: str) -> None:
    report = matrix(teams.make_effect_twice_team, sqlite_url, points="mid-turn")
    assert [f.node for f in report.failures] == ["D"]
    assert "effect 'sent by D'" in report.failures[0].difference
    assert "applied 2 times" in report.failures[0].difference


def test_the_parallel_fan_out_of_upstreams_graphflow_tests_passes(store_url: str) -> None:
    matrix(teams.make_fanout_team, store_url, points="both").assert_ok()


def test_upstreams_loop_with_an_exit_condition_passes_with_a_model_that_answers_by_the_request(
    store_url: str,
) -> None:
    matrix(teams.make_loop_team, store_url, points="both").assert_ok()


def test_a_replay_clients_position_lost_on_resume_is_reported(sqlite_url: str) -> None:
    report = matrix(teams.make_replay_loop_team, sqlite_url)
    assert report.failures, "the kit missed the replay client's lost position"
    assert report.failures[0].node == "B"
    assert "transcript differs" in report.failures[0].difference


def test_the_worker_pool_examples_team_passes(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_POOL_DELAY", "0")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "examples"))
    import worker_pool

    report = matrix(worker_pool.team, sqlite_url, points="both")
    assert report.points == 9  # the round's start and 4 answers, and inside each of the 4 turns
    report.assert_ok()


def test_the_always_resume_switch_is_off_for_the_kits_runs_and_restored_after(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def make_team(run_id: str, *, store: Store) -> Any:
        seen.append(os.environ.get("GRAPHFLOW_DURABLE_ALWAYS_RESUME"))
        return teams.make_team(run_id, store=store)

    monkeypatch.setenv("GRAPHFLOW_DURABLE_ALWAYS_RESUME", "1")
    matrix(make_team, sqlite_url, sample=2).assert_ok()
    assert seen and set(seen) == {None}
    assert os.environ["GRAPHFLOW_DURABLE_ALWAYS_RESUME"] == "1"


def test_sample_picks_evenly_spaced_points_with_the_first_and_the_last(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _sampled(10, 3) == [0, 4, 9]  # round(4.5) is 4
    assert _sampled(10, 1) == [0]
    assert _sampled(4, 9) == [0, 1, 2, 3]
    assert _sampled(5, None) == [0, 1, 2, 3, 4]
    assert matrix(teams.make_team, sqlite_url, sample=4).points == 4
    monkeypatch.setenv(SAMPLE_ENV, "2")
    assert matrix(teams.make_team, sqlite_url).points == 2
    assert matrix(teams.make_team, sqlite_url, sample=3).points == 3  # an explicit sample wins


@pytest.mark.parametrize(
    ("make_team", "options", "env", "message"),
    [
        (
            teams.make_team,
            {"points": "sometimes"},
            None,
            "points must be 'every-commit', 'mid-turn' or 'both'",
        ),
        (teams.make_team, {"mode": "thread"}, None, "mode must be 'inprocess' or 'subprocess'"),
        (teams.make_team, {"sample": 0}, None, "sample must be an int 1 or more, not 0"),
        (teams.make_team, {"store": 42}, None, "store must be a Store or a store URL, not int"),
        (teams.make_team, {}, "many", f"{SAMPLE_ENV}='many' is not a number"),
        ("crashkit_teams", {}, None, "is not 'module:factory'"),
        ("crashkit_teams:nothing", {}, None, "cannot be imported"),
        (
            lambda run_id, store: None,
            {"mode": "subprocess"},
            None,
            "cannot be imported by name in a subprocess",
        ),
    ],
)
def test_bad_input_is_a_one_line_usage_error_naming_the_fix(
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    make_team: Any,
    options: dict[str, Any],
    env: str | None,
    message: str,
) -> None:
    if env is not None:
        monkeypatch.setenv(SAMPLE_ENV, env)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with pytest.raises(UsageError, match=message) as caught:
        asyncio.run(crash_matrix(make_team, "write the report", **{"store": url, **options}))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "runs.db").exists()  # nothing was run


@pytest.mark.crash
def test_subprocess_mode_sigkills_real_processes_at_a_sample_of_the_points(sqlite_url: str) -> None:
    report = matrix("crashkit_teams:make_team", sqlite_url, points="both", mode="subprocess", sample=3)
    assert report.points == 3
    report.assert_ok()  # a process that was not killed at its point is a failure


@pytest.mark.crash
def test_subprocess_mode_finds_the_dropped_field_too(sqlite_url: str) -> None:
    report = matrix(teams.make_forgetful_team, sqlite_url, mode="subprocess", sample=3)
    assert [f.node for f in report.failures] == ["B"]
    assert "transcript differs" in report.failures[0].difference


def test_the_crash_kit_page_example_runs_and_passes(tmp_path: Path) -> None:
    page = Path(__file__).parents[2] / "docs" / "crash-kit.md"
    code = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)[0]
    script = tmp_path / "crash_kit_example.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    # A passing kit prints its report and nothing else: no traceback, no warning of the crashed runs.
    assert (done.stdout, done.stderr) == ("7 crash points, 0 failures\n", "")


def plain_graphflow(run_id: str, *, store: Any) -> Any:
    """A factory that forgot the durable team: GraphFlow's own."""
    agent = Scripted("A")
    return GraphFlow([agent], DiGraphBuilder().add_node(agent).build())


@pytest.mark.parametrize(
    ("make_team", "message"),
    [
        (plain_graphflow, "make_team: the team factory returned GraphFlow, expected a DurableGraphFlow"),
        (lambda run_id, store: None, "make_team: the team factory returned NoneType, expected a"),
        (lambda run_id: None, r"make_team: the team factory cannot be called as factory\(run_id, store"),
        (lambda run_id, store: 1 / 0, "make_team: the team factory raised ZeroDivisionError"),
    ],
    ids=["graphflow", "none", "signature", "raises"],
)
def test_a_factory_that_gives_no_durable_team_is_a_usage_error_naming_make_team(
    sqlite_url: str, make_team: Any, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        matrix(make_team, sqlite_url)
    assert caught.value.option == "make_team" and "\n" not in str(caught.value)


def test_record_effect_outside_a_crash_matrix_keeps_nothing(sqlite_url: str) -> None:
    async def runs() -> None:
        for n in range(3):  # B and D record an effect in each run's turns
            await teams.make_team(f"production-{n}", store=sqlite_url).run(task="write the report")

    asyncio.run(runs())
    assert kit._ledger == []
    report = matrix(teams.make_team, sqlite_url, sample=2)  # in a matrix, effects are still checked
    report.assert_ok()
    assert kit._ledger == []


def test_a_team_with_a_waiting_person_passes_when_the_kit_answers_for_them(store_url: str) -> None:
    prompts: list[str] = []

    def finance(prompt: str) -> str:
        prompts.append(prompt)
        return "within budget"

    report = matrix(teams.make_approval_team, store_url, points="both", answers={"approver": "approved"})
    report.assert_ok()
    assert report.points >= 7  # the park, the answer's resume and what follows are points too
    report = matrix(
        teams.make_two_approvals_team, store_url, answers={"legal": "cleared", "finance": finance}
    )
    report.assert_ok()
    assert prompts and all(p == prompts[0] for p in prompts)
    with Store(store_url) as store:
        runs = store.list_runs()
        assert {r.status for r in runs} == {"finished"}
        answered = [
            m.body["content"]
            for r in runs
            if r.run_id.endswith("-reference")
            for m in store.load(r.run_id).messages
            if m.body.get("source") in ("approver", "legal", "finance")
        ]
    assert sorted(answered) == ["approved", "cleared", "within budget"]


@pytest.mark.crash
def test_subprocess_mode_answers_a_waiting_person_in_the_killed_process_and_after(sqlite_url: str) -> None:
    report = matrix(
        "crashkit_teams:make_approval_team",
        sqlite_url,
        points="both",
        mode="subprocess",
        sample=4,
        answers={"approver": "approved"},
    )
    assert report.points == 4
    report.assert_ok()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"node approver waits for input .*; give crash_matrix answers=\{'approver': 'the answer'\}"),
        ({"answers": {"approver": 1}}, "answers must map node names to an answer's text or a function"),
        ({"answers": {"nobody": "x"}}, "answers names 'nobody', which is not a participant"),
        (
            {"answers": {"approver": str.upper}, "mode": "subprocess"},
            "mode='subprocess' takes answers given as text",
        ),
    ],
    ids=["missing", "not-text", "unknown-node", "function-in-subprocess"],
)
def test_answers_that_do_not_answer_the_waiting_person_are_a_usage_error(
    sqlite_url: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        matrix("crashkit_teams:make_approval_team", sqlite_url, **options)
    assert caught.value.option == "answers" and "\n" not in str(caught.value)


def test_a_passing_matrix_logs_nothing_at_warning_or_above(
    store_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.WARNING)
    matrix(teams.make_team, store_url, points="both").assert_ok()
    matrix(teams.make_approval_team, store_url, points="both", answers={"approver": "ok"}).assert_ok()
    gc.collect()  # a task of a crashed team left pending would be reported now
    assert [r.getMessage() for r in caplog.records] == []
    assert capfd.readouterr() == ("", "")
