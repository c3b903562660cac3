"""The crash matrix: SIGKILL a real worker process at every commit boundary and during every agent
turn, resume in a fresh process, and check the run ends exactly as an uninterrupted one.

The graph (tests/crash/worker.py) has a fan-out, a join, a conditional loop and an "any" group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.store import Store
from processes import run_script

WORKER = Path(__file__).with_name("worker.py")
RUN = "crash-run"

pytestmark = [pytest.mark.crash]


def run_worker(url: str, exec_log: Path, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, RUN, *([kill] if kill else []), exec_log=exec_log)


def completions(url: str) -> Counter[str]:
    """Committed completions per node."""
    with Store(url) as store:
        return Counter(s.node for s in store.load(RUN).steps if s.kind == "complete" and s.node)


def executions(exec_log: Path, pid: int | None = None) -> list[tuple[str, int]]:
    if not exec_log.exists():
        return []
    rows = [line.split() for line in exec_log.read_text().splitlines()]
    return [(node, int(turn)) for p, node, turn, *_ in rows if pid is None or int(p) == pid]


def committed_turns(url: str) -> set[tuple[str, int]]:
    """(node, turn) of every committed completion, read from the transcript."""
    with Store(url) as store:
        log = store.load(RUN)
    turns = set()
    for m in log.messages:
        content = m.body.get("content")
        if isinstance(content, str) and "#" in content:
            node, _, rest = content.partition("#")
            turns.add((node, int(rest.split()[0])))
    return turns


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run: its transcript, its commit count and its agent-turn count."""
    tmp = tmp_path_factory.mktemp("reference")
    url = f"sqlite:///{tmp / 'ref.db'}"
    exec_log = tmp / "exec.log"
    done = run_worker(url, exec_log)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    with Store(url) as store:
        steps = store.load(RUN).steps
    commits = sum(1 for s in steps if s.kind != "created")
    return {
        "transcript": out["transcript"],
        "stop_reason": out["stop_reason"],
        "completions": completions(url),
        "commits": commits,  # the "created" snapshot is written with the run: see "create:" kills
        "turns": len(executions(exec_log)),
    }


def kill_points(reference: dict[str, Any]) -> list[str]:
    points = [
        f"commit:{k}:{phase}"
        for k in range(1, reference["commits"] + 1)
        for phase in ("before", "inside", "after")
    ]
    points += ["create:before", "create:after"]
    points += [f"agent:{j}" for j in range(1, reference["turns"] + 1)]
    return points


def crash_and_resume(url: str, tmp: Path, kill: str, reference: dict[str, Any]) -> None:
    exec_log = tmp / "exec.log"
    first = run_worker(url, exec_log, kill)
    assert first.returncode == -signal.SIGKILL, (
        f"{kill}: expected SIGKILL, got {first.returncode}\n{first.stderr}"
    )
    before = committed_turns(url) if _run_exists(url) else set()
    executed_before = len(executions(exec_log))
    resumed = run_worker(url, exec_log)
    assert resumed.returncode == 0, f"{kill}: resume failed\n{resumed.stderr}"
    out = json.loads(resumed.stdout)
    assert out["transcript"] == reference["transcript"], f"{kill}: transcript differs"
    assert out["stop_reason"] == reference["stop_reason"]
    assert completions(url) == reference["completions"], f"{kill}: a node was recorded twice or not at all"
    rerun = set(executions(exec_log)[executed_before:])
    assert not (rerun & before), f"{kill}: committed turns ran again: {sorted(rerun & before)}"


def _run_exists(url: str) -> bool:
    with Store(url) as store:
        return store.get_run(RUN) is not None


def crash_twice_and_resume(url: str, tmp: Path, kills: tuple[str, str], reference: dict[str, Any]) -> None:
    """Two processes killed in a row (the second one while resuming the first), then a third resumes."""
    exec_log = tmp / "exec.log"
    for kill in kills:
        done = run_worker(url, exec_log, kill)
        assert done.returncode == -signal.SIGKILL, (
            f"{kills}: {kill} did not fire ({done.returncode})\n{done.stderr}"
        )
    resumed = run_worker(url, exec_log)
    assert resumed.returncode == 0, f"{kills}: resume failed\n{resumed.stderr}"
    out = json.loads(resumed.stdout)
    assert out["transcript"] == reference["transcript"], f"{kills}: transcript differs"
    assert completions(url) == reference["completions"], f"{kills}: a node was recorded twice or not at all"


# A first kill while one fan-out sibling has answered and the other is in flight (or at any early
# commit), a second kill after the fan-out came round again: the second resume rebuilds every
# buffer from a log that already holds one resume.
DOUBLE_KILLS = [
    (first, second)
    for first in [f"commit:{k}:after" for k in range(2, 7)] + [f"agent:{j}" for j in range(2, 6)]
    for second in ("commit:3:after", "commit:5:after", "agent:3")
]


@pytest.mark.slow
def test_two_sigkills_in_a_row_resume_to_the_uninterrupted_transcript_sqlite(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    for i, kills in enumerate(DOUBLE_KILLS):
        case = tmp_path / f"double{i}"
        case.mkdir()
        crash_twice_and_resume(f"sqlite:///{case / 'run.db'}", case, kills, reference)


def test_uninterrupted_durable_run_matches_plain_graphflow(reference: dict[str, Any]) -> None:
    import asyncio

    sys.path.insert(0, str(WORKER.parent))
    import worker

    team = worker.crash_team("sqlite://", "unused")
    from autogen_agentchat.teams import GraphFlow

    plain = GraphFlow(
        list(team._input_participants),
        team._graph,
        termination_condition=team._input_termination_condition,
    )
    result = asyncio.run(plain.run(task="build the report"))
    transcript = [[m.source, getattr(m, "content", None)] for m in result.messages]
    assert transcript == reference["transcript"]
    assert result.stop_reason == reference["stop_reason"]


def _matrix(
    url_factory: Callable[[Path], str], tmp_path: Path, reference: dict[str, Any], points: list[str]
) -> None:
    for i, kill in enumerate(points):
        tmp = tmp_path / f"case{i}"
        tmp.mkdir()
        crash_and_resume(url_factory(tmp), tmp, kill, reference)


@pytest.mark.slow
def test_sigkill_at_every_commit_boundary_and_agent_turn_resumes_to_the_uninterrupted_transcript_sqlite(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    points = kill_points(reference)
    assert len(points) >= 40
    _matrix(lambda d: f"sqlite:///{d / 'run.db'}", tmp_path, reference, points)


@pytest.mark.slow
@pytest.mark.postgres
def test_sigkill_at_commit_boundaries_resumes_to_the_uninterrupted_transcript_postgres(
    tmp_path: Path, reference: dict[str, Any], postgres_url: str, postgres_admin: Any
) -> None:
    import sqlalchemy as sa

    points = kill_points(reference)[::3] + [p for p in kill_points(reference) if p.endswith(":inside")][::2]
    names = iter(range(10_000))

    def fresh(_: Path) -> str:
        name = f"graphflow_crash_{os.getpid()}_{next(names)}"
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        return sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)

    _matrix(fresh, tmp_path, reference, sorted(set(points)))
