"""What a running agent can know about its own execution: run, node, step, attempt, tool call.

An agent that was in flight when its process died runs again on resume (at-least-once
execution). Code with side effects -- sending an email, charging a card -- can use
:attr:`ExecutionContext.idempotency_key` to do them once::

    from graphflow_durable import current_execution

    ctx = current_execution()
    if ctx is not None and not already_sent(ctx.idempotency_key):
        send_email(...)

A tool called through a recorded workbench (``record_calls=True`` or ``recorded(workbench)``) can
also read its own call, :func:`current_tool_call`, whose :attr:`ToolCallContext.idempotency_key`
is equal on every attempt that makes the same call (same call id, name and arguments)::

    from graphflow_durable import current_tool_call

    call = current_tool_call()
    if call is not None and not already_charged(call.idempotency_key):
        charge_card(...)
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["ExecutionContext", "ToolCallContext", "current_execution", "current_tool_call"]


@dataclass(frozen=True)
class ExecutionContext:
    """The identity of one agent turn inside a durable run.

    Attributes:
        run_id: the run's id.
        node: the graph node (participant name) that is speaking.
        step: the head sequence number of the commit that dispatched this turn. It is the same on
            every attempt of the same turn.
        attempt: 1 for the first attempt, 2 after one resume, and so on.
        origin_key: the idempotency key this turn had when it began in another run, for a state
            moved with ``save_state()``/``load_state()`` while the node was in flight; else ``None``.
    """

    run_id: str
    node: str
    step: int
    attempt: int
    origin_key: str | None = None

    @property
    def idempotency_key(self) -> str:
        """``run_id/node/step``: equal on every attempt of one turn, different between turns.

        A turn moved to another run by ``save_state()``/``load_state()`` keeps the key it began with
        (:attr:`origin_key`), so its side effects (and a nested durable team) are recognised again.
        """
        return self.origin_key or f"{self.run_id}/{self.node}/{self.step}"


_current: ContextVar[ExecutionContext | None] = ContextVar("graphflow_durable_execution", default=None)


def current_execution() -> ExecutionContext | None:
    """The execution context of the agent turn running in this task, or ``None`` outside one."""
    return _current.get()


@dataclass(frozen=True)
class ToolCallContext:
    """The tool call running in this task, made through a recorded workbench in a durable turn.

    Attributes:
        execution: the turn's :class:`ExecutionContext` (run id, node, step, attempt).
        name: the tool's name.
        call_id: the call id the model gave the call (possibly shared by several calls: some
            servers send ``""`` for every call).
        idempotency_key: ``<turn's idempotency key>/<call id>/<request digest>``: equal on every
            attempt that makes this call (same call id, name and arguments, and, for calls that
            share all three, the same position among them), different between the calls of one
            turn. Key a side effect on it to do it once even when the tool runs again (it was in
            flight when its process died, or its record was discarded).
    """

    execution: ExecutionContext
    name: str
    call_id: str
    idempotency_key: str


_tool_call: ContextVar[ToolCallContext | None] = ContextVar("graphflow_durable_tool_call", default=None)


def current_tool_call() -> ToolCallContext | None:
    """The tool call running in this task (inside a recorded workbench's call), or ``None``."""
    return _tool_call.get()
