"""The crash-loop pool test team: A -> K -> B, where K kills its worker process (SIGKILL) on every
turn of a run whose id starts with ``poison``. Workers load it as ``poisonteam:team``; every turn of
K is appended to ``$GFD_EXEC_LOG`` as ``pid run_id`` before it acts. ``poisonteam:crowded`` is the
same team where the poison's K dies 0.3 s into its turn and every other run's K takes 1.5 s: the
healthy runs a worker drives beside the poison have their K in flight when it dies."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable.context import current_execution
from graphflow_durable.flow import DurableGraphFlow

# Worker processes import this module by ``poisonteam:team`` with only tests/pool on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain, die, log_turn  # tests/agents.py: the one set of test agents


async def poison(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    execution = current_execution()
    run_id = execution.run_id if execution is not None else "-"
    log_turn(run_id)
    if run_id.startswith("poison"):
        die()


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> K -> B; at most 3 deaths per turn."""
    a, k, b = Scripted("A"), Scripted("K", before=poison), Scripted("B")
    return DurableGraphFlow([a, k, b], chain(a, k, b), run_id=run_id, max_crash_attempts=3, **durable)


async def crowded_poison(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    execution = current_execution()
    run_id = execution.run_id if execution is not None else "-"
    log_turn(run_id)
    await asyncio.sleep(0.3 if run_id.startswith("poison") else 1.5)
    if run_id.startswith("poison"):
        die()


def crowded(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> K -> B, K slow; at most 3 deaths per turn."""
    a, k, b = Scripted("A"), Scripted("K", before=crowded_poison), Scripted("B")
    return DurableGraphFlow([a, k, b], chain(a, k, b), run_id=run_id, max_crash_attempts=3, **durable)
