"""GraphFlow's scheduling rules as pure functions over a plain, serialisable state.

AutoGen's ``GraphFlowManager`` keeps its scheduling bookkeeping in memory and mutates it in
place. This module states the same rules as pure functions over :class:`SchedulerState`, so the
durable manager (live execution) and the repair engine (replaying a saved thread) share one
implementation and cannot disagree.

The rules, as in autogen-agentchat 0.7.x:

* :func:`initial` -- every target's remaining count is the number of edges into it per
  activation group; the ready queue holds the start nodes.
* :func:`select` -- drains the ready queue into the in-flight list; for every speaker taken,
  the activation groups that triggered it are re-armed (``"all"`` counts reset to their
  original value, ``"any"`` flags cleared).
* :func:`complete` -- a node's chat message arrived: it leaves the in-flight list, and each of
  the message source's outgoing edges whose condition holds decrements its target's group
  (``"all"``: enqueue at zero) or enqueues the target once (``"any"``). It does not count turns:
  GraphFlow counts one per batch only after its termination checks, so the caller, which owns
  those checks, keeps ``turn``.
* :func:`finish` -- the natural end of the graph (nothing ready, nothing in flight) re-arms the
  counters and queues the start nodes again, as GraphFlow does.
* :func:`replay` -- rebuilds the state from a message thread alone.

The values come first: the graph's lookup tables (:class:`GraphSpec`), GraphFlow's scheduling
bookkeeping as a plain value (:class:`SchedulerState`) with its JSON forms (full, sparse, plain
GraphFlow's view), and the state of a fresh graph (:func:`initial`); then the rules that move a
state to the next one.

Nothing here does I/O. The only AutoGen names used are public ones (``DiGraph``, messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_agentchat.teams import DiGraph, DiGraphEdge

from graphflow_durable.errors import ReplayError, StateFormatError

__all__ = [
    "PLAIN_KEYS",
    "GraphSpec",
    "ReplayResult",
    "SchedulerState",
    "complete",
    "finish",
    "initial",
    "is_done",
    "replay",
    "select",
]


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
        return _state(
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
        if targets:  # else nothing differs from the armed graph (the usual case between two batches)
            self._sparse_targets(spec, targets, out)
        if self.triggered:
            triggered = {t: list(g) for t, g in self.triggered.items() if g}
            if triggered:
                out["triggered"] = triggered
        return out

    def _sparse_targets(self, spec: GraphSpec, targets: Iterable[str], out: dict[str, Any]) -> None:
        """Into ``out``: the counts and flags of ``targets`` that differ from the armed graph."""
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


_new = object.__new__


def _state(
    remaining: Mapping[str, Mapping[str, int]],
    enqueued_any: Mapping[str, Mapping[str, bool]],
    triggered: Mapping[str, tuple[str, ...]],
    ready: tuple[str, ...],
    in_flight: tuple[str, ...],
    turn: int,
    touched: frozenset[str] | None,
) -> SchedulerState:
    """``SchedulerState(remaining, ..., touched)``, the same value, made without the frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` call per field, about twice the time):
    the rules make two or three states per transition. Every field is given: none is defaulted."""
    state: SchedulerState = _new(SchedulerState)
    fields = state.__dict__
    fields["remaining"] = remaining
    fields["enqueued_any"] = enqueued_any
    fields["triggered"] = triggered
    fields["ready"] = ready
    fields["in_flight"] = in_flight
    fields["turn"] = turn
    fields["touched"] = touched
    return state


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


def select(spec: GraphSpec, state: SchedulerState) -> tuple[SchedulerState, tuple[str, ...]]:
    """Drain the ready queue into the in-flight list; return the new state and the speakers.

    For each speaker taken (in queue order), the activation groups that triggered it are re-armed,
    exactly as ``GraphFlowManager.select_speaker`` does.
    """
    speakers = state.ready
    if not speakers:
        return state, ()
    remaining = dict(state.remaining)
    enqueued = dict(state.enqueued_any)
    triggered = dict(state.triggered)
    for speaker in speakers:
        groups = triggered.pop(speaker, ())
        for group in groups:
            if spec.activation[speaker][group] == "any":
                enqueued[speaker] = {**enqueued[speaker], group: False}
            elif speaker in remaining and group in remaining[speaker]:
                remaining[speaker] = {**remaining[speaker], group: spec.origin_remaining[speaker][group]}
    touched = state.touched
    if touched is not None:
        # A speaker re-armed back to the graph's armed state leaves the frontier, so the frontier
        # follows what is active now, not every node that ever ran.
        rearmed = {
            s
            for s in speakers
            if remaining.get(s, {}) == spec.origin_remaining.get(s, {})
            and not any(enqueued.get(s, {}).values())
        }
        touched = (touched | set(speakers)) - rearmed
    new = _state(remaining, enqueued, triggered, (), state.in_flight + speakers, state.turn, touched)
    return new, speakers


def complete(spec: GraphSpec, state: SchedulerState, node: str, message: BaseChatMessage) -> SchedulerState:
    """Record that ``node`` answered with ``message``.

    ``node`` leaves the in-flight list (one occurrence). The outgoing edges of the message's
    source are evaluated against the message, as GraphFlow does; a message whose source is not
    a graph node moves nothing.

    ``turn`` is left alone (see the module docstring): at the end of a batch that is not the
    natural end, GraphFlow adds one after its termination checks, and the caller does the same.

    Raises:
        ValueError: if ``node`` is not in flight.
    """
    if node not in state.in_flight:
        raise ValueError(f"node {node!r} answered but is not in flight (in flight: {list(state.in_flight)})")
    index = state.in_flight.index(node)
    in_flight = state.in_flight[:index] + state.in_flight[index + 1 :]
    source = message.source
    if source not in spec.edges:
        return replace(state, in_flight=in_flight)
    remaining = dict(state.remaining)
    enqueued = dict(state.enqueued_any)
    triggered = dict(state.triggered)
    ready = list(state.ready)
    changed: set[str] = set()
    for edge in spec.edges[source]:
        if not edge.check_condition(message):
            continue
        target, group = edge.target, edge.activation_group
        changed.add(target)
        if spec.activation[target][group] == "all":
            count = remaining[target][group] - 1
            remaining[target] = {**remaining[target], group: count}
            if count == 0:
                ready.append(target)
                _trigger(triggered, target, group)
        elif not enqueued[target][group]:
            ready.append(target)
            enqueued[target] = {**enqueued[target], group: True}
            _trigger(triggered, target, group)
    touched = None if state.touched is None else state.touched | changed
    return _state(remaining, enqueued, triggered, tuple(ready), in_flight, state.turn, touched)


def _trigger(triggered: dict[str, tuple[str, ...]], target: str, group: str) -> None:
    groups = triggered.get(target, ())
    if group not in groups:
        triggered[target] = (*groups, group)


def is_done(state: SchedulerState) -> bool:
    """True when the graph has run to its natural end: nothing ready and nothing in flight."""
    return not state.ready and not state.in_flight


def finish(spec: GraphSpec, state: SchedulerState) -> SchedulerState:
    """The natural end of the graph: re-arm the counters and queue the start nodes again.

    As in GraphFlow, the triggered-groups bookkeeping is kept and the turn counter goes to 0.
    """
    fresh = initial(spec)
    return replace(fresh, triggered=state.triggered)


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay` learnt from a thread.

    Attributes:
        state: the scheduler state after the last message.
        completions: thread index of every message that counted as a node's completion.
        finished_at: thread indexes after which the graph reached its natural end.
        dispatched_at: for every node in ``state.in_flight``, the thread length when its batch was
            selected (the messages it had seen as input). Read from the thread: the index just
            after the last chat message before the batch's first answer, so that answer's inner
            events are not counted and a task message appended before the batch is.
        dispatches: for every node, the same point at each of its selections, in order.
    """

    state: SchedulerState
    completions: tuple[int, ...]
    finished_at: tuple[int, ...]
    dispatched_at: Mapping[str, int]
    dispatches: Mapping[str, tuple[int, ...]]


def replay(
    spec: GraphSpec,
    thread: Sequence[BaseAgentEvent | BaseChatMessage],
    *,
    start: SchedulerState | None = None,
) -> ReplayResult:
    """Rebuild the scheduler state by running ``thread`` through the graph's rules.

    Every chat message whose source is a graph node is a completion of that node. A batch is
    selected lazily, when the first answer of the batch is seen, so a thread that ends between two
    batches leaves the next batch in ``ready`` and one that ends inside a batch leaves the nodes
    that had not answered in ``in_flight``. Messages from outside the graph (the user's task) and
    agent events move nothing. ``turn`` is kept from ``start`` (0 without it) and set to 0 at each
    natural end; replay does not count turns, because a run stopped by a termination condition
    (which sets GraphFlow's ``_current_turn`` back to 0) leaves no trace in the thread.

    Raises:
        ReplayError: naming the index and source of the first message the graph cannot explain
            (a node speaking while it was neither in flight nor ready).
    """
    state = start if start is not None else initial(spec)
    completions: list[int] = []
    finished: list[int] = []
    dispatched: dict[str, list[int]] = {}
    # Where the delta of the next answer begins: just after the last chat message. An answer's
    # inner events (tool calls, thoughts) come before its chat message in the same delta, and
    # GraphFlow selected the batch before that delta was appended.
    delta_start = 0
    for index, message in enumerate(thread):
        if not isinstance(message, BaseChatMessage):
            continue
        if message.source not in spec.edges:
            delta_start = index + 1
            continue
        if not state.in_flight:
            state, speakers = select(spec, state)
            for speaker in speakers:
                dispatched.setdefault(speaker, []).append(delta_start)
        if message.source not in state.in_flight:
            raise ReplayError(
                f"message {index} from {message.source!r} does not fit the graph: "
                f"{message.source!r} was not allowed to speak then "
                f"(in flight: {list(state.in_flight)}, ready: {list(state.ready)})",
                index=index,
                node=message.source,
            )
        state = complete(spec, state, message.source, message)
        completions.append(index)
        delta_start = index + 1
        if is_done(state):
            state = finish(spec, state)
            finished.append(index)
    return ReplayResult(
        state=state,
        completions=tuple(completions),
        finished_at=tuple(finished),
        dispatched_at={n: dispatched[n][-1] for n in state.in_flight if n in dispatched},
        dispatches={n: tuple(points) for n, points in dispatched.items()},
    )
