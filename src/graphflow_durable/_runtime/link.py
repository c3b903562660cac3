"""What crosses between the durable manager and the participant containers during a turn.

The manager dispatches a node's turn and records its :class:`~graphflow_durable.ExecutionContext` in
:class:`Turns`; the node's container runs the agent inside :meth:`Turns.running`, which makes that
context (and the run's store, for a nested durable team) visible to the agent's code. No AutoGen
internals here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from graphflow_durable import context as _context
from graphflow_durable.context import ExecutionContext
from graphflow_durable.store import Store

__all__ = ["Turns", "outer_run_store"]

_outer_store: ContextVar[Store | None] = ContextVar("graphflow_durable_outer_store", default=None)


class Turns:
    """The execution contexts of a team's turns in flight: the manager writes, containers read."""

    def __init__(self, store: Callable[[], Store], may_start: Callable[[str], Awaitable[bool]]) -> None:
        self._store = store
        self._may_start = may_start
        self._contexts: dict[str, ExecutionContext] = {}

    async def may_start(self, node: str) -> bool:
        """Whether ``node``'s dispatched turn may start now: the lease is still held (by the
        monotonic clock, else by one renewal); when it is not, the run was halted."""
        return await self._may_start(node)

    def dispatched(self, context: ExecutionContext) -> None:
        """The manager dispatched ``context.node``'s turn."""
        self._contexts[context.node] = context

    def answered(self, node: str) -> None:
        """``node``'s turn is recorded."""
        self._contexts.pop(node, None)

    def clear(self) -> None:
        """No turn is in flight any more (reset, load_state)."""
        self._contexts.clear()

    @contextmanager
    def running(self, node: str) -> Iterator[None]:
        """While ``node``'s agent runs: its execution context, and the run's store for nested teams."""
        context = _context._current.set(self._contexts.get(node))
        store = _outer_store.set(self._store())
        try:
            yield
        finally:
            _outer_store.reset(store)
            _context._current.reset(context)


def outer_run_store() -> Store | None:
    """The store of the durable run whose agent turn is running in this task, if any."""
    return _outer_store.get()
