"""The benchmark harness runs end to end in quick mode (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_quick_benchmark_writes_results(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        env={**os.environ, "GRAPHFLOW_BENCH_POSTGRES_URL": ""},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").read_text().startswith("Machine:")
    assert result["mode"] == "quick"

    rows = result["results"]
    shapes = {r["shape"] for r in rows}
    assert shapes == {"loop", "chain", "fanout"}
    for shape in shapes:
        configs = {r["config"] for r in rows if r["shape"] == shape and r["agent"] == "text"}
        assert {"plain", "sqlite-full", "sqlite-normal", "raw-full", "raw-normal"} <= configs
    for r in rows:
        assert r["per_transition_ms"] > 0, r
        if r["config"].startswith("sqlite-"):
            assert r["transitions"] > 0
            assert r["ratio_to_plain"] > 0
            assert r["db_bytes"] >= 0
            assert r["peak_mb"] > 0
    # Durable and plain do the same work: same number of transitions.
    for r in rows:
        if r["config"] == "sqlite-full":
            plain = next(
                p
                for p in rows
                if p["config"] == "plain"
                and (p["shape"], p["n"], p["agent"]) == (r["shape"], r["n"], r["agent"])
            )
            assert plain["transitions"] == r["transitions"], (r, plain)

    assert result["resume"], "cold-resume rows missing"
    for r in result["resume"]:
        assert r["durable_ms"] > 0
        assert r["plain_ms"] > 0
