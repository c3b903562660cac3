"""pytest plugin (``-p _swap_plugin``) that runs upstream tests on :class:`DurableGraphFlow`.

At configure time, before any test module is imported:

- ``autogen_agentchat.teams.GraphFlow`` becomes ``DurableGraphFlow`` itself (not a subclass:
  ``GraphFlow.load_component`` checks the loaded type against the class it is called on);
- ``$GRAPHFLOW_DURABLE_STORE`` (the public way to choose the store of a team without ``store=``)
  names a new SQLite file under a temporary directory for each test: the teams of one test share
  it, as the teams of one process share ``./.graphflow_durable/runs.db`` when nothing is
  configured (so a team rebuilt by ``load_component`` meets its original's run id), and no test
  sees another's runs; the store files the teams really created are counted;
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
from graphflow_durable.flow import DEFAULT_STORE_ENV

REPORT_ENV = "GRAPHFLOW_UPSTREAM_SWAP_REPORT"

_counts = {"durable_instances": 0, "store_files": 0}
_saved: dict[str, Any] = {}
_numbers = itertools.count()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A new store file for each test, before its fixtures build any team."""
    os.environ[DEFAULT_STORE_ENV] = f"sqlite:///{_saved['tmp'] / f'test-{next(_numbers)}.db'}"


def pytest_configure(config: pytest.Config) -> None:
    durable = graphflow_durable.DurableGraphFlow
    tmp = Path(tempfile.mkdtemp(prefix="gfd-upstream-"))
    original_init = durable.__init__

    @functools.wraps(original_init)
    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _counts["durable_instances"] += 1
        original_init(self, *args, **kwargs)

    _saved.update(
        graphflow=teams.GraphFlow, init=original_init, tmp=tmp, env=os.environ.get(DEFAULT_STORE_ENV)
    )
    teams.GraphFlow = durable  # type: ignore[misc]
    durable.__init__ = counting_init  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _saved:
        return
    teams.GraphFlow = _saved["graphflow"]  # type: ignore[misc]
    if _saved["env"] is None:
        os.environ.pop(DEFAULT_STORE_ENV, None)
    else:
        os.environ[DEFAULT_STORE_ENV] = _saved["env"]
    _counts["store_files"] = len(list(_saved["tmp"].glob("test-*.db")))
    graphflow_durable.DurableGraphFlow.__init__ = _saved["init"]  # type: ignore[method-assign]
    shutil.rmtree(_saved["tmp"], ignore_errors=True)
    report = os.environ.get(REPORT_ENV)
    if report:
        Path(report).write_text(json.dumps(_counts), encoding="utf-8")
