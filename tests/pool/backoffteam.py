"""The durable back-off pool test team: A -> B -> C, where B's first attempt of every turn raises a
retryable ``ConnectionError`` and its retry policy backs off ``$GFD_BACKOFF`` seconds. Workers load
it as ``backoffteam:team``; every attempt of B is appended to ``$GFD_EXEC_LOG`` as ``pid attempt``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable import DurableGraphFlow, RetryPolicy
from graphflow_durable.context import current_execution

# Worker processes import this module by ``backoffteam:team`` with only tests/pool on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Scripted, chain  # tests/agents.py: the one set of test agents


async def first_attempt_fails(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    execution = current_execution()
    attempt = execution.attempt if execution is not None else 0
    with open(os.environ["GFD_EXEC_LOG"], "a") as f:
        f.write(f"{os.getpid()} {attempt}\n")
    if attempt == 1:
        raise ConnectionError("B: connection reset by peer")


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    """A -> B -> C; B retried after a fixed back-off."""
    agents = [Scripted("A"), Scripted("B", before=first_attempt_fails), Scripted("C")]
    policy = RetryPolicy(max_attempts=3, initial_interval=float(os.environ["GFD_BACKOFF"]), jitter=False)
    return DurableGraphFlow(agents, chain(*agents), run_id=run_id, retry=policy, **durable)
