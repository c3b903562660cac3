"""What identifies a task, so that re-running a script with the same task is recognised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autogen_agentchat.messages import BaseChatMessage, TextMessage

from graphflow_durable._model.history import task_key_of

__all__ = ["task_key", "task_messages"]


def task_key(task: Sequence[BaseChatMessage]) -> list[dict[str, Any]]:
    """What identifies a task: its messages without their ids and timestamps."""
    return task_key_of([m.dump() for m in task])


def task_messages(
    task: str | BaseChatMessage | Sequence[BaseChatMessage] | None,
) -> list[BaseChatMessage] | None:
    """Normalise a task as GraphFlow does (same errors)."""
    if task is None:
        return None
    if isinstance(task, str):
        return [TextMessage(content=task, source="user")]
    if isinstance(task, BaseChatMessage):
        return [task]
    if isinstance(task, list):
        if not task:
            raise ValueError("Task list cannot be empty.")
        if not all(isinstance(m, BaseChatMessage) for m in task):
            raise ValueError("All messages in task list must be valid BaseChatMessage types")
        return list(task)
    raise ValueError("Task must be a string, a BaseChatMessage, or a list of BaseChatMessage.")
