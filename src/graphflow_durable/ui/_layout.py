"""The run's graph drawn as SVG: nodes in layers (longest path from the start nodes, back edges
left out of the layering and drawn curved), each coloured by its state, edges with their conditions.

Pure: from the stored graph description (``_model.graphid.describe_graph``) and the node states to
markup. Every text is escaped; the markup holds no script, no event attribute, no external reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from html import escape
from typing import Any

__all__ = ["STATE_COLOURS", "Edge", "Layout", "esc", "graph_edges", "graph_svg", "layout", "short"]

#: Fill and stroke per node state (presentation attributes: drawn without any stylesheet).
STATE_COLOURS: dict[str, tuple[str, str]] = {
    "pending": ("#f3f4f6", "#9ca3af"),
    "running": ("#dbeafe", "#2563eb"),
    "waiting": ("#fef3c7", "#d97706"),
    "done": ("#dcfce7", "#16a34a"),
    "failed": ("#fee2e2", "#dc2626"),
    "backoff": ("#ffedd5", "#ea580c"),
    "cancelled": ("#e5e7eb", "#4b5563"),
}

_NODE_H = 40
_ROW_GAP = 36
_COL_GAP = 120
_MARGIN = 24
_CHAR_W = 7.2
_MAX_CHARS = 28
_ANY = " \u00b7 any"
_DASHED = 'stroke-dasharray="5 3" '


def esc(text: object) -> str:
    """``text`` escaped for an SVG text node or a double-quoted attribute value."""
    return escape(str(text), quote=True)


def short(text: str, limit: int = _MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@dataclass(frozen=True)
class Edge:
    """An edge of the stored graph, with the words its label shows."""

    source: str
    target: str
    label: str
    back: bool = False


@dataclass(frozen=True)
class Layout:
    """Where each node stands: its layer (column) and its row in that layer."""

    layers: tuple[tuple[str, ...], ...]
    edges: tuple[Edge, ...]

    @property
    def order(self) -> list[str]:
        """The nodes layer by layer, top to bottom (the timeline's lane order)."""
        return [name for layer in self.layers for name in layer]


def _label(source: str, edge: Mapping[str, Any]) -> str:
    parts = []
    condition = edge.get("condition")
    if isinstance(condition, str):
        parts.append(condition[5:] if condition.startswith("text:") else condition)
    target = str(edge.get("target"))
    group, activation = edge.get("group"), edge.get("activation")
    if (group is not None and group != target) or (activation is not None and activation != "all"):
        parts.append(f"[{group if group is not None else target}: {activation or 'all'}]")
    return " ".join(parts)


def graph_edges(description: Mapping[str, Any]) -> list[Edge]:
    """The edges of a stored graph description, in its order (nodes sorted, edges as declared)."""
    nodes: Mapping[str, Any] = description.get("nodes") or {}
    return [
        Edge(str(name), str(edge.get("target")), _label(str(name), edge))
        for name, node in sorted(nodes.items())
        for edge in (node.get("edges") or [])
        if str(edge.get("target")) in nodes
    ]


def _starts(names: Sequence[str], edges: Sequence[Edge], default: object) -> list[str]:
    has_in = {e.target for e in edges if e.source != e.target}
    starts = [n for n in names if n not in has_in]
    if isinstance(default, str) and default in names and default not in starts:
        starts.insert(0, default)
    return starts


def layout(description: Mapping[str, Any]) -> Layout:
    """Layers by longest path from the start nodes, once the back edges (found by a depth-first
    walk from the start nodes, in name order) are left out; each layer ordered by where its
    nodes' predecessors stand, then by name. Deterministic."""
    names = sorted(str(n) for n in (description.get("nodes") or {}))
    edges = graph_edges(description)
    out: dict[str, list[str]] = {n: [] for n in names}
    for e in edges:
        if e.target not in out[e.source]:
            out[e.source].append(e.target)
    back: set[tuple[str, str]] = set()
    seen: set[str] = set()
    on_path: set[str] = set()

    def walk(root: str) -> None:  # iterative DFS: a long chain must not hit the recursion limit
        stack: list[tuple[str, int]] = [(root, 0)]
        seen.add(root)
        on_path.add(root)
        while stack:
            node, i = stack[-1]
            if i < len(out[node]):
                stack[-1] = (node, i + 1)
                nxt = out[node][i]
                if nxt in on_path:
                    back.add((node, nxt))
                elif nxt not in seen:
                    seen.add(nxt)
                    on_path.add(nxt)
                    stack.append((nxt, 0))
            else:
                on_path.discard(node)
                stack.pop()

    for root in [*_starts(names, edges, description.get("default_start_node")), *names]:
        if root not in seen:
            walk(root)
    forward = {(e.source, e.target) for e in edges if (e.source, e.target) not in back}
    level = {n: 0 for n in names}
    for _ in names:  # longest path on the acyclic rest: at most len(names) relaxations
        changed = False
        for s, t in sorted(forward):
            if level[t] < level[s] + 1:
                level[t] = level[s] + 1
                changed = True
        if not changed:
            break
    depth = max(level.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    row: dict[str, float] = {}
    preds: dict[str, list[str]] = {n: [] for n in names}
    for s, t in sorted(forward):
        preds[t].append(s)
    for n in names:
        layers[level[n]].append(n)
    for layer in layers:
        placed = [row[p] for n in layer for p in preds[n] if p in row]
        fallback = sum(placed) / len(placed) if placed else 0.0

        layer.sort(key=partial(_barycentre, preds=preds, row=row, rest=fallback))
        for i, n in enumerate(layer):
            row[n] = float(i)
    marked = tuple(
        Edge(e.source, e.target, e.label, back=(e.source, e.target) in back or e.source == e.target)
        for e in edges
    )
    return Layout(tuple(tuple(layer) for layer in layers), marked)


def _barycentre(
    name: str, preds: Mapping[str, Sequence[str]], row: Mapping[str, float], rest: float
) -> tuple[float, str]:
    """Where ``name`` goes in its layer: the mean row of its placed predecessors (``rest``: none placed)."""
    where = [row[p] for p in preds[name] if p in row]
    return (sum(where) / len(where) if where else rest, name)


def _width(name: str) -> int:
    return max(90, int(len(short(name)) * _CHAR_W) + 24)


def graph_svg(description: Mapping[str, Any], states: Mapping[str, str], where: Layout | None = None) -> str:
    """The graph as one ``<svg>`` element: a ``<g data-node data-state>`` per node, a ``<path>`` per
    edge (``data-source``, ``data-target``) with an arrowhead and its condition as a label."""
    plan = where or layout(description)
    widths = [max((_width(n) for n in layer), default=90) for layer in plan.layers]
    tallest = max((len(layer) for layer in plan.layers), default=0)
    height_inner = max(tallest * (_NODE_H + _ROW_GAP) - _ROW_GAP, _NODE_H)
    box: dict[str, tuple[float, float, float]] = {}  # name -> (x, y, width)
    x = float(_MARGIN)
    for layer, w in zip(plan.layers, widths, strict=True):
        top = _MARGIN + 20 + (height_inner - (len(layer) * (_NODE_H + _ROW_GAP) - _ROW_GAP)) / 2
        for i, n in enumerate(layer):
            nw = _width(n)
            box[n] = (x + (w - nw) / 2, top + i * (_NODE_H + _ROW_GAP), nw)
        x += w + _COL_GAP
    width = max(x - _COL_GAP + _MARGIN, 2 * _MARGIN + 90)
    height = height_inner + 2 * _MARGIN + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" role="img" viewBox="0 0 {width:.0f} '
        f'{height:.0f}" width="{width:.0f}" height="{height:.0f}" font-family="sans-serif" font-size="12">',
        "<title>The run's graph</title>",
        '<defs><marker id="gf-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/>'
        "</marker></defs>",
    ]
    for k, e in enumerate(plan.edges):
        parts.append(_edge(e, box, k))
    nodes: Mapping[str, Any] = description.get("nodes") or {}
    starts = _starts(sorted(box), plan.edges, description.get("default_start_node"))
    for n in plan.order:
        parts.append(_node(n, box[n], states.get(n, "pending"), nodes.get(n) or {}, n in starts))
    parts.append("</svg>")
    return "".join(parts)


def _node(name: str, at: tuple[float, float, float], state: str, node: Mapping[str, Any], start: bool) -> str:
    x, y, w = at
    fill, stroke = STATE_COLOURS.get(state, STATE_COLOURS["pending"])
    activation = node.get("activation")
    extra = f" (activation: {activation})" if activation not in (None, "all") else ""
    title = f"{name}: {state}{extra}{' (start)' if start else ''}"
    body = [
        f'<g class="node state-{esc(state)}" data-node="{esc(name)}" data-state="{esc(state)}">',
        f"<title>{esc(title)}</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{_NODE_H}" rx="6" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="{2.5 if start else 1.5}"/>',
        f'<text x="{x + w / 2:.1f}" y="{y + 17:.1f}" text-anchor="middle" font-weight="bold">'
        f"{esc(short(name))}</text>",
        f'<text x="{x + w / 2:.1f}" y="{y + 32:.1f}" text-anchor="middle" font-size="10" fill="#374151">'
        f"{esc(state + _ANY if activation == 'any' else state)}</text>",
        "</g>",
    ]
    return "".join(body)


def _edge(e: Edge, box: Mapping[str, tuple[float, float, float]], k: int) -> str:
    sx, sy, sw = box[e.source]
    tx, ty, tw = box[e.target]
    if e.source == e.target:  # a self-loop: a curl above the node
        x0, x1, y0 = sx + sw * 0.35, sx + sw * 0.65, sy
        d = f"M{x0:.1f},{y0:.1f} C{x0 - 10:.1f},{y0 - 34:.1f} {x1 + 10:.1f},{y0 - 34:.1f} {x1:.1f},{y0:.1f}"
        lx, ly = (x0 + x1) / 2, y0 - 30
    elif e.back:  # against the layering: a curve below both nodes
        x0, y0 = sx + sw / 2, sy + _NODE_H
        x1, y1 = tx + tw / 2, ty + _NODE_H
        dip = max(y0, y1) + 30 + 6 * (k % 4)
        d = f"M{x0:.1f},{y0:.1f} C{x0:.1f},{dip:.1f} {x1:.1f},{dip:.1f} {x1:.1f},{y1:.1f}"
        lx, ly = (x0 + x1) / 2, dip - 4
    else:
        x0, y0 = sx + sw, sy + _NODE_H / 2
        x1, y1 = tx, ty + _NODE_H / 2
        mid = (x0 + x1) / 2
        d = f"M{x0:.1f},{y0:.1f} C{mid:.1f},{y0:.1f} {mid:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"
        lx, ly = mid, (y0 + y1) / 2 - 4
    kind = "edge back" if e.back else "edge"
    out = [
        f'<g class="{kind}" data-source="{esc(e.source)}" data-target="{esc(e.target)}">',
        f"<title>{esc(f'{e.source} -> {e.target}' + (f': {e.label}' if e.label else ''))}</title>",
        f'<path d="{d}" fill="none" stroke="#6b7280" stroke-width="1.3" '
        f'{_DASHED if e.back else ""}marker-end="url(#gf-arrow)"/>',
    ]
    if e.label:
        out.append(
            f'<text class="edge-label" x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" font-size="10" '
            f'fill="#1f2937">{esc(short(e.label, 36))}</text>'
        )
    out.append("</g>")
    return "".join(out)
