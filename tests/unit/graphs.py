"""Hypothesis strategies for random *valid* GraphFlow graphs, and the message texts that drive them.

Every graph these strategies produce is an ``autogen_agentchat.teams.DiGraph`` that passes
``graph.graph_validate()`` (the strategies call it), so it can be given to ``GraphFlow``, to
``GraphFlowManager`` or to :class:`graphflow_durable.scheduler.GraphSpec` as is.

The shapes:

* :func:`sequential_chains` -- ``n0 -> n1 -> ... -> nk``.
* :func:`fan_out_joins` -- ``n0 -> (n1 .. nk) -> join``, the join ``"all"`` or ``"any"``.
* :func:`conditional_branches` -- ``n0 -> n1`` if one condition, ``n0 -> n2`` if another, sometimes
  joined again.
* :func:`loops` -- ``n0 -> n1 -> (n0 if not APPROVE | n2 if APPROVE)``, with a separate entry node and
  activation groups (or ``"any"``) on the re-entry node, as AutoGen's documentation builds loops.
* :func:`tangles` -- fan-out, self-looping branches, a join in two activation groups, a loop back:
  the shape that drives GraphFlow's rare bookkeeping (counts below zero, a node twice in ready).
* :func:`random_digraphs` -- anything: forward edges, back edges (cycles, always with an exit
  condition), string and callable conditions, several activation groups per target with
  ``"all"``/``"any"``, ``default_start_node`` set sometimes.
* :func:`digraphs` -- one of all the above.

GraphFlow's rules the strategies respect: a node's outgoing edges are either all conditional or all
unconditional; every cycle holds a conditional edge; all edges into the same (target, activation
group) share one ``activation_condition``; there is a start node and a leaf node.

Conditions are drawn from :data:`WORDS`: a string condition ``"yes"`` holds when the message text
contains ``"yes"``; a callable condition is a :class:`Contains` (``Contains("APPROVE", negate=True)``
holds when the text does *not* contain ``"APPROVE"``). :func:`message_texts` draws texts that
contain any subset of the words, so every branch can be taken.

Node names are ``n0``, ``n1``, ...; use :func:`node_names` to list them.

Importing: ``from . import graphs`` inside ``tests/unit``; elsewhere ``from unit import graphs``
(``tests/`` is on ``sys.path``: ``tests/conftest.py`` puts it there, and pytest imports
``tests/unit`` as the package ``unit``).

Example::

    from hypothesis import given

    @given(graph=graphs.digraphs(), text=graphs.message_texts())
    def test_something(graph: DiGraph, text: str) -> None: ...
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraph, DiGraphEdge, DiGraphNode
from hypothesis import strategies as st

__all__ = [
    "WORDS",
    "Condition",
    "Contains",
    "EdgeSpec",
    "build_digraph",
    "conditional_branches",
    "conditions",
    "digraphs",
    "fan_out_joins",
    "loops",
    "message_texts",
    "node_names",
    "random_digraphs",
    "sequential_chains",
    "tangles",
]

WORDS: tuple[str, ...] = ("yes", "no", "APPROVE")
"""The words conditions look for and message texts contain."""


@dataclass(frozen=True)
class Contains:
    """A callable edge condition: holds when the message text contains ``word`` (or not, if ``negate``).

    A frozen dataclass rather than a lambda so that failing examples print readably and two equal
    conditions compare equal.
    """

    word: str
    negate: bool = False

    def __call__(self, message: BaseChatMessage) -> bool:
        return (self.word in message.to_model_text()) != self.negate


Condition = str | Contains | None
"""An edge condition as the strategies produce it: ``None`` (unconditional), a string, a callable."""


@dataclass(frozen=True)
class EdgeSpec:
    """One edge to build: ``source -> target``, its condition and activation settings.

    ``group`` ``""`` means AutoGen's default group (the target's name).
    """

    source: str
    target: str
    condition: Condition = None
    group: str = ""
    activation: str = "all"


def node_names(count: int) -> list[str]:
    """The node names the strategies use: ``["n0", ..., f"n{count - 1}"]``."""
    return [f"n{i}" for i in range(count)]


def build_digraph(nodes: list[str], edges: list[EdgeSpec], default_start_node: str | None = None) -> DiGraph:
    """Build a ``DiGraph`` from plain edge specs and validate it (``ValueError`` if invalid)."""
    outgoing: dict[str, list[DiGraphEdge]] = {name: [] for name in nodes}
    for edge in edges:
        outgoing[edge.source].append(
            DiGraphEdge(
                target=edge.target,
                condition=edge.condition,
                activation_group=edge.group,
                activation_condition="any" if edge.activation == "any" else "all",
            )
        )
    graph = DiGraph(
        nodes={name: DiGraphNode(name=name, edges=outgoing[name]) for name in nodes},
        default_start_node=default_start_node,
    )
    graph.graph_validate()
    return graph


def conditions() -> st.SearchStrategy[str | Contains]:
    """A string condition (a word of :data:`WORDS`) or a callable :class:`Contains` condition."""
    return st.one_of(st.sampled_from(WORDS), st.builds(Contains, st.sampled_from(WORDS), st.booleans()))


def message_texts() -> st.SearchStrategy[str]:
    """Message texts holding any subset of :data:`WORDS` (so any condition may hold or not)."""
    return st.lists(st.sampled_from(WORDS), max_size=3, unique=True).map(
        lambda words: " ".join(["msg", *words])
    )


def _activation() -> st.SearchStrategy[str]:
    return st.sampled_from(("all", "any"))


@st.composite
def sequential_chains(draw: st.DrawFn, max_nodes: int = 6) -> DiGraph:
    """``n0 -> n1 -> ... -> nk``; sometimes each edge is conditional (a chain that can stop early)."""
    nodes = node_names(draw(st.integers(2, max_nodes)))
    conditional = draw(st.booleans())
    edges = [
        EdgeSpec(a, b, draw(conditions()) if conditional else None) for a, b in itertools.pairwise(nodes)
    ]
    return build_digraph(nodes, edges)


@st.composite
def fan_out_joins(draw: st.DrawFn, max_branches: int = 4) -> DiGraph:
    """``n0 -> (n1 .. nk) -> join``: the join waits for all branches or runs on any of them.

    Sometimes the fan-out is conditional (each branch has its own condition), so an ``"all"`` join
    may never run.
    """
    branches = draw(st.integers(1, max_branches))
    nodes = node_names(branches + 2)
    start, middle, join = nodes[0], nodes[1:-1], nodes[-1]
    conditional = draw(st.booleans())
    activation = draw(_activation())
    edges = [EdgeSpec(start, b, draw(conditions()) if conditional else None) for b in middle]
    if draw(st.booleans()):
        edges += [EdgeSpec(b, join, activation=activation) for b in middle]
    else:  # each branch in its own group: the join is enqueued once per branch
        edges += [EdgeSpec(b, join, group=b, activation=draw(_activation())) for b in middle]
    return build_digraph(nodes, edges)


@st.composite
def conditional_branches(draw: st.DrawFn) -> DiGraph:
    """``n0 -> n1`` if one condition, ``n0 -> n2`` if another; sometimes ``n1, n2 -> n3``."""
    join = draw(st.booleans())
    nodes = node_names(4 if join else 3)
    edges = [EdgeSpec("n0", "n1", draw(conditions())), EdgeSpec("n0", "n2", draw(conditions()))]
    if join:
        activation = draw(_activation())
        edges += [EdgeSpec("n1", "n3", activation=activation), EdgeSpec("n2", "n3", activation=activation)]
    return build_digraph(nodes, edges)


@st.composite
def loops(draw: st.DrawFn) -> DiGraph:
    """A review loop with an exit condition.

    ``entry -> n0 -> n1``, ``n1 -> n0`` unless the reviewer says APPROVE, ``n1 -> n2`` if it does.
    ``n0`` has two parents, so either their edges are in separate activation groups (each ``"all"``
    or ``"any"``), or they share one ``"any"`` group; ``entry`` is left out sometimes, making
    ``n0`` the ``default_start_node``.
    """
    with_entry = draw(st.booleans())
    nodes = node_names(3) + (["entry"] if with_entry else [])
    approve: Condition = "APPROVE" if draw(st.booleans()) else Contains("APPROVE")
    edges = [
        EdgeSpec("n0", "n1"),
        EdgeSpec("n1", "n0", Contains("APPROVE", negate=True), group="loop", activation=draw(_activation())),
        EdgeSpec("n1", "n2", approve),
    ]
    if with_entry:
        if draw(st.booleans()):
            edges.append(EdgeSpec("entry", "n0", group="start", activation=draw(_activation())))
        else:  # one shared "any" group for both parents
            edges[1] = EdgeSpec("n1", "n0", Contains("APPROVE", negate=True), group="loop", activation="any")
            edges.append(EdgeSpec("entry", "n0", group="loop", activation="any"))
    return build_digraph(nodes, edges, default_start_node=None if with_entry else "n0")


@st.composite
def tangles(draw: st.DrawFn, max_branches: int = 3) -> DiGraph:
    """The rare bookkeeping cases, made common: a fan-out whose branches may loop on themselves,
    joined in two activation groups, the join looping back to the start unless APPROVE.

    ``n0 -> (n1 .. nk)``; a branch ``bi`` has either one edge ``bi -> join`` or the conditional
    pair ``bi -> bi`` / ``bi -> join``, so it may feed the join several times ("all" counts go
    below zero); the join's incoming edges fall in groups ``""`` and ``"g"`` (the join can be twice
    in the ready queue and in flight twice, triggered by both groups). The join is a leaf, or goes
    back to ``n0`` (its own ``"loop"`` group) unless APPROVE and on to an exit node if APPROVE,
    with ``n0`` the ``default_start_node``.
    """
    branches = draw(st.integers(1, max_branches))
    looping = draw(st.booleans())
    nodes = node_names(branches + (3 if looping else 2))
    start, middle, join = nodes[0], nodes[1 : branches + 1], nodes[branches + 1]
    edges = [EdgeSpec(start, b) for b in middle]
    groups: dict[str, str] = {}
    for branch in middle:
        group = draw(st.sampled_from(("", "g")))
        activation = groups.setdefault(group, draw(_activation()))
        if draw(st.booleans()):
            edges.append(EdgeSpec(branch, branch, draw(conditions()), group="self"))
            edges.append(EdgeSpec(branch, join, draw(conditions()), group, activation))
        else:
            edges.append(EdgeSpec(branch, join, None, group, activation))
    if looping:
        edges.append(EdgeSpec(join, start, Contains("APPROVE", negate=True), group="loop"))
        edges.append(EdgeSpec(join, nodes[-1], "APPROVE"))
    return build_digraph(nodes, edges, default_start_node=start if looping else None)


@st.composite
def random_digraphs(draw: st.DrawFn, max_nodes: int = 7, max_back_edges: int = 2) -> DiGraph:
    """Any valid graph of 1..``max_nodes`` nodes.

    Forward edges go from a lower to a higher index (the last node is always a leaf); back edges
    (target index <= source index, self-loops included) make cycles, and their source's edges are
    all conditional so every cycle has an exit condition. Other nodes' edges are conditional or not
    at random. Each target's incoming edges are split into up to two activation groups, each
    ``"all"`` or ``"any"``. ``default_start_node`` is set sometimes, and always when no node is
    parentless.
    """
    count = draw(st.integers(1, max_nodes))
    nodes = node_names(count)
    pairs: list[tuple[int, int]] = []
    for target in range(1, count):
        parents = draw(st.lists(st.integers(0, target - 1), max_size=min(target, 3), unique=True))
        pairs += [(source, target) for source in sorted(parents)]
    back: list[tuple[int, int]] = []
    if count > 1:
        # (source, target) with target <= source; the last node keeps no outgoing edge (a leaf).
        ends = st.tuples(st.integers(0, count - 2), st.integers(0, count - 2))
        back = sorted(draw(st.sets(ends.map(lambda p: (max(p), min(p))), max_size=max_back_edges)))
    conditional = {source for source, _ in back}
    for source in range(count):
        if draw(st.booleans()):
            conditional.add(source)
    groups: dict[tuple[int, str], str] = {}  # (target, group) -> activation
    edges: list[EdgeSpec] = []
    for source in range(count):
        # The order of a node's edges is the order GraphFlow enqueues its children in.
        targets = draw(st.permutations([t for s, t in pairs + back if s == source]))
        for target in targets:
            group = draw(st.sampled_from(("", "g")))
            activation = groups.setdefault((target, group), draw(_activation()))
            condition = draw(conditions()) if source in conditional else None
            edges.append(EdgeSpec(nodes[source], nodes[target], condition, group, activation))
    has_parentless = any(all(target != i for _, target in pairs + back) for i in range(count))
    default_start = None
    if not has_parentless or draw(st.booleans()):
        default_start = nodes[draw(st.integers(0, count - 1))]
    return build_digraph(nodes, edges, default_start)


def digraphs() -> st.SearchStrategy[DiGraph]:
    """One of every shape above, the general :func:`random_digraphs` twice as often as the others."""
    return st.one_of(
        random_digraphs(),
        sequential_chains(),
        fan_out_joins(),
        conditional_branches(),
        loops(),
        tangles(),
        random_digraphs(),
    )
