"""The exceptions a workbench's tools raise, seen before the workbench makes error results of them.

A ``StaticWorkbench`` (what ``AssistantAgent(tools=[...])`` builds) catches a tool's exception and
returns its text as an error ``ToolResult``, through its ``_format_errors(error)``: :func:`watch`
wraps that method of one workbench instance so that it also notes the exception for the tool call
running in the task, while a :class:`Noting` of that call is entered. A recorded workbench uses it
to let a node's retry policy take a tool's exception (see ``graphflow_durable.recorded``). Another
workbench that makes error results of exceptions its own way is not seen.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

from typing_extensions import Self

__all__ = ["Noting", "watch"]

_seen: ContextVar[list[Exception] | None] = ContextVar("graphflow_durable_tool_errors", default=None)


def watch(workbench: object) -> None:
    """Note the exceptions ``workbench``'s tools raise (an instance with a ``_format_errors``; once)."""
    format_errors = getattr(workbench, "_format_errors", None)
    if not callable(format_errors) or getattr(format_errors, "graphflow_durable_noting", False):
        return

    def noting(error: Exception) -> Any:
        seen = _seen.get()
        if seen is not None:
            seen.append(error)
        return format_errors(error)

    noting.graphflow_durable_noting = True  # type: ignore[attr-defined]
    workbench._format_errors = noting  # type: ignore[attr-defined]


class Noting:
    """One tool call's exceptions (``errors``), noted while it is entered (re-entered around each
    step of a stream, so that nothing of its consumer is noted); ``off``: nothing is noted."""

    def __init__(self, off: bool) -> None:
        self.errors: list[Exception] | None = None if off else []
        self._token: Token[list[Exception] | None] | None = None

    def __enter__(self) -> Self:
        if self.errors is not None:
            self._token = _seen.set(self.errors)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _seen.reset(self._token)
            self._token = None
