"""Answers that are not plain text, on both backends: a lone surrogate (what a command-line argument
that is not UTF-8 becomes) is refused with a one-line UsageError and nothing is stored; an answer
holding NUL is stored and reaches the resumed run exactly, whether given with respond() or returned
by an inline input function; request texts stored before they were JSON are migrated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder

from graphflow_durable import DurableGraphFlow, Store, UsageError
from graphflow_durable._storage import migrations as _migrations
from graphflow_durable._storage.engine import open_engines
from graphflow_durable.cli.runs import EXIT_USAGE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted

NUL_ANSWER = "yes\x00and no"


def _team(url: str, mode: str, answer: str = "typed") -> DurableGraphFlow:
    """A -> H -> C; H's input function returns ``answer``."""
    a, c = Scripted("A"), Scripted("C")
    h = UserProxyAgent("H", input_func=lambda prompt: answer)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    return DurableGraphFlow([a, h, c], graph, store=url, run_id="r", human_input=mode)  # type: ignore[arg-type]


def _h_said(team: DurableGraphFlow) -> list[str]:
    return [str(m.body.get("content")) for m in team.store.load("r").messages if m.body["source"] == "H"]


async def test_an_answer_with_a_lone_surrogate_is_refused_and_nothing_is_stored(store_url: str) -> None:
    team = _team(store_url, "wait")
    await team.run(task="go")
    with pytest.raises(UsageError, match="lone surrogate") as caught:
        team.store.respond("r", "a\ud800b")
    assert "\n" not in str(caught.value) and "answer" in str(caught.value)
    [request] = team.store.pending_requests("r")
    assert (request.status, request.answer) == ("pending", None)
    assert team.run_info().status == "waiting"  # type: ignore[union-attr]
    for bad in ({"node": "H\udcff"}, {"request_id": "H/3\udcff"}):
        with pytest.raises(UsageError, match="lone surrogate"):
            team.store.respond("r", "fine", **bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="lone surrogate"):
        team.store.respond("r\udcff", "fine")
    assert team.store.pending_requests("r") == [request]


async def test_runs_respond_with_an_answer_that_is_not_utf8_exits_2_with_one_line(store_url: str) -> None:
    team = _team(store_url, "wait")
    await team.run(task="go")
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphflow_durable.cli.runs",
            "runs",
            "respond",
            "r",
            b"\xff\xfe",
            "--store",
            store_url,
        ],
        capture_output=True,
        env=env,
        timeout=60,
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr
    assert "not UTF-8" in stderr and "0xff" in stderr, stderr
    assert team.store.pending_requests("r")[0].status == "pending"

    submitted = subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "submit", "s", b"go \xe9", "--store", store_url],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert submitted.returncode == EXIT_USAGE and b"TASK is not UTF-8 text: byte 0xe9" in submitted.stderr
    assert team.store.queue.get_submission("s") is None


async def test_an_answer_with_nul_round_trips_through_respond_to_the_resumed_run(store_url: str) -> None:
    team = _team(store_url, "wait")
    await team.run(task="go")
    done = team.store.respond("r", NUL_ANSWER)
    assert done.answer == NUL_ANSWER
    assert team.store.requests.get("r", done.request_id).answer == NUL_ANSWER  # type: ignore[union-attr]
    await _team(store_url, "wait").run()
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    assert _h_said(team) == [NUL_ANSWER]


async def test_an_inline_input_function_returning_nul_is_recorded_and_used(store_url: str) -> None:
    team = _team(store_url, "inline", NUL_ANSWER)
    await team.run(task="go")
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    assert _h_said(team) == [NUL_ANSWER]
    request = team.store.requests.get("r", "H/3")
    assert request is not None and (request.answer, request.answered_by) == (NUL_ANSWER, "inline")


async def test_an_inline_input_function_returning_a_lone_surrogate_fails_the_turn_clearly(
    store_url: str,
) -> None:
    team = _team(store_url, "inline", "a\udcffb")
    with pytest.raises(Exception, match="lone surrogate"):
        await team.run(task="go")
    assert team.store.requests.get("r", "H/3") is None


def test_request_texts_stored_by_version_8_read_back_unchanged_after_the_upgrade(store_url: str) -> None:
    engines = open_engines(store_url)
    try:
        _migrations.migrate(engines.write, url=engines.url, migrations=_migrations.MIGRATIONS[:8])
    finally:
        engines.engine.dispose()
    engine = sa.create_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO graphflow_runs (run_id, graph_fingerprint, graph, status, head_seq, "
                    "message_count, fencing_token, created_at, updated_at) "
                    "VALUES ('old', 'f', '{}', 'interrupted', 0, 0, 1, 0, 0)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO graphflow_input_requests (run_id, request_id, node, prompt, "
                    "idempotency_key, status, answer, answered_by, created_at, default_answer) "
                    "VALUES ('old', 'H/3', 'H', :p, 'k', 'answered', :a, 'respond', 0, :d)"
                ),
                {"p": 'Say "42":', "a": "42", "d": None},
            )
    finally:
        engine.dispose()
    with Store(store_url) as store:
        request = store.requests.get("old", "H/3")
    assert request is not None and (request.prompt, request.answer, request.default) == (
        'Say "42":',
        "42",
        None,
    )
