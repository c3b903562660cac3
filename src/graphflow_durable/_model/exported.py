"""What the store does with a run's content that needs AutoGen.

For ``Store.import_run``: each message body through AutoGen's message factory, the run's graph
description rebuilt as a ``DiGraph``, and the head step's scheduler state through the scheduler's
own parser against that graph. Storage never imports AutoGen, so the store's document reader
(``_storage.document``) calls these through ``ContentChecks``, which the package installs. Each
raises ``ValueError`` saying, in one line, what is wrong (the reader adds the path of the field).

For ``Store.supply_output``: :func:`supplied_answer`, an operator's answer for a node as the
scheduler records a real one (installed by the package in ``_storage.admin``, likewise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from autogen_agentchat import messages as _messages
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory, TextMessage

from graphflow_durable._model.cursor import Cursor
from graphflow_durable._model.graphid import graph_of
from graphflow_durable.errors import StateFormatError
from graphflow_durable.scheduler import GraphSpec, complete

__all__ = ["check_graph", "check_head", "check_message", "supplied_answer"]

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


def _spec_with_conditions(description: Mapping[str, Any], node: str) -> GraphSpec:
    """The graph's spec with the text conditions of ``node``'s edges, which decide which of them an
    answer fires (:func:`graph_of` leaves conditions out); ``ValueError`` when one is a callable,
    which only the team that holds it can evaluate."""
    graph = graph_of(description)
    stored = description["nodes"][node]["edges"]
    edges = []
    for edge, described in zip(graph.nodes[node].edges, stored, strict=True):
        condition = described.get("condition")
        if condition is None:
            edges.append(edge)
        elif isinstance(condition, str) and condition.startswith("text:"):
            edges.append(edge.model_copy(update={"condition": condition[len("text:") :]}))
        else:
            raise ValueError(
                f"node {node}'s edge to {edge.target} has a callable condition ({condition}), which only "
                "its team can evaluate, so which edges the answer fires cannot be decided here"
            )
    graph.nodes[node] = graph.nodes[node].model_copy(update={"edges": edges})
    return GraphSpec.from_digraph(graph)


def supplied_answer(
    description: Mapping[str, Any], head: Mapping[str, Any], node: str, text: str
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    """``text`` as ``node``'s answer, recorded as the scheduler records a real one: a
    ``TextMessage`` from the node, and the head's cursor (``head``, against the run's graph
    ``description``) after it: the node leaves the in-flight list, its edges' counts decrement and
    their targets are enqueued (:func:`~graphflow_durable.scheduler.complete`), its turn's counts
    are dropped; when it was the batch's last answer, the batch's end is left to the next driver
    (``Cursor.end_due``). Returns the message's dump, the new cursor's JSON and the nodes ready.

    Raises ``ValueError`` (one line) when the node is not in flight at the head or one of its edges
    has a callable condition.
    """
    spec = _spec_with_conditions(description, node)
    cursor = Cursor.from_json(head, spec, {})
    if node not in cursor.sched.in_flight:
        raise ValueError(
            f"node {node} is not in flight at the run's head (in flight: {list(cursor.sched.in_flight)})"
        )
    message = TextMessage(content=text, source=node)
    after = cursor.supplied(node, complete(spec, cursor.sched, node, message))
    return dict(message.dump()), after.to_json(spec), after.sched.ready
