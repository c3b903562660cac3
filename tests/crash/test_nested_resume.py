"""A nested durable team resumes inside: killed during its second agent, the re-run of the outer
node continues the inner run (same run id, from the execution context's idempotency key) instead
of starting it again."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from graphflow_durable import Store
from processes import run_script

WORKER = Path(__file__).with_name("nested_worker.py")

pytestmark = [pytest.mark.crash]


def run(url: str, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_script(WORKER, url, *extra, exec_log=log)


def transcripts(url: str) -> dict[str, list[tuple[str, str]]]:
    with Store(url) as store:
        return {
            r.run_id.split(":")[0].split("/")[0]: [
                (m.body["source"], str(m.body.get("content"))) for m in store.load(r.run_id).messages
            ]
            for r in store.list_runs()
        }


def turns(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines()]


@pytest.mark.parametrize("config", ["explicit", "inherit"])
def test_a_nested_durable_team_killed_mid_run_resumes_inside_without_rerunning_its_finished_agents(
    tmp_path: Path, config: str
) -> None:
    """``explicit``: the inner team is given the outer store and a run id from the outer turn's
    key; ``inherit``: it is given neither and takes both from the outer turn by itself."""
    ref_url, url = f"sqlite:///{tmp_path / 'ref.db'}", f"sqlite:///{tmp_path / 'run.db'}"
    flags = ("inherit",) if config == "inherit" else ()
    assert run(ref_url, tmp_path / "ref.log", *flags).returncode == 0

    killed = run(url, tmp_path / "run.log", "kill", *flags)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert turns(tmp_path / "run.log") == ["A", "I1", "I2"]
    resumed = run(url, tmp_path / "run.log", *flags)
    assert resumed.returncode == 0, resumed.stderr

    assert transcripts(url) == transcripts(ref_url)
    # I1 answered before the kill and never ran again; I2 was in flight and ran again.
    assert turns(tmp_path / "run.log") == ["A", "I1", "I2", "I2", "I3", "Z"]
