"""SIGKILL inside the store's group writer while it commits several runs at once.

Four runs of the crash graph share one store in one process, so the writer thread commits them in
groups. The process is killed at a group holding at least two runs' commits: before its
transaction, inside it (before COMMIT) and after it committed (before any caller learned it). A
fresh process resumes every run: each ends with the uninterrupted transcript, each completion is
recorded once, and no turn whose completion was committed runs again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from graphflow_durable.store import Store
from processes import run_script

WORKER = Path(__file__).with_name("group_worker.py")
RUNS = 4

pytestmark = [pytest.mark.crash, pytest.mark.slow]


def run_group(url: str, exec_log: Path, kill: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, str(RUNS), *([kill] if kill else []), exec_log=exec_log, timeout=180)


def recorded(url: str) -> dict[str, tuple[int, Counter[str], set[tuple[str, str]]]]:
    """Per run: its head, its completions per node, and the (source, content) of its messages."""
    out = {}
    with Store(url) as store:
        for run in store.list_runs():
            log = store.load(run.run_id)
            nodes = Counter(s.node for s in log.steps if s.kind == "complete" and s.node)
            said = {(m.body["source"], str(m.body.get("content"))) for m in log.messages}
            out[run.run_id] = (run.head_seq, nodes, said)
    return out


def executed(exec_log: Path) -> list[tuple[str, str, str]]:
    """(run, node, turn) of every agent turn that started, in order."""
    if not exec_log.exists():
        return []
    rows = (line.split() for line in exec_log.read_text().splitlines())
    return [(run_id, node, turn) for _, node, turn, run_id in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("group-reference")
    done = run_group(f"sqlite:///{tmp / 'ref.db'}", tmp / "exec.log")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    transcripts = out["transcripts"]
    assert len({json.dumps(t) for t in transcripts.values()}) == 1  # the runs are alike
    assert out["largest_group"] >= 2, "the runs were never committed together: nothing to test"
    return {"transcripts": transcripts, "completions": recorded(f"sqlite:///{tmp / 'ref.db'}")}


def crash_and_resume(url: str, tmp: Path, kill: str, reference: dict[str, Any]) -> None:
    exec_log = tmp / "exec.log"
    first = run_group(url, exec_log, kill)
    assert first.returncode == -signal.SIGKILL, (
        f"{kill}: expected SIGKILL, got {first.returncode}\n{first.stderr}"
    )
    before = recorded(url)
    started = len(executed(exec_log))
    resumed = run_group(url, exec_log)
    assert resumed.returncode == 0, f"{kill}: resume failed\n{resumed.stderr}"
    assert json.loads(resumed.stdout)["transcripts"] == reference["transcripts"], (
        f"{kill}: a transcript differs"
    )
    after = recorded(url)
    for run_id, (_, nodes, _) in reference["completions"].items():
        assert after[run_id][1] == nodes, f"{kill}: {run_id}: a node was recorded twice or not at all"
    # A turn whose completion was committed before the kill never runs again (turns are named
    # "NODE#TURN" in their message, and logged as "NODE TURN" when they start).
    committed = {
        (run_id, content.partition("#")[0], content.partition("#")[2].split()[0])
        for run_id, (_, _, said) in before.items()
        for _, content in said
        if "#" in content
    }
    again = set(executed(exec_log)[started:]) & committed
    assert not again, f"{kill}: committed turns ran again: {sorted(again)}"


POINTS = [f"group:{k}:{phase}" for k in (1, 3, 6) for phase in ("before", "inside", "after")]


def test_sigkill_in_the_group_writer_resumes_every_run_exactly_sqlite(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    for i, kill in enumerate(POINTS):
        case = tmp_path / f"case{i}"
        case.mkdir()
        crash_and_resume(f"sqlite:///{case / 'run.db'}", case, kill, reference)


@pytest.mark.postgres
def test_sigkill_in_the_group_writer_resumes_every_run_exactly_postgres(
    tmp_path: Path, reference: dict[str, Any], postgres_admin: sa.Engine, postgres_url: str
) -> None:
    for i, kill in enumerate(POINTS[3:6]):
        name = f"graphflow_group_crash_{os.getpid()}_{i}"
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        case = tmp_path / f"case{i}"
        case.mkdir()
        crash_and_resume(url, case, kill, reference)
