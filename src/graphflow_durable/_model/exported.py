"""The checks of an exported run's content that need AutoGen, for ``Store.import_run``: each message
body through AutoGen's message factory, the run's graph description rebuilt as a ``DiGraph``, and
the head step's scheduler state through the scheduler's own parser against that graph.

Storage never imports AutoGen, so the store's document reader (``_storage.document``) calls these
through ``ContentChecks``, which the package installs. Each raises ``ValueError`` saying, in one
line, what is wrong (the reader adds the path of the field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from autogen_agentchat import messages as _messages
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory

from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.graphid import graph_of
from graphflow_durable.errors import StateFormatError
from graphflow_durable.scheduler import GraphSpec

__all__ = ["check_graph", "check_head", "check_message"]

_factory = MessageFactory()

#: The message types AutoGen's factory loads without a team (found through its public
#: ``is_registered``); a team may register more (``custom_message_types``).
_KNOWN = frozenset(
    name
    for name, value in vars(_messages).items()
    if isinstance(value, type)
    and issubclass(value, (BaseChatMessage, BaseAgentEvent))
    and _factory.is_registered(value)
)


def _first_error(exc: pydantic.ValidationError) -> str:
    """pydantic's first error in one line: ``content: Field required``."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ())) or "the message"
    return f"{where}: {error.get('msg', 'invalid')}"


def check_message(body: Mapping[str, Any]) -> None:
    """Refuse a message body AutoGen cannot load (``ValueError``).

    A type AutoGen's own factory knows is loaded by it, as a resume loads it. Another type (a
    team's ``custom_message_types``) can only be loaded by its team: it must at least name its
    type and its source, as every ``message.dump()`` does.
    """
    kind = body.get("type")
    if not isinstance(kind, str):
        raise ValueError('is not an AutoGen message dump: it has no "type" naming a message class')
    if kind not in _KNOWN:
        if not isinstance(body.get("source"), str):
            raise ValueError(f'is not an AutoGen message dump: a {kind!r} message without a "source"')
        return
    try:
        _factory.create(body)
    except pydantic.ValidationError as exc:
        raise ValueError(f"is not a {kind} that AutoGen can load ({_first_error(exc)})") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"is not a {kind} that AutoGen can load ({str(exc).splitlines()[0]})") from None


def _spec(description: Mapping[str, Any]) -> GraphSpec:
    return GraphSpec.from_digraph(graph_of(description))


def check_graph(description: Mapping[str, Any]) -> None:
    """Refuse a run's graph description that does not make a graph (``ValueError``)."""
    try:
        spec = _spec(description)
    except pydantic.ValidationError as exc:
        raise ValueError(f"is not a graph description ({_first_error(exc)})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"is not a graph description (its field {exc!s} is wrong or missing)") from None
    missing = sorted({e.target for edges in spec.edges.values() for e in edges} - set(spec.nodes))
    if missing:
        raise ValueError(f"has edges to {missing}, which are not among its nodes")


def check_head(scheduler: Mapping[str, Any], description: Mapping[str, Any]) -> None:
    """Refuse a head step's scheduler state (a cursor, as each step stores it) that the scheduler
    cannot read against the run's graph, or that names nodes the graph does not have (``ValueError``).
    ``description`` has passed :func:`check_graph`."""
    spec = _spec(description)
    try:
        Cursor.from_json(scheduler, spec, {})
    except StateFormatError as exc:
        raise ValueError(f"is not a scheduler state this release reads ({exc})") from None
    state = scheduler["s"]
    for key in ("ready", "in_flight"):
        names = state.get(key, [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"is not a scheduler state: s.{key} is not a list of node names")
        unknown = sorted(set(names) - set(spec.nodes))
        if unknown:
            raise ValueError(
                f"is not a scheduler state of this graph: s.{key} names {unknown}, not its nodes"
            )
    if not isinstance(state.get("turn", 0), int) or isinstance(state.get("turn"), bool):
        raise ValueError("is not a scheduler state: s.turn is not an integer")
