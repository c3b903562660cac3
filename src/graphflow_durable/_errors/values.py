"""Values and saved states that cannot be used: not JSON, a saved state of the wrong shape, a thread the
graph cannot explain, a corruption repair cannot fix."""

from __future__ import annotations

from graphflow_durable._errors.base import GraphflowDurableError

__all__ = ["NotSerializableError", "ReplayError", "StateFormatError", "UnrepairableStateError"]


class NotSerializableError(GraphflowDurableError, TypeError, ValueError):
    """A value that must be stored is not JSON-serialisable (not a JSON type, a NaN, a lone surrogate
    UTF-8 cannot encode, nested too deep); the message names the node and where in the value it is.
    Raised before anything of the commit is written.

    Attributes:
        where: the JSON Pointer-like path of the first bad value (``agent_states/A/x/3``), or the
            configuration item (``edge 'A' -> 'B'``).
        type_name: the type of the bad value, when known.
        node: the node whose message or agent state it is, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        type_name: str | None = None,
        node: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.where = where
        self.type_name = type_name
        self.node = node


class StateFormatError(GraphflowDurableError, ValueError):
    """A saved team state (or a stored scheduler state) has the wrong shape or an unknown format version.

    Attributes:
        run_id: the run, when the state belongs to one.
        code: the repair finding code (``GFD001-not-a-team-state``...), when there is one.
        pointer: where in the state (a JSON Pointer), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        code: str | None = None,
        pointer: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.run_id = run_id
        self.code = code
        self.pointer = pointer


class ReplayError(GraphflowDurableError, ValueError):
    """A message thread cannot be explained by the graph (names the first message that does not fit).

    Attributes:
        index: the position of that message in the thread.
        node: the message's source, the node that was not allowed to speak then.
    """

    def __init__(self, message: str, *, index: int | None = None, node: str | None = None) -> None:
        GraphflowDurableError.__init__(self, message)
        self.index = index
        self.node = node


class UnrepairableStateError(GraphflowDurableError, ValueError):
    """A saved state is corrupt in a way repair cannot fix without inventing progress.

    Attributes:
        code: the repair finding code (``GFD101-participant-missing``...).
        pointer: where in the state (a JSON Pointer).
        node: the node concerned, if one is.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        pointer: str | None = None,
        node: str | None = None,
    ) -> None:
        GraphflowDurableError.__init__(self, message)
        self.code = code
        self.pointer = pointer
        self.node = node
