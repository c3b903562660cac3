"""pytest plugin (``-p _outcomes_plugin``): writes each test's outcome as JSON.

The file named by ``$GRAPHFLOW_UPSTREAM_OUTCOMES`` receives ``{"tests": {nodeid: {"outcome": ...,
"reason": ...}}, "collection_errors": [...], "exitstatus": N}``. The outcome is ``passed``,
``failed`` (the test body failed), ``error`` (setup or teardown failed) or ``skipped``; the reason
is the one-line message of the failure (``reprcrash``), empty for a pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

OUTCOMES_ENV = "GRAPHFLOW_UPSTREAM_OUTCOMES"

_tests: dict[str, dict[str, str]] = {}
_collection_errors: list[str] = []


def _one_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _tests.setdefault(report.nodeid, {"outcome": "passed", "reason": ""})
    if report.failed and entry["outcome"] in ("passed", "skipped"):
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["reason"] = _one_line(report)
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["reason"] = _one_line(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _collection_errors.append(f"{report.nodeid}: {_one_line(report)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(OUTCOMES_ENV)
    if path:
        data: dict[str, Any] = {
            "tests": _tests,
            "collection_errors": _collection_errors,
            "exitstatus": int(exitstatus),
        }
        Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
