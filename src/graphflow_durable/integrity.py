"""Validate and repair saved GraphFlow team states -- pure functions, no I/O.

:func:`validate_state` reads a state saved by plain ``GraphFlow.save_state()`` (autogen-agentchat
0.4.9+) or by ``DurableGraphFlow`` and reports what is wrong with it: each :class:`Finding` has a
stable code, a severity, a JSON Pointer and a plain-language message (every code is documented in
docs/repair.md). :func:`repair_state` rebuilds the scheduler state by replaying the message thread
through the graph with :func:`graphflow_durable.scheduler.replay` -- the rules the durable manager
runs live -- puts the nodes that were running back in flight, rebuilds each participant's buffer
from the thread, and writes the durable format of docs/state-format.md. It never invents
progress: a thread the graph cannot explain is refused, naming the first message that does not fit.

Neither function mutates its argument. Repair is idempotent: repairing a repaired state changes
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autogen_agentchat.teams import DiGraph

from graphflow_durable._integrity.checks import check_against_thread, check_graph, check_participants
from graphflow_durable._integrity.codes import CODES, NEEDS_GRAPH, Finding, Severity
from graphflow_durable._integrity.derive import Derived, derive, extension
from graphflow_durable._integrity.read import MANAGER, Parsed, parse, sources
from graphflow_durable.errors import ReplayError, UnrepairableStateError
from graphflow_durable.scheduler import PLAIN_KEYS, GraphSpec

__all__ = [
    "CODES",
    "Change",
    "Finding",
    "RepairResult",
    "Severity",
    "ValidationReport",
    "repair_state",
    "validate_state",
]


@dataclass(frozen=True)
class ValidationReport:
    """What :func:`validate_state` found.

    Attributes:
        findings: every finding, in the order the checks ran.
        skipped: codes of the checks that were not run (they need the graph, or the state was too
            broken to get that far).
    """

    findings: tuple[Finding, ...]
    skipped: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing is wrong: no finding of severity ``"error"`` or ``"warning"``."""
        return not any(f.severity != "info" for f in self.findings)

    @property
    def codes(self) -> tuple[str, ...]:
        """The codes of the findings, in order (a code may repeat)."""
        return tuple(f.code for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON types: ``{"ok", "findings": [...], "skipped": [...]}``."""
        return {
            "ok": self.ok,
            "findings": [f.to_json() for f in self.findings],
            "skipped": list(self.skipped),
        }


@dataclass(frozen=True)
class Change:
    """One field :func:`repair_state` changed: where, and short readable summaries of before/after.

    Message lists are summarised by their sources (``['user', 'A']``), other values as compact JSON;
    ``"(absent)"`` marks a key that did not exist (before) or was removed (after).
    """

    pointer: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.pointer}: {self.before} -> {self.after}"

    def to_json(self) -> dict[str, str]:
        return {"pointer": self.pointer, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class RepairResult:
    """What :func:`repair_state` produced.

    Attributes:
        state: the repaired state (a new object; the input is untouched), in the durable format.
        report: the validation report of the *input* state.
        changes: the fields that differ between the input and ``state``.
    """

    state: dict[str, Any]
    report: ValidationReport
    changes: tuple[Change, ...]

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def validate_state(
    state: Mapping[str, Any], graph: DiGraph | None = None, *, graph_fingerprint: str | None = None
) -> ValidationReport:
    """Check a saved team state; with ``graph``, also against its message thread.

    Without a graph only the checks that need none run (shape, versions, an empty ready queue,
    negative counters, the durable section's own consistency); the others are listed in
    :attr:`ValidationReport.skipped`. ``graph_fingerprint``, when given, is compared with the one a
    durable state records.
    """
    p, _, skipped = _analyse(state, graph, graph_fingerprint)
    return ValidationReport(tuple(p.findings), skipped)


def repair_state(
    state: Mapping[str, Any], graph: DiGraph, *, graph_fingerprint: str | None = None
) -> RepairResult:
    """Rebuild a state from its thread and the graph, in the durable format.

    The plain keys become the view of the rebuilt scheduler (``ready`` = in-flight nodes, then the
    ready queue); the ``graphflow_durable`` section holds the scheduler, dispatch points, batch and
    round starts and status (``"finished"`` when the thread ends at the graph's natural end,
    otherwise ``"interrupted"``; a durable state's consistent status, run id, attempts and origin
    are kept). Every participant's ``message_buffer`` (and ``deferred_buffer`` when in flight) is
    rebuilt from the thread; its ``agent_state`` is kept as is; so is ``current_turn``.

    Raises:
        StateFormatError: the state has the wrong shape, an unknown version, or a thread entry that
            is not a message.
        GraphMismatchError: the state belongs to a different graph.
        UnrepairableStateError: the thread does not fit the graph (the message names the first
            message that does not), or a graph node has no saved participant state.
    """
    p, derived, _ = _analyse(state, graph, graph_fingerprint)
    if p.refusal is not None:
        raise p.refusal
    assert derived is not None  # no refusal means the thread was replayed
    repaired = _plain(state)
    if "type" not in repaired:
        repaired["type"] = "TeamState"
    if "version" not in repaired:
        repaired["version"] = "1.0.0"
    manager = repaired["agent_states"][MANAGER]
    manager.update(derived.sched.plain_view())
    manager["graphflow_durable"] = extension(p, derived, graph_fingerprint)
    for name in p.participants:
        entry = repaired["agent_states"][name]
        buffers = derived.buffers[name]
        entry["message_buffer"] = _plain(list(buffers.buffer))
        if buffers.deferred:
            entry["deferred_buffer"] = _plain(list(buffers.deferred))
        else:
            entry.pop("deferred_buffer", None)
    return RepairResult(repaired, ValidationReport(tuple(p.findings)), _changes(state, repaired, p))


def _analyse(
    state: Mapping[str, Any], graph: DiGraph | None, fingerprint: str | None
) -> tuple[Parsed, Derived | None, tuple[str, ...]]:
    p = parse(state)
    if graph is None:
        _zombie_without_graph(p)
        return p, None, NEEDS_GRAPH
    if p.thread is None or not p.manager:
        return p, None, NEEDS_GRAPH
    if not check_graph(p, graph, fingerprint):
        return p, None, tuple(c for c in NEEDS_GRAPH if c != "GFD010-different-graph")
    check_participants(p, graph)
    spec = GraphSpec.from_digraph(graph)
    try:
        derived = derive(spec, p)
    except ReplayError as exc:
        p.add(
            "GFD209-thread-unexplained",
            f"/agent_states/{MANAGER}/message_thread",
            f"{exc}; repair never invents progress, so this state cannot be repaired with this graph",
        )
        p.refusal = p.refusal or UnrepairableStateError(
            f"cannot repair: {exc}",
            code="GFD209-thread-unexplained",
            pointer=f"/agent_states/{MANAGER}/message_thread",
            node=exc.node,
        )
        return p, None, ()
    check_against_thread(p, spec, derived)
    # GraphFlow itself drives an "all" count below zero when a group's edges fire more often than
    # it has edges before its target speaks; a negative count the thread explains is not corruption.
    p.findings = [
        f
        for f in p.findings
        if not (
            f.code == "GFD204-negative-counter"
            and _explained(f.pointer, derived.sched.to_json()["remaining"])
        )
    ]
    return p, derived, ()


def _explained(pointer: str, remaining: Mapping[str, Mapping[str, int]]) -> bool:
    """Whether a ``.../remaining/<target>/<group>`` count below zero is what replay gives too."""
    *_, target, group = (t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/"))
    return remaining.get(target, {}).get(group, 0) < 0


def _zombie_without_graph(p: Parsed) -> None:
    if p.ready != []:
        return
    if p.ext_sched is not None and (p.ext_sched.in_flight or p.ext_sched.ready):
        return
    p.add(
        "GFD201-zombie-ready-empty",
        f"/agent_states/{MANAGER}/ready",
        "ready is empty, which GraphFlow never saves at rest: the state was saved while agents ran "
        "(autogen #7043) and resuming it stops at once as 'complete'; repair (with the graph) finds the "
        "nodes that were running and puts them back in flight",
    )


def _plain(value: Any) -> Any:
    """A deep copy as plain JSON containers (dict, list)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_ABSENT = object()


def _summary(value: Any, messages: bool = False) -> str:
    if value is _ABSENT:
        return "(absent)"
    if messages and isinstance(value, list) and all(isinstance(m, Mapping) for m in value):
        return repr(sources(value))
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], p: Parsed) -> tuple[Change, ...]:
    out: list[Change] = []

    def compare(where: str, old: Any, new: Any, messages: bool = False) -> None:
        if old is _ABSENT and new is _ABSENT:
            return
        if old is _ABSENT or new is _ABSENT or _plain(old) != new:
            out.append(Change(where, _summary(old, messages), _summary(new, messages)))

    for key in ("type", "version"):
        compare(f"/{key}", before.get(key, _ABSENT), after.get(key, _ABSENT))
    m_old, m_new = before["agent_states"][MANAGER], after["agent_states"][MANAGER]
    base = f"/agent_states/{MANAGER}"
    for key in PLAIN_KEYS:
        compare(f"{base}/{key}", m_old.get(key, _ABSENT), m_new.get(key, _ABSENT))
    ext_old, ext_new = m_old.get("graphflow_durable", _ABSENT), m_new["graphflow_durable"]
    if not isinstance(ext_old, Mapping):
        if ext_old is not _ABSENT:
            compare(f"{base}/graphflow_durable", ext_old, ext_new)
        ext_old = {}
    for key in sorted(set(ext_old) | set(ext_new)):
        if key == "scheduler" and not isinstance(ext_old.get(key), Mapping):
            for sub in ("in_flight", "ready", "triggered", "turn"):
                compare(f"{base}/graphflow_durable/scheduler/{sub}", _ABSENT, ext_new[key][sub])
            continue
        compare(f"{base}/graphflow_durable/{key}", ext_old.get(key, _ABSENT), ext_new.get(key, _ABSENT))
    for name in p.participants:
        for key in ("message_buffer", "deferred_buffer"):
            old = before["agent_states"][name].get(key, _ABSENT)
            new = after["agent_states"][name].get(key, _ABSENT)
            if key == "deferred_buffer" and old == [] and new is _ABSENT:
                continue
            compare(f"/agent_states/{name}/{key}", old, new, messages=True)
    return tuple(out)
