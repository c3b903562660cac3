"""pytest plugin (``-p _swap_plugin``) that runs upstream tests on :class:`DurableGraphFlow`.

At configure time, before any test module is imported:

- ``autogen_agentchat.teams.GraphFlow`` becomes ``DurableGraphFlow`` itself (not a subclass:
  ``GraphFlow.load_component`` checks the loaded type against the class it is called on);
- ``graphflow_durable.flow.default_store_url`` (what a team without ``store=`` opens) returns a
  new SQLite file under a temporary directory for each test: the teams of one test share it, as
  the teams of one process share ``./.graphflow_durable/runs.db`` when nothing is configured (so a
  team rebuilt by ``load_component`` meets its original's run id), and no test sees another's runs;
- ``DurableGraphFlow.__init__`` counts the instances built, and the counts are written as JSON to
  ``$GRAPHFLOW_UPSTREAM_SWAP_REPORT`` at the end, so the caller can check the swap took effect.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import autogen_agentchat.teams as teams
import pytest

import graphflow_durable
import graphflow_durable.flow as flow_module

REPORT_ENV = "GRAPHFLOW_UPSTREAM_SWAP_REPORT"

_counts = {"durable_instances": 0, "store_url_calls": 0, "store_files": 0}
_saved: dict[str, Any] = {}
_current: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A new store file for each test, before its fixtures build any team."""
    _current.pop("url", None)


def pytest_configure(config: pytest.Config) -> None:
    durable = graphflow_durable.DurableGraphFlow
    tmp = Path(tempfile.mkdtemp(prefix="gfd-upstream-"))
    numbers = itertools.count()

    def test_store_url() -> str:
        _counts["store_url_calls"] += 1
        if "url" not in _current:
            _counts["store_files"] += 1
            _current["url"] = f"sqlite:///{tmp / f'test-{next(numbers)}.db'}"
        return _current["url"]

    original_init = durable.__init__

    @functools.wraps(original_init)
    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _counts["durable_instances"] += 1
        original_init(self, *args, **kwargs)

    _saved.update(
        graphflow=teams.GraphFlow, store_url=flow_module.default_store_url, init=original_init, tmp=tmp
    )
    teams.GraphFlow = durable  # type: ignore[misc]
    flow_module.default_store_url = test_store_url
    durable.__init__ = counting_init  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _saved:
        return
    teams.GraphFlow = _saved["graphflow"]  # type: ignore[misc]
    flow_module.default_store_url = _saved["store_url"]
    graphflow_durable.DurableGraphFlow.__init__ = _saved["init"]  # type: ignore[method-assign]
    shutil.rmtree(_saved["tmp"], ignore_errors=True)
    report = os.environ.get(REPORT_ENV)
    if report:
        Path(report).write_text(json.dumps(_counts), encoding="utf-8")
