"""Human input in a durable run: how a node asks (:class:`HumanInput`) and what is stored
(:class:`InputRequest`). Pure values, no I/O. Also :func:`node_settings`, the per-node shape
of a team argument (a value, or ``{node: value, "*": default}``) that ``human_input=`` has and
the retry and timeout policies (``graphflow_durable.retry``) share.

A node's agent asks a person through an input function (``UserProxyAgent(input_func=...)``). Each
call inside one turn is one request, identified within its run by ``"{node}/{step}"`` (the step
that dispatched the turn, as in the turn's idempotency key), with ``"#2"``, ``"#3"``... appended
for the second and later calls of the same turn. The id is equal on every attempt of the turn, so
a turn that runs again finds its answered requests instead of asking again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from graphflow_durable.errors import UsageError

__all__ = [
    "HumanInput",
    "InputMode",
    "InputRequest",
    "RequestStatus",
    "human_input_config",
    "human_inputs",
    "node_settings",
    "parked_on",
    "request_id",
]

InputMode = Literal["inline", "wait"]
"""``inline``: the input function is called and its answer recorded before the turn goes on (a
crash after the person answered never asks again). ``wait``: the request is recorded and the run
parks (status ``waiting``) until someone answers it, from any process."""

RequestStatus = Literal["pending", "answered", "cancelled"]
"""A request's status: ``pending`` (asked, not answered), ``answered``, or ``cancelled`` (the run
was reset while it was pending)."""


@dataclass(frozen=True)
class HumanInput:
    """How a node's input function is handled in a durable run.

    Args:
        mode: ``"wait"`` (park the run until answered; see :meth:`DurableGraphFlow.respond`) or
            ``"inline"`` (call the input function; record its answer).
        timeout: ``wait`` only: seconds after the request after which, if nobody answered, the run
            takes ``default`` as the answer, or fails when ``default`` is ``None``. ``None``: no
            deadline.
        default: the answer taken when ``timeout`` passes.

    Raises:
        UsageError: an unknown mode, or a timeout that is not a positive number.
    """

    mode: InputMode = "wait"
    timeout: float | None = None
    default: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in get_args(InputMode):
            raise UsageError(
                f"human_input mode must be 'wait' or 'inline', not {self.mode!r}", option="human_input"
            )
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            raise UsageError(
                f"human_input timeout must be a number of seconds above 0, not {self.timeout!r}",
                option="human_input",
            )

    def to_json(self) -> dict[str, Any]:
        """The JSON form kept in the component config."""
        return {"mode": self.mode, "timeout": self.timeout, "default": self.default}


_FIELDS = ("mode", "timeout", "default")

T = TypeVar("T")


def node_settings(
    value: Any,
    nodes: Iterable[str],
    *,
    option: str,
    parse: Callable[[Any, str], T],
    fields: Iterable[str],
    fallback: T,
) -> tuple[T, dict[str, T]]:
    """The team-wide default and the per-node settings from a team argument such as ``human_input=``.

    ``None``: ``fallback`` everywhere. A single value (or a mapping whose keys are all among
    ``fields``, a value in JSON form): for every node. Another mapping: node name -> value, the
    others take the key ``"*"`` (else ``fallback``). ``parse(value, where)`` makes one setting;
    ``where`` is ``""`` or ``"['node']"`` for its error messages.

    Raises:
        UsageError: a node name that is not a participant (naming ``option`` and the participants),
            or what ``parse`` raises.
    """
    if value is None:
        return fallback, {}
    if not isinstance(value, Mapping) or (value and set(value) <= set(fields)):
        return parse(value, ""), {}
    names = list(nodes)
    unknown = sorted(set(value) - set(names) - {"*"})
    if unknown:
        raise UsageError(
            f"{option} names {', '.join(map(repr, unknown))}, which is not a participant "
            f"(participants: {', '.join(names)})",
            option=option,
        )
    default = parse(value["*"], "['*']") if "*" in value else fallback
    return default, {str(name): parse(v, f"[{name!r}]") for name, v in value.items() if name != "*"}


def _one(value: Any, where: str) -> HumanInput:
    if isinstance(value, HumanInput):
        return value
    if isinstance(value, str):
        return HumanInput(value)  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        try:
            return HumanInput(**value)
        except TypeError as exc:
            raise UsageError(f"human_input{where}: {exc}", option="human_input") from exc
    raise UsageError(
        f"human_input{where} must be 'wait', 'inline' or a HumanInput, not {type(value).__name__}",
        option="human_input",
    )


def human_inputs(value: Any, nodes: list[str]) -> tuple[HumanInput, dict[str, HumanInput]]:
    """The team's default and the per-node settings from a ``human_input=`` argument.

    ``None``: inline everywhere (GraphFlow's behaviour, made durable). A mode or a
    :class:`HumanInput`: for every node. A mapping of node names to those: per node (the others
    inline); the key ``"*"`` sets the default.

    Raises:
        UsageError: a bad value, or a node name that is not a participant.
    """
    return node_settings(
        value, nodes, option="human_input", parse=_one, fields=_FIELDS, fallback=HumanInput("inline")
    )


def human_input_config(default: HumanInput, per_node: Mapping[str, HumanInput]) -> Any:
    """The ``human_input=`` argument (JSON) that :func:`human_inputs` turns back into these settings."""
    if not per_node:
        return None if default == HumanInput("inline") else default.to_json()
    return {"*": default.to_json(), **{name: h.to_json() for name, h in per_node.items()}}


def request_id(node: str, step: int, index: int) -> str:
    """The id of the ``index``-th (1-based) input request of ``node``'s turn dispatched at ``step``."""
    return f"{node}/{step}" if index == 1 else f"{node}/{step}#{index}"


def parked_on(result: Any) -> list[str] | None:
    """The ids of the requests a ``waiting`` run parked on, from its stored result (``"waiting"``,
    beside the stop reason); ``None`` when not recorded (a run parked by an older version: every
    pending request of the run counts)."""
    ids = result.get("waiting") if isinstance(result, Mapping) else None
    return [str(i) for i in ids] if isinstance(ids, list) else None


@dataclass(frozen=True)
class InputRequest:
    """A request for human input, as stored.

    Attributes:
        run_id: the run.
        request_id: ``"{node}/{step}"`` (``#n`` appended for a turn's n-th request).
        node: the node that asked.
        prompt: what it asked.
        idempotency_key: the asking turn's key (``current_execution().idempotency_key``).
        status: ``pending``, ``answered`` or ``cancelled``.
        answer: the answer, once answered.
        answered_by: ``"respond"`` (answered while waiting), ``"inline"`` (the input function
            answered), ``"default"`` (the deadline passed), once answered.
        created_at, answered_at: epoch seconds.
        deadline: epoch seconds after which the configured default (or a failure) applies, or ``None``.
        default: the answer taken at the deadline (``None``: the run fails then).
    """

    run_id: str
    request_id: str
    node: str
    prompt: str
    idempotency_key: str
    status: RequestStatus
    answer: str | None
    answered_by: str | None
    created_at: float
    answered_at: float | None
    deadline: float | None
    default: str | None

    def to_json(self) -> dict[str, Any]:
        """The request as a JSON object (what ``runs list --json`` prints)."""
        return {
            "request_id": self.request_id,
            "node": self.node,
            "prompt": self.prompt,
            "status": self.status,
            "created_at": self.created_at,
            "deadline": self.deadline,
        }
