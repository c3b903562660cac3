"""The pictures of the run page: each node's state, the graph drawn with those states, and the
timeline of the run's attempts (one lane per node).

Read-only: one consistent read of the run's log (:meth:`Store.load`, every row checked), then its
input requests, the deaths of its drivers and the lease clock; never a lease, never a write. The markup is built here, every text escaped
(node names, conditions, errors and prompts come from users), with no script, no event attribute
and no external reference.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from graphflow_durable._model.history import StepInfo, step_infos
from graphflow_durable._model.human import InputRequest
from graphflow_durable._model.records import RunLog, RunRecord
from graphflow_durable._storage.deaths import Death
from graphflow_durable._storage.lease import HELD, lease_state
from graphflow_durable.store import Store
from graphflow_durable.ui._layout import esc, graph_svg, layout, short

__all__ = ["OUTCOMES", "STATES", "Attempt", "RunPictures", "node_states", "run_pictures", "run_states"]

#: Every state a node is drawn in.
STATES = ("pending", "running", "waiting", "done", "failed", "backoff", "cancelled")
#: Every outcome an attempt's bar is drawn with: ``retried`` failed and ran again (or will, after
#: its back-off); ``interrupted`` stopped with its process or an interrupt and ran again on resume;
#: ``waiting`` parked the run on a request for a person (it runs again with the answer).
OUTCOMES = ("done", "failed", "retried", "cancelled", "running", "interrupted", "waiting")

_OUTCOME_COLOURS = {
    "done": "#16a34a",
    "failed": "#dc2626",
    "retried": "#f97316",
    "cancelled": "#6b7280",
    "running": "#2563eb",
    "interrupted": "#a855f7",
    "waiting": "#d97706",
}


@dataclass(frozen=True)
class RunPictures:
    """What the run page draws: ``states`` (node name -> one of :data:`STATES`), and the graph and
    timeline as inline ``<svg>`` markup, safe to insert as it is (every text escaped)."""

    states: dict[str, str]
    graph_svg: str
    timeline_svg: str


@dataclass(frozen=True)
class Attempt:
    """One execution of a node's turn as the timeline draws it (epoch seconds)."""

    node: str
    attempt: int
    start: float
    end: float
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class _Mark:
    """A span drawn thin on a node's lane (``kind``: ``backoff`` or ``wait``)."""

    node: str
    kind: str
    start: float
    end: float
    detail: str


def run_pictures(store: Store, run_id: str, *, now: float | None = None) -> RunPictures:
    """The node states, the graph and the timeline of ``run_id`` as stored now (``now``: the time
    a running attempt's bar reaches, default this host's clock).

    Raises:
        RunNotFoundError: no such run.
    """
    log = store.load(run_id)
    requests = store.requests.of_run(run_id)
    pending = [r for r in requests if r.status == "pending"]
    deaths = store.driver_deaths(run_id)
    lease = lease_state(log.run, store.lease_clock())
    at = time.time() if now is None else now
    infos = step_infos(log)
    held = lease in (None, HELD)  # a run whose driver is gone or whose lease ran out is not driven
    states = node_states(log, infos, pending, held=held)
    plan = layout(log.run.graph)
    failed = {n for n, state in states.items() if state == "failed"}
    attempts, marks = _attempts(log, infos, at, failed, held=held)
    marks += _waits(requests, log.run, at)
    timeline = _timeline_svg(log.run, plan.order, attempts, marks, infos, (deaths, lease), at)
    return RunPictures(states, graph_svg(log.run.graph, states, plan), timeline)


def run_states(store: Store, run_id: str) -> dict[str, str]:
    """Each node of ``run_id``'s graph -> its state (what :func:`run_pictures` draws them in), read
    from the run's steps only (:meth:`Store.load_steps`): what a live page's update needs.

    Raises:
        RunNotFoundError: no such run.
    """
    log = store.load_steps(run_id)
    pending = [r for r in store.requests.of_run(run_id) if r.status == "pending"]
    held = lease_state(log.run, store.lease_clock()) in (None, HELD)
    return node_states(log, step_infos(log), pending, held=held)


def _in_flight(scheduler: Mapping[str, Any] | None) -> set[str]:
    """The nodes in flight at the head, by its stored cursor."""
    if not isinstance(scheduler, Mapping):
        return set()
    found: set[str] = set()
    for key in ("attempts", "dispatch_step", "dispatches"):
        value = scheduler.get(key)
        if isinstance(value, Mapping):
            found.update(str(n) for n in value)
    return found


def node_states(
    log: RunLog, infos: Sequence[StepInfo], pending: Sequence[InputRequest], *, held: bool = True
) -> dict[str, str]:
    """Each node of the run's graph -> its state in the current round (one of :data:`STATES`).
    ``held``: whether a live driver holds the run's lease (else its turns in flight wait for a
    takeover: ``pending``)."""
    run = log.run
    last: dict[str, str] = {}  # node -> what the current round last did with it
    for step, info in zip(log.steps, infos, strict=True):
        if info.kind in ("start", "reset"):
            last = {}
        if info.kind == "complete" and info.node:
            last[info.node] = "done"
        elif info.kind == "attempt_failed" and info.node:
            last[info.node] = "backoff" if "retry_at" in step.data else "failed"
        for name in info.dispatched:
            last[name] = "dispatched"
    scheduler = log.scheduler if isinstance(log.scheduler, Mapping) else {}
    flying = _in_flight(scheduler)
    retry_at = scheduler.get("retry_at")
    backing: Mapping[str, Any] = retry_at if isinstance(retry_at, Mapping) else {}
    asking = {r.node for r in pending if r.status == "pending"}
    result = run.result if isinstance(run.result, Mapping) else {}
    failure = result.get("node_failed") if isinstance(result.get("node_failed"), Mapping) else {}
    failed_node = failure.get("node") if failure else None
    states: dict[str, str] = {}
    for name in sorted(str(n) for n in (run.graph.get("nodes") or {})):
        did = last.get(name)
        if run.status == "cancelled":
            state = "done" if did == "done" else "cancelled"
        elif name in asking:  # a run failed on a request's deadline still takes a late answer
            state = "failed" if run.status == "failed" else "waiting"
        elif name == failed_node or (did == "failed" and run.status == "failed"):
            state = "failed"
        elif name in flying or did == "dispatched":
            if name in backing or (did == "backoff" and name in flying):
                state = "backoff"
            else:
                state = "running" if run.status == "running" and held else "pending"
        elif did == "done":
            state = "done"
        elif did == "backoff":
            state = "backoff" if run.status in ("running", "interrupted") else "pending"
        else:
            state = "pending"
        states[name] = state
    return states


@dataclass
class _Open:
    attempt: int
    start: float
    planned: bool = False  # a retry after a back-off, not begun yet


def _attempts(
    log: RunLog, infos: Sequence[StepInfo], now: float, failed: set[str], *, held: bool = True
) -> tuple[list[Attempt], list[_Mark]]:
    """The attempts of every node, from its dispatch to its completion, failure or interruption;
    and the back-offs between a failed attempt and the next. ``failed``: the nodes the run failed
    on (an attempt of theirs still open at the end is a failed one)."""
    run = log.run
    done: list[Attempt] = []
    marks: list[_Mark] = []
    open_: dict[str, _Open] = {}
    previous = run.created_at
    for step, info in zip(log.steps, infos, strict=True):
        t = info.time
        node = info.node
        if info.kind in ("start", "reset"):
            for name, left in sorted(open_.items()):
                if not left.planned:
                    done.append(
                        Attempt(
                            name, left.attempt, left.start, previous, "interrupted", "left at a new round"
                        )
                    )
            open_ = {}
        if info.kind == "complete" and node:
            o = open_.pop(node) if node in open_ else None
            n = info.attempt or (o.attempt if o else 1)
            start = min(o.start, t) if o else t
            detail = "answer supplied by an operator" if info.supplied else ""
            done.append(Attempt(node, n, start, t, "done", detail))
        elif info.kind == "attempt_failed" and node:
            o = open_.pop(node) if node in open_ else None
            n = info.attempt or (o.attempt if o else 1)
            start = o.start if o else t
            if info.elapsed is not None:
                start = t - info.elapsed
            retry_at = step.data.get("retry_at")
            error = f"{info.error_type}: {(info.error or '').strip().splitlines()[0] if info.error else ''}"
            if isinstance(retry_at, (int, float)) and not isinstance(retry_at, bool):
                done.append(Attempt(node, n, start, t, "retried", error))
                marks.append(_Mark(node, "backoff", t, float(retry_at), f"back-off before attempt {n + 1}"))
                open_[node] = _Open(n + 1, max(float(retry_at), t), planned=True)
            else:
                done.append(Attempt(node, n, start, t, "failed", error))
        elif info.kind == "wait":
            for name, left in sorted(open_.items()):
                if not left.planned:
                    done.append(
                        Attempt(name, left.attempt, left.start, t, "waiting", "parked: waits for a person")
                    )
                    open_[name] = _Open(left.attempt + 1, t, planned=True)
        for name in info.dispatched:
            o = open_.get(name)
            if info.kind == "resume" and o is not None:
                if not o.planned:
                    end = max(previous, o.start)  # the last sign of life before the resume
                    done.append(Attempt(name, o.attempt, o.start, end, "interrupted", "ran again on resume"))
                    open_[name] = _Open(o.attempt + 1, t)
                else:
                    open_[name] = _Open(o.attempt, max(o.start, t))
            elif info.kind == "resume":
                open_[name] = _Open(1, t)
            else:
                if o is not None and not o.planned:
                    done.append(Attempt(name, o.attempt, o.start, t, "interrupted", "dispatched again"))
                open_[name] = _Open(1, t)
        previous = t
    for name, o in sorted(open_.items()):
        if o.planned and run.status != "running":
            continue
        if o.planned and o.start > now:
            continue
        if run.status == "running" and held:
            done.append(Attempt(name, o.attempt, o.start, max(now, o.start), "running"))
        elif run.status == "running":
            gone = "its driver is gone: a takeover runs it again"
            done.append(Attempt(name, o.attempt, o.start, max(previous, o.start), "interrupted", gone))
        elif run.status == "cancelled":  # to the driver's last commit: when it stopped
            end = max(previous, o.start)
            done.append(
                Attempt(name, o.attempt, o.start, end, "cancelled", "dispatched, then the run was cancelled")
            )
        else:
            outcome = "failed" if name in failed and run.status == "failed" else "interrupted"
            done.append(
                Attempt(name, o.attempt, o.start, max(previous, o.start), outcome, f"the run {run.status}")
            )
    return done, marks


def _waits(requests: Sequence[InputRequest], run: RunRecord, now: float) -> list[_Mark]:
    """A person's wait per request: asked to answered (to now while pending)."""
    out = []
    for r in requests:
        if r.answered_at is not None:
            end, how = r.answered_at, f"answered ({r.answered_by or 'respond'})"
        elif r.status == "pending":
            end, how = (now if run.status in ("waiting", "running") else run.updated_at), "pending"
        else:
            end, how = run.updated_at, r.status
        detail = f"{r.request_id} asks {short(r.prompt, 80)!r}: {how}"
        out.append(_Mark(r.node, "wait", r.created_at, max(end, r.created_at), detail))
    return out


# The timeline's drawing.

_LABEL_W = 150
_PLOT_W = 760
_LANE_H = 26
_AXIS_H = 34
_PAD = 12
_NICE = (1, 2, 5)
_LEGEND_H = 18


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _tick_step(span: float) -> float:
    raw = span / 8
    scale = 10.0 ** _floor_log10(raw)
    for k in _NICE:
        if k * scale >= raw:
            return k * scale
    return 10 * scale


def _floor_log10(x: float) -> int:
    n = 0
    while x >= 10:
        x /= 10
        n += 1
    while x < 1:
        x *= 10
        n -= 1
    return n


def _timeline_svg(
    run: RunRecord,
    order: Sequence[str],
    attempts: Sequence[Attempt],
    marks: Sequence[_Mark],
    steps: Sequence[StepInfo],
    drivers: tuple[Sequence[Death], str | None],
    now: float,
) -> str:
    deaths = drivers[0]
    lanes = ["(driver)", *order]
    extra = sorted({a.node for a in attempts} - set(order))
    lanes += extra
    t0 = run.created_at
    t1 = max(
        [
            t0,
            run.updated_at,
            *(a.end for a in attempts),
            *(m.end for m in marks),
            *(d.died_at for d in deaths),
        ]
    )
    if run.status == "running":
        t1 = max(t1, now)
    span = max(t1 - t0, 1e-3)

    def x(t: float) -> float:
        return _LABEL_W + (min(max(t, t0), t1) - t0) / span * _PLOT_W

    width = _LABEL_W + _PLOT_W + 2 * _PAD
    bottom = _AXIS_H + len(lanes) * _LANE_H
    height = bottom + _LEGEND_H + _PAD
    lane_y = {name: _AXIS_H + i * _LANE_H for i, name in enumerate(lanes)}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f"<title>{esc(f'Timeline of run {run.run_id} from {_iso(t0)} to {_iso(t1)}')}</title>",
    ]
    step = _tick_step(span)
    parts.append('<g class="axis">')
    k = 0
    while k * step <= span * 1.0001:
        tx = _LABEL_W + k * step / span * _PLOT_W
        label = _iso(t0)[11:23] + " UTC" if k == 0 else "+" + _span(k * step)
        parts.append(
            f'<line x1="{tx:.1f}" y1="{_AXIS_H - 6}" x2="{tx:.1f}" y2="{bottom}" stroke="#e5e7eb"/>'
            f'<text x="{tx:.1f}" y="{_AXIS_H - 10}" text-anchor="middle" fill="#4b5563">{esc(label)}</text>'
        )
        k += 1
    parts.append("</g>")
    for name in lanes:
        y = lane_y[name]
        parts.append(
            f'<g class="lane" data-lane="{esc(name)}"><rect x="0" y="{y}" width="{width}" height="{_LANE_H}" '
            f'fill="{"#f9fafb" if lanes.index(name) % 2 else "#ffffff"}"/>'
            f'<text x="{_PAD}" y="{y + _LANE_H / 2 + 4:.1f}" fill="#111827">{esc(short(name, 20))}'
            f"<title>{esc(name)}</title></text></g>"
        )
    for info in steps:  # where each round began (a new task, or a reset's fresh start)
        if info.kind in ("start", "reset"):
            what = f"round {info.round}" if info.kind == "start" else "reset"
            rx = x(info.time)
            parts.append(
                f'<line class="round" data-kind="{info.kind}" x1="{rx:.1f}" y1="{_AXIS_H}" x2="{rx:.1f}" '
                f'y2="{bottom}" stroke="#9ca3af" stroke-width="1"><title>{esc(f"{what} began at step {info.seq}, {_iso(info.time)}")}</title></line>'
            )
    parts.extend(_drivers(run, steps, drivers, lane_y["(driver)"], bottom, x))
    for m in sorted(marks, key=lambda m: (m.node, m.start, m.kind)):
        if m.node not in lane_y:
            continue
        y = lane_y[m.node]
        colour = "#fb923c" if m.kind == "backoff" else "#fbbf24"
        x0, x1 = x(m.start), x(m.end)
        parts.append(
            f'<rect class="mark {m.kind}" data-node="{esc(m.node)}" data-kind="{m.kind}" x="{x0:.1f}" '
            f'y="{y + _LANE_H - 8}" width="{max(x1 - x0, 2):.1f}" height="5" fill="{colour}" '
            f'stroke="{colour}" stroke-dasharray="3 2"><title>{esc(f"{m.node}: {m.detail}, {_iso(m.start)} to {_iso(m.end)} ({_span(m.end - m.start)})")}'
            "</title></rect>"
        )
    for a in sorted(attempts, key=lambda a: (a.node, a.start, a.attempt)):
        y = lane_y[a.node]
        x0, x1 = x(a.start), x(a.end)
        title = f"{a.node} attempt {a.attempt}: {a.outcome}, {_iso(a.start)} to {_iso(a.end)} ({_span(a.end - a.start)})"
        if a.detail:
            title += f"; {a.detail}"
        parts.append(
            f'<rect class="bar outcome-{a.outcome}" data-node="{esc(a.node)}" data-attempt="{a.attempt}" '
            f'data-outcome="{a.outcome}" x="{x0:.1f}" y="{y + 4}" width="{max(x1 - x0, 3):.1f}" '
            f'height="{_LANE_H - 14}" rx="2" fill="{_OUTCOME_COLOURS[a.outcome]}"><title>{esc(title)}</title></rect>'
        )
    parts.append(_legend(bottom + 6))
    parts.append("</svg>")
    return "".join(parts)


def _legend(y: int) -> str:
    """What the colours and marks mean, in one row under the lanes."""
    keys = [(f"outcome-{o}", o, _OUTCOME_COLOURS[o], 10) for o in OUTCOMES]
    keys += [("backoff", "back-off", "#fb923c", 5), ("wait", "waits for a person", "#fbbf24", 5)]
    out, x = ['<g class="legend">'], float(_LABEL_W)
    for css, words, colour, h in keys:
        out.append(
            f'<rect class="legend-{css}" x="{x:.0f}" y="{y + (10 - h) / 2:.1f}" width="14" height="{h}" '
            f'fill="{colour}"/><text x="{x + 18:.0f}" y="{y + 9}" fill="#374151">{esc(words)}</text>'
        )
        x += 26 + len(words) * 6
    out.append(
        f'<line x1="{x:.0f}" y1="{y - 2}" x2="{x:.0f}" y2="{y + 12}" stroke="#dc2626" stroke-dasharray="4 3"/>'
        f'<text x="{x + 6:.0f}" y="{y + 9}" fill="#374151">takeover</text></g>'
    )
    return "".join(out)


def _drivers(
    run: RunRecord,
    steps: Sequence[StepInfo],
    drivers: tuple[Sequence[Death], str | None],
    y: int,
    bottom: int,
    x: Any,
) -> list[str]:
    """The driver lane, as far as the store knows who drove: each driver that died (a takeover
    recorded it), from the stretch's start to its last commit (the run's head when it was taken
    over), then nobody until the takeover; since the last takeover, the driver that took over (to
    the last step), or the lease's holder now (from its attach: the last ``start`` or ``resume``).
    A line across every lane marks each takeover."""
    deaths, lease = drivers
    out = []
    times = {s.seq: s.time for s in steps}
    last = steps[-1].time if steps else run.created_at
    start = run.created_at
    stretches: list[tuple[float, float, str, str]] = []  # start, end, driver ("": nobody), what
    for d in sorted(deaths, key=lambda d: (d.died_at, d.head_seq)):
        alive = min(max(times.get(d.head_seq, d.died_at), start), d.died_at)
        who = f"pid {d.pid} on {d.host}"
        stretches.append((start, alive, who, f"drove the run; its last commit was step {d.head_seq}"))
        stretches.append((alive, d.died_at, "", f"nobody: {who} was dead or stalled until the takeover"))
        start = d.died_at
    if run.lease_owner is not None:
        attach = max([start, *(s.time for s in steps if s.kind in ("start", "resume"))])
        holder = f"{run.lease_owner} (pid {run.lease_pid} on {run.lease_host})"
        how = "holds the lease now" if lease == HELD else f"holds the lease, {lease}: nobody drives the run"
        stretches.append((attach, max(last, attach, run.updated_at), holder, how))
    elif deaths:
        stretches.append((start, max(last, start), "the driver that took over", "it released the lease"))
    for s, e, who, what in stretches:
        x0, x1 = x(s), x(e)
        kind, fill = ("driver", "#e0e7ff") if who else ("no-driver", "#fee2e2")
        title = f"{who}: {what}" if who else what
        out.append(
            f'<rect class="{kind}" data-kind="{kind}" data-driver="{esc(who)}" x="{x0:.1f}" y="{y + 5}" '
            f'width="{max(x1 - x0, 2):.1f}" height="{_LANE_H - 10}" fill="{fill}" stroke="#6366f1">'
            f"<title>{esc(f'{title} ({_iso(s)} to {_iso(e)})')}</title></rect>"
        )
        if who and x1 - x0 > 60:
            out.append(
                f'<text x="{x0 + 4:.1f}" y="{y + _LANE_H / 2 + 4:.1f}" font-size="10" fill="#3730a3">'
                f"{esc(short(who, max(int((x1 - x0) / 6), 4)))}</text>"
            )
    for d in deaths:
        xd = x(d.died_at)
        out.append(
            f'<line class="takeover" data-kind="takeover" x1="{xd:.1f}" y1="{y}" x2="{xd:.1f}" '
            f'y2="{bottom}" stroke="#dc2626" stroke-width="1.5" stroke-dasharray="4 3">'
            f"<title>{esc(f'driver pid {d.pid} on {d.host} died; the run was taken over at {_iso(d.died_at)}')}"
            "</title></line>"
        )
    return out
