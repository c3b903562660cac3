"""The checks that need the graph: the saved scheduler, buffers and bookkeeping against the thread."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from autogen_agentchat.teams import DiGraph

from graphflow_durable._integrity.codes import pointer
from graphflow_durable._integrity.derive import Derived
from graphflow_durable._integrity.read import MANAGER, Parsed, sources
from graphflow_durable._model.records import ENDED_STATUSES, RUN_STATUSES
from graphflow_durable.errors import GraphMismatchError, UnrepairableStateError
from graphflow_durable.scheduler import GraphSpec, SchedulerState

__all__ = ["check_graph", "check_participants", "check_against_thread"]

M = pointer("agent_states", MANAGER)
X = M + "/graphflow_durable"


def check_graph(p: Parsed, graph: DiGraph, fingerprint: str | None) -> bool:
    """Is this the state's graph at all? Adds GFD010 and sets the refusal if not; returns ok."""
    nodes, names = set(graph.nodes), set(p.participants)
    stored = p.ext.get("graph_fingerprint") if p.ext is not None else None
    if fingerprint and isinstance(stored, str) and stored and stored != fingerprint:
        message = (
            f"the state was saved with graph fingerprint {stored[:12]}..., "
            f"the given graph has {fingerprint[:12]}..."
        )
    elif (edges := _edge_difference(p, graph)) is not None:
        message = edges
    elif nodes - names and names - nodes:
        message = (
            f"the state has participants {sorted(names)} and the graph has nodes {sorted(nodes)}: "
            f"{sorted(nodes - names)} have no saved state and {sorted(names - nodes)} are not in the graph"
        )
    else:
        return True
    p.add("GFD010-different-graph", "/agent_states", message + "; use the graph the state was saved with")
    run_id = p.ext.get("run_id") if p.ext is not None else None
    p.refusal = p.refusal or GraphMismatchError(
        f"the state belongs to a different graph: {message}",
        run_id=run_id if isinstance(run_id, str) else None,
        differences=[message],
    )
    return False


def _edge_difference(p: Parsed, graph: DiGraph) -> str | None:
    """GraphFlow saves a count for every (target, activation group) of the graph's edges."""
    if p.remaining is None:
        return None
    have = {f"{t}/{g}" for t, gs in p.remaining.items() for g in gs}
    want = {f"{t}/{g}" for t, gs in graph.get_remaining_map().items() for g in gs}
    if have == want:
        return None
    return (
        "the state's remaining counts are for edge targets/groups "
        f"{sorted(have)}, the graph's edges give {sorted(want)}"
    )


def check_participants(p: Parsed, graph: DiGraph) -> None:
    for name in graph.nodes:
        if name not in p.participants:
            message = (
                f"graph node {name!r} has no saved participant state; repair cannot invent its agent state"
            )
            where = pointer("agent_states", name)
            p.add("GFD101-participant-missing", where, message)
            p.refusal = p.refusal or UnrepairableStateError(
                message, code="GFD101-participant-missing", pointer=where, node=name
            )
    for name in p.participants:
        if name not in graph.nodes:
            p.add(
                "GFD102-extra-participant",
                pointer("agent_states", name),
                f"participant {name!r} is not a graph node: it never speaks; repair keeps it as is",
            )


def check_against_thread(p: Parsed, spec: GraphSpec, d: Derived) -> None:
    """Compare what the state says with what the thread explains."""
    _check_names(p, spec)
    if p.ext_sched is not None:
        _check_durable(p, spec, d)
    else:
        _check_legacy(p, spec, d)
    _check_buffers(p, d)


def _check_names(p: Parsed, spec: GraphSpec) -> None:
    def unknown_nodes(names: Iterable[str], where: str, what: str) -> None:
        bad = sorted({n for n in names if n not in spec.edges})
        if bad:
            p.add(
                "GFD208-unknown-node",
                where,
                f"{what} names {bad}, which are not graph nodes; repair drops them",
            )

    def unknown_groups(table: Mapping[str, Mapping[str, Any]] | None, where: str, what: str) -> None:
        if table is None:
            return
        unknown_nodes(table, where, what)
        bad = sorted(
            f"{t}/{g}"
            for t, gs in table.items()
            if t in spec.edges
            for g in gs
            if g not in spec.activation.get(t, {})
        )
        if bad:
            p.add("GFD208-unknown-node", where, f"{what} has activation groups {bad} the graph does not have")

    unknown_nodes(p.ready or [], M + "/ready", "ready")
    unknown_groups(p.remaining, M + "/remaining", "remaining")
    unknown_groups(p.enqueued_any, M + "/enqueued_any", "enqueued_any")
    if p.ext_sched is not None:
        unknown_nodes(p.ext_sched.in_flight, X + "/scheduler/in_flight", "in_flight")
        unknown_nodes(p.ext_sched.triggered, X + "/scheduler/triggered", "triggered")


def _counts(
    p: Parsed, spec: GraphSpec, actual: Mapping[str, Mapping[str, int]], d: Derived, where: str
) -> None:
    expected = d.sched.remaining
    wrong: list[str] = []
    impossible: list[str] = []
    for target, groups in expected.items():
        for group, count in groups.items():
            have = actual.get(target, {}).get(group)
            if have == count:
                continue
            entry = f"{target}/{group}: {have} (thread says {count})"
            origin = spec.origin_remaining.get(target, {}).get(group, 0)
            (impossible if have is not None and have > origin else wrong).append(entry)
    if impossible:
        p.add(
            "GFD205-impossible-counter",
            where,
            "remaining counts above the number of edges into their group: "
            + ", ".join(impossible)
            + "; repair rebuilds them from the thread",
        )
    if wrong:
        p.add(
            "GFD206-remaining-mismatch",
            where,
            "remaining disagrees with the thread: "
            + ", ".join(wrong)
            + "; repair rebuilds it from the thread",
        )


def _flags(p: Parsed, actual: Mapping[str, Mapping[str, bool]], d: Derived, where: str) -> None:
    wrong = [
        f"{t}/{g}: {actual.get(t, {}).get(g)} (thread says {f})"
        for t, gs in d.sched.enqueued_any.items()
        for g, f in gs.items()
        if actual.get(t, {}).get(g) != f
    ]
    if wrong:
        p.add(
            "GFD207-enqueued-mismatch",
            where,
            "enqueued_any disagrees with the thread: " + ", ".join(wrong) + "; repair rebuilds it",
        )


def _flying(d: Derived) -> str:
    return ", ".join(f"{n!r} (dispatched at message {d.dispatches[n][-1]})" for n in d.sched.in_flight)


def _check_legacy(p: Parsed, spec: GraphSpec, d: Derived) -> None:
    s = d.sched
    if p.ready is not None:
        have = Counter(p.ready)
        if have == Counter(s.in_flight + s.ready):
            pass
        elif not p.ready:
            p.add(
                "GFD201-zombie-ready-empty",
                M + "/ready",
                f"ready is empty but {_flying(d)} had not answered: the state was saved while agents "
                "ran (autogen #7043) and GraphFlow would stop as 'complete'; repair puts them back in "
                "flight so they run again",
            )
        elif have == Counter(s.ready) and s.in_flight:
            p.add(
                "GFD202-lost-in-flight",
                M + "/ready",
                f"{_flying(d)} never answered and is not in ready: plain GraphFlow would never run it "
                "again; repair puts it back in flight",
            )
        else:
            p.add(
                "GFD203-ready-mismatch",
                M + "/ready",
                f"ready is {p.ready} but the thread says in flight {list(s.in_flight)}, ready "
                f"{list(s.ready)}; repair sets them from the thread",
            )
    if p.remaining is not None:
        _counts(p, spec, p.remaining, d, M + "/remaining")
    if p.enqueued_any is not None:
        _flags(p, p.enqueued_any, d, M + "/enqueued_any")
    for node in s.ready:
        groups = s.triggered.get(node, ())
        if groups and _on_cycle(spec, node):
            p.add(
                "GFD301-loop-cannot-rearm",
                M + "/ready",
                f"loop node {node!r} is queued by activation groups {list(groups)}, which a plain state does "
                f"not record: when {node!r} speaks its counters are not re-armed and the loop stops at the "
                "next pass; repair records the triggered groups",
            )
    if d.finished and p.ready:
        p.add(
            "GFD211-finished-restarts",
            M + "/ready",
            f"the run finished; GraphFlow reset ready to the start nodes {p.ready}, so continuing it "
            "without a new task runs the whole graph again; repair marks the run finished",
        )


def _check_durable(p: Parsed, spec: GraphSpec, d: Derived) -> None:
    have, s = p.ext_sched, d.sched
    assert have is not None
    if Counter(have.in_flight) != Counter(s.in_flight) or Counter(have.ready) != Counter(s.ready):
        code = "GFD202-lost-in-flight" if set(s.in_flight) - set(have.in_flight) else "GFD203-ready-mismatch"
        p.add(
            code,
            X + "/scheduler",
            f"the scheduler has in flight {list(have.in_flight)}, ready {list(have.ready)}; the thread says "
            f"in flight {list(s.in_flight)}, ready {list(s.ready)}; repair sets them from the thread",
        )
    _counts(p, spec, have.remaining, d, X + "/scheduler/remaining")
    _flags(p, have.enqueued_any, d, X + "/scheduler/enqueued_any")
    if _triggered(have) != _triggered(s):
        p.add(
            "GFD302-triggered-mismatch",
            X + "/scheduler/triggered",
            f"triggered is {_triggered(have)} but the thread says {_triggered(s)}; "
            "repair sets it from the thread",
        )
    ext = p.ext or {}
    stored = ext.get("dispatches")
    if isinstance(stored, Mapping):
        expected = {n: list(v[-2:]) for n, v in d.dispatches.items()}
        if {n: list(v) for n, v in stored.items()} != expected:
            p.add(
                "GFD403-bookkeeping-invalid",
                X + "/dispatches",
                f"dispatches is {dict(stored)} but the thread says {expected}; repair recomputes it",
            )
    status = ext.get("status")
    if (status in ENDED_STATUSES and s.in_flight) or (
        status in RUN_STATUSES and status != "finished" and d.finished
    ):
        p.add(
            "GFD402-status-mismatch",
            X + "/status",
            f"status is {status!r} but the thread "
            f"{'ends at the graph end' if d.finished else 'has nodes in flight'}; repair corrects it",
        )


def _triggered(s: SchedulerState) -> dict[str, list[str]]:
    return {n: sorted(g) for n, g in s.triggered.items() if g}


def _on_cycle(spec: GraphSpec, node: str) -> bool:
    seen: set[str] = set()
    stack = [e.target for e in spec.edges.get(node, ())]
    while stack:
        current = stack.pop()
        if current == node:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(e.target for e in spec.edges.get(current, ()))
    return False


def _check_buffers(p: Parsed, d: Derived) -> None:
    for name in p.participants:
        entry = p.agent_states[name]
        expected = d.buffers.get(name)
        if expected is None:
            continue
        for key, want in (("message_buffer", expected.buffer), ("deferred_buffer", expected.deferred)):
            have = entry.get(key, [])
            if isinstance(have, list) and list(have) == list(want):
                continue
            if key == "deferred_buffer" and not want:
                what = "holds messages but the participant is not in flight"
            elif key not in entry:
                what = f"is absent; the thread says {sources(list(want))}"
            else:
                what = (
                    f"holds {sources(have) if isinstance(have, list) else have!r}, the thread says "
                    f"{sources(list(want))}"
                )
            p.add(
                "GFD103-buffer-mismatch",
                pointer("agent_states", name, key),
                f"{name!r} {key} {what}; repair rebuilds it from the thread",
            )
