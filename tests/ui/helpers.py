"""Runs for the console's tests: finished, waiting for a person, failed on a node's budget."""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

import pytest

from agents import Scripted, chain, durable
from graphflow_durable.errors import NodeFailedError
from graphflow_durable.retry import RetryPolicy
from graphflow_durable.store import Store
from graphflow_durable.ui import create_app

ONCE = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)
if TYPE_CHECKING:
    from starlette.testclient import TestClient

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def client(store: Store, **kwargs: object) -> TestClient:
    """An in-process client of the console (Starlette's TestClient over httpx, which Starlette 1.x
    marks deprecated in favour of httpx2: not installed here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # StarletteDeprecationWarning: httpx2 is not installed
        from starlette.testclient import TestClient

        return TestClient(create_app(store, **kwargs), follow_redirects=False)  # type: ignore[arg-type]


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no csrf field on the page"
    return found.group(1)


async def finished_run(url: str, run_id: str, task: str = "go") -> None:
    agents = [Scripted("A"), Scripted("B")]
    await durable(agents, chain(*agents), url, run_id).run(task=task)


async def waiting_run(url: str, run_id: str) -> None:
    from autogen_agentchat.agents import UserProxyAgent
    from autogen_agentchat.teams import DiGraphBuilder

    from graphflow_durable import DurableGraphFlow

    a, h = Scripted("A"), UserProxyAgent("H", input_func=lambda prompt: "typed")
    graph = DiGraphBuilder().add_node(a).add_node(h).add_edge(a, h).build()
    team = DurableGraphFlow([a, h], graph, store=url, run_id=run_id, human_input="wait")
    await team.run(task="approve the refund?")
    if team._session.opened_store is not None:
        team._session.opened_store.close()


async def failed_run(url: str, run_id: str) -> None:
    """A run failed on node B's spent budget (supply can answer for B)."""

    async def always(agent: Scripted, messages: object) -> None:
        raise ConnectionError("B is down")

    agents = [Scripted("A"), Scripted("B", before=always), Scripted("C")]
    team = durable(agents, chain(*agents), url, run_id, retry=ONCE)
    with pytest.raises(NodeFailedError):
        await team.run(task="go")
