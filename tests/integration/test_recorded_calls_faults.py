"""A tool call's record that cannot be written (a lost lease, a database error) ends the turn; it
never leaves the agent waiting forever.

``AssistantAgent`` runs its tool calls in a task that signals their end on a queue; a workbench call
that raises never signals it, and the agent waits forever. A recorded workbench must therefore not
raise from a tool call: the failure is kept, and the turn's next recorded call (here its next model
call) raises it, before calling out.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import DiGraphBuilder

from agents import OPEN_TEAMS, close_stores
from graphflow_durable import DurableGraphFlow
from graphflow_durable.errors import LeaseLostError, StoreError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from scripted_model import CLERK_SCRIPT, ScriptedModel, ledger_tools


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _team(url: str, log: Path, run_id: str) -> DurableGraphFlow:
    clerk = AssistantAgent(
        "clerk",
        model_client=ScriptedModel("clerk", CLERK_SCRIPT, log=log),
        tools=ledger_tools(log),
        max_tool_iterations=3,
    )
    graph = DiGraphBuilder().add_node(clerk).build()
    team = DurableGraphFlow([clerk], graph, store=url, run_id=run_id, record_calls=True)
    OPEN_TEAMS.append(team)
    return team


def _fail_tool_records(team: DurableGraphFlow, error: Exception) -> None:
    """Every tool call's record raises ``error`` (model calls are recorded as usual)."""
    calls = team.store.calls
    record = calls.record

    def failing(rec: Any, *, fencing_token: int | None) -> Any:
        if rec.kind == "tool":
            raise error
        return record(rec, fencing_token=fencing_token)

    calls.record = failing  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "error",
    [
        LeaseLostError("run r: lease lost (test)", run_id="r", token=1),
        StoreError("database unreachable (test)"),
    ],
    ids=["lease-lost", "store-error"],
)
async def test_a_tool_record_that_cannot_be_written_ends_the_turn_before_its_next_model_call(
    store_url: str, tmp_path: Path, error: Exception
) -> None:
    log = tmp_path / "exec.log"
    team = _team(store_url, log, "faulty")
    _fail_tool_records(team, error)
    # Not a hang: the run ends with the error (a lost lease as itself; another as GraphFlow passes
    # an agent's error on, in a RuntimeError's text).
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(team.run(task="Refund order A17."), 30)
    assert raised.value is error or type(error).__name__ in str(raised.value)
    lines = [line.split()[1:] for line in log.read_text().splitlines()]
    # The first tool ran (its record failed); no model call went out after it, no other tool ran.
    assert lines == [["model", "clerk", "0"], ["lookup_order", "A17"]]
