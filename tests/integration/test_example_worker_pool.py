"""examples/worker_pool.py runs as documented: a SIGKILLed worker's runs finish in the other one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "worker_pool.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_the_worker_pool_example_finishes_every_run_after_a_worker_is_killed() -> None:
    out = run_example()
    assert "SIGKILLed worker pid" in out
    assert out.count(": finished; recorded {'plan': 1, 'research': 1, 'critique': 1, 'write': 1}") == 5
    assert out.rstrip().endswith("every run finished, every node recorded once")


@pytest.mark.slow
@pytest.mark.postgres
def test_the_worker_pool_example_runs_against_postgresql(postgres_database: str) -> None:
    out = run_example("--store", postgres_database, "--runs", "3")
    assert out.rstrip().endswith("every run finished, every node recorded once")
