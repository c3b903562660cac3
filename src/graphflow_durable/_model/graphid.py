"""Graph identity: a canonical description of a team's graph and its fingerprint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autogen_agentchat.teams import DiGraph, DiGraphEdge, DiGraphNode

from graphflow_durable._model import codec as _codec

__all__ = ["describe_graph", "describe_difference", "fingerprint", "graph_of"]


def _condition(edge: Any) -> str | None:
    function = edge.condition_function
    if function is not None:
        module = getattr(function, "__module__", "?")
        name = getattr(function, "__qualname__", type(function).__name__)
        return f"<callable {module}.{name}>"
    return None if edge.condition is None else f"text:{edge.condition}"


def describe_graph(graph: DiGraph, participants: Sequence[str]) -> dict[str, Any]:
    """A JSON description of everything that decides how the graph schedules its nodes.

    Callable edge conditions are described by their module and qualified name (their code cannot
    be compared); string conditions by their text.
    """
    nodes: dict[str, Any] = {}
    for name, node in sorted(graph.nodes.items()):
        nodes[name] = {
            "activation": node.activation,
            "edges": [
                {
                    "target": e.target,
                    "condition": _condition(e),
                    "group": e.activation_group,
                    "activation": e.activation_condition,
                }
                for e in node.edges
            ],
        }
    return {
        "nodes": nodes,
        "default_start_node": graph.default_start_node,
        "participants": list(participants),
    }


def graph_of(description: Mapping[str, Any]) -> DiGraph:
    """The graph a :func:`describe_graph` description stands for, as far as scheduling goes: its
    nodes, edges, activation groups and start node. Edge conditions are left out (a callable is
    described only by its name); they decide which edges fire, not the counts a scheduler state holds.

    Raises ``ValueError`` (pydantic's, naming the field) or ``KeyError``/``TypeError``/
    ``AttributeError`` when ``description`` does not have the shape :func:`describe_graph` gives.
    """
    return DiGraph(
        nodes={
            str(name): DiGraphNode(
                name=str(name),
                activation=node["activation"],
                edges=[
                    DiGraphEdge(
                        target=edge["target"],
                        activation_group=edge["group"],
                        activation_condition=edge["activation"],
                    )
                    for edge in node["edges"]
                ],
            )
            for name, node in description["nodes"].items()
        },
        default_start_node=description.get("default_start_node"),
    )


def fingerprint(description: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a graph description."""
    return _codec.digest(_codec.dumps(description, where="graph"))


def describe_difference(stored: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """Human-readable lines saying how ``given`` differs from ``stored``."""
    lines: list[str] = []
    old_nodes: Mapping[str, Any] = stored.get("nodes", {})
    new_nodes: Mapping[str, Any] = given.get("nodes", {})
    for name in sorted(set(old_nodes) - set(new_nodes)):
        lines.append(f"node {name!r} is in the stored run but not in the given graph")
    for name in sorted(set(new_nodes) - set(old_nodes)):
        lines.append(f"node {name!r} is in the given graph but not in the stored run")
    for name in sorted(set(old_nodes) & set(new_nodes)):
        old, new = old_nodes[name], new_nodes[name]
        if old.get("activation") != new.get("activation"):
            lines.append(f"node {name!r}: activation {old.get('activation')!r} -> {new.get('activation')!r}")
        old_edges = {_codec.dumps(e) for e in old.get("edges", [])}
        new_edges = {_codec.dumps(e) for e in new.get("edges", [])}
        lines.extend(f"node {name!r}: edge removed {e}" for e in sorted(old_edges - new_edges))
        lines.extend(f"node {name!r}: edge added {e}" for e in sorted(new_edges - old_edges))
    if stored.get("default_start_node") != given.get("default_start_node"):
        lines.append(
            f"default start node {stored.get('default_start_node')!r} -> {given.get('default_start_node')!r}"
        )
    if list(stored.get("participants", [])) != list(given.get("participants", [])):
        lines.append(f"participants {stored.get('participants')} -> {given.get('participants')}")
    return lines
