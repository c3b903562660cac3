"""The manager's link to its run, and what identifies a task.

The flow owns a :class:`Journal` and hands it to the manager and to every participant container:
it carries the one write path into the store and what the flow tells the manager (halted, a
fatal error, execution contexts, deferred input). No AutoGen internals here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from autogen_agentchat.base import ChatAgent, Team
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable import context as _context
from graphflow_durable.scheduler import GraphSpec
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunUpdate, Step, Store

__all__ = ["Journal", "outer_run_store", "task_key"]

_outer_store: ContextVar[Store | None] = ContextVar("graphflow_durable_outer_store", default=None)


@dataclass
class Journal:
    """The manager's link to its run: where commits go, and what the flow tells the manager.

    ``write`` is the flow's single crossing into the store (it returns the new head and keeps
    ``head`` up to date); the manager calls nothing else.
    """

    run_id: str
    spec: GraphSpec
    participants: Mapping[str, ChatAgent | Team]
    write: Callable[[Step, Sequence[MessageRecord], Sequence[AgentStateRecord], RunUpdate | None], int]
    head: int = 0
    fingerprint: str | None = None
    halted: bool = False
    fatal: BaseException | None = None
    contexts: dict[str, _context.ExecutionContext] = field(default_factory=dict)
    deferred: dict[str, list[BaseChatMessage]] = field(default_factory=dict)
    stop_reason: str | None = None
    store: Callable[[], Store] | None = None

    @contextmanager
    def agent_turn(self, name: str) -> Iterator[None]:
        """While ``name``'s turn runs: its execution context, and this run's store for nested teams."""
        context = _context._current.set(self.contexts.get(name))
        store = _outer_store.set(self.store() if self.store is not None else None)
        try:
            yield
        finally:
            _outer_store.reset(store)
            _context._current.reset(context)


def outer_run_store() -> Store | None:
    """The store of the durable run whose agent turn is running in this task, if any."""
    return _outer_store.get()


def task_key(task: Sequence[BaseChatMessage]) -> list[dict[str, Any]]:
    """What identifies a task: its messages without their ids and timestamps."""
    volatile = {"id", "created_at"}
    return [{k: v for k, v in m.dump().items() if k not in volatile} for m in task]
