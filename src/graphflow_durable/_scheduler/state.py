"""The scheduler's values: the graph's lookup tables (:class:`GraphSpec`), GraphFlow's scheduling
bookkeeping as a plain value (:class:`SchedulerState`) with its JSON forms (full, sparse, plain
GraphFlow's view), and the state of a fresh graph (:func:`initial`).

:mod:`graphflow_durable.scheduler` is their public home (import them from there) and states the
rules that move a state to the next one. Pure: nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from autogen_agentchat.teams import DiGraph, DiGraphEdge

from graphflow_durable.errors import StateFormatError

__all__ = ["PLAIN_KEYS", "GraphSpec", "SchedulerState", "initial"]

#: The scheduler keys of plain GraphFlow's saved manager state (see :meth:`SchedulerState.plain_view`).
PLAIN_KEYS = ("current_turn", "remaining", "enqueued_any", "ready")

Activation = Literal["all", "any"]


@dataclass(frozen=True)
class GraphSpec:
    """The lookup tables the scheduling rules need, computed once from a ``DiGraph``."""

    graph: DiGraph
    nodes: tuple[str, ...]
    start_nodes: tuple[str, ...]
    edges: Mapping[str, tuple[DiGraphEdge, ...]]
    activation: Mapping[str, Mapping[str, Activation]]
    origin_remaining: Mapping[str, Mapping[str, int]]

    @classmethod
    def from_digraph(cls, graph: DiGraph) -> GraphSpec:
        """Build the tables. Start nodes are sorted so the order is the same in every process."""
        activation: dict[str, dict[str, Activation]] = {}
        for node in graph.nodes.values():
            for edge in node.edges:
                activation.setdefault(edge.target, {}).setdefault(
                    edge.activation_group, edge.activation_condition
                )
        return cls(
            graph=graph,
            nodes=tuple(graph.nodes),
            start_nodes=tuple(sorted(graph.get_start_nodes())),
            edges={name: tuple(node.edges) for name, node in graph.nodes.items()},
            activation=activation,
            origin_remaining=graph.get_remaining_map(),
        )


@dataclass(frozen=True)
class SchedulerState:
    """GraphFlow's scheduling bookkeeping, as a plain value.

    Attributes:
        remaining: per target node and activation group, how many parents must still finish.
        enqueued_any: per target and ``"any"`` group, whether the target was already enqueued.
        triggered: per node, the activation groups that enqueued it since it last spoke.
        ready: the queue of nodes allowed to speak next (may hold a node twice, as GraphFlow's).
        in_flight: nodes selected to speak whose response has not been recorded yet.
        turn: completed batches in the current round (GraphFlow's ``_current_turn``).
        touched: the targets whose counts or flags may differ from the armed graph (``None``:
            unknown, every target may). It keeps :meth:`to_sparse_json` proportional to the active
            frontier; it is bookkeeping, not state, and takes no part in equality.
    """

    remaining: Mapping[str, Mapping[str, int]]
    enqueued_any: Mapping[str, Mapping[str, bool]]
    triggered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ready: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()
    turn: int = 0
    touched: frozenset[str] | None = field(default=None, compare=False, repr=False)

    def with_turn(self, turn: int) -> SchedulerState:
        """This state with another turn count (cheaper than ``dataclasses.replace``)."""
        return SchedulerState(
            self.remaining, self.enqueued_any, self.triggered, self.ready, self.in_flight, turn, self.touched
        )

    def plain_view(self) -> dict[str, Any]:
        """The keys plain GraphFlow's manager saves (:data:`PLAIN_KEYS`), as this state implies them.

        The in-flight nodes come first in ``ready``, so plain GraphFlow loading the state runs the
        interrupted nodes again.
        """
        return {
            "current_turn": self.turn,
            "remaining": {t: dict(g) for t, g in self.remaining.items()},
            "enqueued_any": {t: dict(g) for t, g in self.enqueued_any.items()},
            "ready": [*self.in_flight, *self.ready],
        }

    def to_json(self) -> dict[str, Any]:
        """The full state as JSON types (maps are copied, tuples become lists)."""
        return {
            "remaining": {t: dict(g) for t, g in self.remaining.items()},
            "enqueued_any": {t: dict(g) for t, g in self.enqueued_any.items()},
            "triggered": {t: list(g) for t, g in self.triggered.items() if g},
            "ready": list(self.ready),
            "in_flight": list(self.in_flight),
            "turn": self.turn,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SchedulerState:
        """Inverse of :meth:`to_json`; raises :class:`StateFormatError` on a wrong shape."""
        try:
            return cls(
                remaining={
                    str(t): {str(g): int(c) for g, c in gs.items()} for t, gs in data["remaining"].items()
                },
                enqueued_any={
                    str(t): {str(g): bool(f) for g, f in gs.items()} for t, gs in data["enqueued_any"].items()
                },
                triggered={str(t): tuple(str(g) for g in gs) for t, gs in data.get("triggered", {}).items()},
                ready=tuple(str(n) for n in data["ready"]),
                in_flight=tuple(str(n) for n in data.get("in_flight", ())),
                turn=int(data.get("turn", 0)),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StateFormatError(f"scheduler state has the wrong shape: {exc!r}") from exc

    def to_sparse_json(self, spec: GraphSpec) -> dict[str, Any]:
        """A compact form holding only what differs from the graph's armed state.

        Its size follows the active frontier of the run, not the size of the graph.
        """
        out: dict[str, Any] = {
            "ready": list(self.ready),
            "in_flight": list(self.in_flight),
            "turn": self.turn,
        }
        targets = self.remaining.keys() | self.enqueued_any.keys() if self.touched is None else self.touched
        remaining = {
            t: changed
            for t in targets
            if (
                changed := {
                    g: c
                    for g, c in self.remaining.get(t, {}).items()
                    if spec.origin_remaining.get(t, {}).get(g) != c
                }
            )
        }
        if remaining:
            out["remaining"] = remaining
        flags = {t: sorted(g for g, f in self.enqueued_any.get(t, {}).items() if f) for t in targets}
        if any(flags.values()):
            out["enqueued_any"] = {t: g for t, g in flags.items() if g}
        triggered = {t: list(g) for t, g in self.triggered.items() if g}
        if triggered:
            out["triggered"] = triggered
        return out

    @classmethod
    def from_sparse_json(cls, data: Mapping[str, Any], spec: GraphSpec) -> SchedulerState:
        """Inverse of :meth:`to_sparse_json`."""
        base = initial(spec)
        try:
            remaining = {t: dict(g) for t, g in base.remaining.items()}
            for t, groups in data.get("remaining", {}).items():
                remaining.setdefault(t, {}).update({g: int(c) for g, c in groups.items()})
            enqueued = {t: dict(g) for t, g in base.enqueued_any.items()}
            for t, groups in data.get("enqueued_any", {}).items():
                for g in groups:
                    enqueued.setdefault(t, {})[g] = True
            return cls(
                remaining=remaining,
                enqueued_any=enqueued,
                triggered={t: tuple(g) for t, g in data.get("triggered", {}).items()},
                ready=tuple(data["ready"]),
                in_flight=tuple(data.get("in_flight", ())),
                turn=int(data.get("turn", 0)),
                touched=frozenset(data.get("remaining", {})) | frozenset(data.get("enqueued_any", {})),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StateFormatError(f"sparse scheduler state has the wrong shape: {exc!r}") from exc


def initial(spec: GraphSpec) -> SchedulerState:
    """The state of a fresh GraphFlow: all groups armed, the start nodes ready."""
    return SchedulerState(
        remaining={t: dict(g) for t, g in spec.origin_remaining.items()},
        enqueued_any={t: {g: False for g in groups} for t, groups in spec.activation.items()},
        triggered={},
        ready=spec.start_nodes,
        in_flight=(),
        turn=0,
        touched=frozenset(),
    )
