"""The manager's position in a run: scheduler state plus what resuming needs beyond it.

A :class:`Cursor` is a value. Each transition makes a new one; the head step of the store holds
its compact JSON (:meth:`Cursor.to_json`), and ``save_state()`` holds its full JSON
(:meth:`Cursor.extension`). Indexes are positions in the current message thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from graphflow_durable.errors import StateFormatError
from graphflow_durable.scheduler import GraphSpec, SchedulerState

__all__ = ["FORMAT", "Cursor", "without_one"]

FORMAT = 1


def _counts(name: str, counts: Mapping[str, Any], flying: Sequence[str]) -> dict[str, Any]:
    """``{name: values}`` of the nodes in flight (``flying``, sorted: counts, or back-off times), or
    nothing at all when none has one (so a run with no failure stores, and saves, exactly what it did
    before them)."""
    if not counts:  # the usual case, a run with no failure: nothing to look up
        return {}
    kept = {n: counts[n] for n in flying if counts.get(n)}
    return {name: kept} if kept else {}


#: The per-node maps of the in-flight turns, by key, with the type of their values (the compact
#: JSON and the saved state's extension write them alike).
_TURN_MAPS: dict[str, type[int] | type[str] | type[float] | type[tuple[str, ...]]] = {
    "attempts": int,
    "dispatch_step": int,
    "keys": str,
    "failures": int,
    "crashes": int,
    "crash_with": tuple,
    "retry_at": float,
}


def _turn_maps(data: Mapping[str, Any]) -> dict[str, Any]:
    """The per-node maps of ``data`` (absent ones empty), their values converted to their type."""
    return {name: {n: kind(v) for n, v in data.get(name, {}).items()} for name, kind in _TURN_MAPS.items()}


def without_one(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    """``items`` without its first occurrence of ``item``."""
    index = items.index(item)
    return items[:index] + items[index + 1 :]


@dataclass(frozen=True)
class Cursor:
    """Scheduler state, round and batch boundaries, and dispatch bookkeeping.

    Attributes:
        sched: the scheduler state.
        origin: absolute message sequence number where the current thread begins (moves on reset).
        round_start: thread index of the first message of the current round.
        batch_start: thread index of the first answer of the current batch.
        finished: whether the current round has ended (the next start begins a new round).
        dispatches: per node, the thread lengths at its last two dispatches.
        attempts: per in-flight node, how many times this turn has been dispatched.
        dispatch_step: per in-flight node, the head sequence number that first dispatched this turn.
        stopped: the round was ended by a stop (termination condition, max turns, external
            termination) rather than by the graph's natural end: the scheduler state is kept and
            the next round continues it, as GraphFlow does.
        keys: per in-flight node whose turn began in another run (a state moved by
            ``save_state()``/``load_state()``), the idempotency key it had there.
        failures: per in-flight node, how many attempts of this turn raised or timed out (what a
            retry policy's ``max_attempts`` counts).
        crashes: per in-flight node, how many attempts of this turn died with their process (what
            ``max_crash_attempts`` counts). Both are committed, so a crash never resets them; a new
            turn starts both at zero, and :meth:`fresh_budget` clears them.
        crash_with: per in-flight node whose turn crashed, the other runs whose turns were in
            flight in every one of those crashes (sorted; absent when none): while there is one,
            the crashes may be that run's doing, not this turn's (see docs/retries.md).
        retry_at: per in-flight node backing off after a failed attempt, when its next attempt may
            be dispatched (epoch seconds, the driver's ``time.time()``: the clock of the pool
            queue's ``not_before``). Committed with the ``attempt_failed`` step, so a driver that
            resumes the run waits out only what is left; cleared by the re-dispatch.
        end_due: the batch's answers are all recorded but its end (the termination condition on
            the batch, the turn count, ``max_turns``, the next selection) is not decided: an
            operator supplied its last answer (``Store.supply_output``), and only the team knows
            its termination condition. The next driver decides it when it resumes the run.
    """

    sched: SchedulerState
    origin: int = 0
    round_start: int = 0
    batch_start: int = 0
    finished: bool = False
    dispatches: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    attempts: Mapping[str, int] = field(default_factory=dict)
    dispatch_step: Mapping[str, int] = field(default_factory=dict)
    stopped: bool = False
    keys: Mapping[str, str] = field(default_factory=dict)
    failures: Mapping[str, int] = field(default_factory=dict)
    crashes: Mapping[str, int] = field(default_factory=dict)
    crash_with: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    retry_at: Mapping[str, float] = field(default_factory=dict)
    end_due: bool = False

    @classmethod
    def fresh(cls, sched: SchedulerState, origin: int = 0) -> Cursor:
        """Before any round: the next start begins a new round."""
        return cls(sched=sched, origin=origin, finished=True)

    # -- transitions ---------------------------------------------------------------------------

    def new_round(self, at: int) -> Cursor:
        return replace(self, round_start=at, batch_start=at, finished=False, stopped=False)

    def dispatched(self, sched: SchedulerState, speakers: Sequence[str], at: int, step: int) -> Cursor:
        """A new batch, ``speakers``, dispatched at thread length ``at`` by head step ``step``: the
        per-turn maps start anew, for ``sched``'s in-flight nodes only."""
        dispatches = dict(self.dispatches)
        for name in speakers:
            dispatches[name] = (*dispatches.get(name, ())[-1:], at)
        return _with(
            self,
            {
                "sched": sched,
                "batch_start": at,
                "dispatches": dispatches,
                "attempts": dict.fromkeys(sched.in_flight, 1),
                "dispatch_step": dict.fromkeys(sched.in_flight, step),
                "keys": {},
                "failures": {},
                "crashes": {},
                "crash_with": {},
                "retry_at": {},
                "end_due": False,
            },
        )

    def redispatched(self, speakers: Sequence[str]) -> Cursor:
        """``speakers`` (in flight) dispatched again: one more attempt each, no longer backing off;
        the others' unchanged."""
        attempts = {**self.attempts, **{n: self.attempts.get(n, 1) + 1 for n in speakers}}
        retry_at = {n: t for n, t in self.retry_at.items() if n not in speakers}
        return replace(self, attempts=attempts, retry_at=retry_at)

    def backing_off(self, node: str, until: float) -> Cursor:
        """``node``'s next attempt may be dispatched at ``until`` (epoch seconds), not before."""
        return replace(self, retry_at={**self.retry_at, node: until})

    def next_attempt_at(self, nodes: Sequence[str]) -> float | None:
        """When all of ``nodes`` (in flight) may be dispatched again: the latest of their back-offs,
        or ``None`` when none of them backs off."""
        times = [self.retry_at[n] for n in nodes if n in self.retry_at]
        return max(times) if times else None

    def failed(self, node: str) -> Cursor:
        """An attempt of ``node``'s turn raised or timed out: one more failure counted."""
        return replace(self, failures={**self.failures, node: self.failures.get(node, 0) + 1})

    def crashed(self, nodes: Sequence[str], died_with: frozenset[str] = frozenset()) -> Cursor:
        """The attempts of ``nodes``' turns died with their process, as did the turns of the runs
        ``died_with``: one more crash each, and of those runs only the ones that were in every
        crash of the turn stay in its ``crash_with``."""
        crash_with = dict(self.crash_with)
        for n in nodes:
            kept = died_with if not self.crashes.get(n) else died_with & set(crash_with.get(n, ()))
            crash_with[n] = tuple(sorted(kept))
        return replace(
            self,
            crashes={**self.crashes, **{n: self.crashes.get(n, 0) + 1 for n in nodes}},
            crash_with={n: w for n, w in crash_with.items() if w},
        )

    def spent(self, nodes: Sequence[str], most: int) -> tuple[list[str], list[str]]:
        """Of ``nodes`` (in flight), those whose turn died with its process ``most`` times or more:
        with no other run in every one of those crashes (the turn's own doing), and with one (maybe
        that run's doing: the turn must be tried alone)."""
        done = [n for n in dict.fromkeys(nodes) if self.crashes.get(n, 0) >= most]
        return [n for n in done if not self.crash_with.get(n)], [n for n in done if self.crash_with.get(n)]

    def fresh_budget(self) -> Cursor:
        """Failures, crashes and back-offs forgotten (an operator's retry of a run whose budget ran out)."""
        return replace(self, failures={}, crashes={}, crash_with={}, retry_at={})

    def answered(self, name: str, sched: SchedulerState) -> Cursor:
        # Not with dataclasses.replace (its __init__ is the slower part): this runs on every completion.
        still = sched.in_flight
        return _with(
            self,
            {
                "sched": sched,
                "attempts": {n: a for n, a in self.attempts.items() if n in still},
                "dispatch_step": {n: s for n, s in self.dispatch_step.items() if n in still},
                "keys": {n: k for n, k in self.keys.items() if n in still} if self.keys else self.keys,
                "failures": {n: f for n, f in self.failures.items() if n in still}
                if self.failures
                else self.failures,
                "crashes": {n: c for n, c in self.crashes.items() if n in still}
                if self.crashes
                else self.crashes,
                "crash_with": {n: w for n, w in self.crash_with.items() if n in still}
                if self.crash_with
                else self.crash_with,
                "retry_at": {n: t for n, t in self.retry_at.items() if n in still}
                if self.retry_at
                else self.retry_at,
                "end_due": False,
            },
        )

    def ended(self, sched: SchedulerState, *, stopped: bool) -> Cursor:
        """The round ends: by a stop (``stopped``, scheduler kept) or by the graph's natural end."""
        return replace(self, sched=sched, finished=True, stopped=stopped, end_due=False)

    def supplied(self, name: str, sched: SchedulerState) -> Cursor:
        """``name``'s answer written by an operator (``sched``: after :func:`~graphflow_durable.scheduler.complete`):
        its turn ends as an answered one does; when it was the batch's last, the batch's end is due."""
        return replace(self.answered(name, sched), end_due=not sched.in_flight)

    def key(self, run_id: str, node: str) -> str:
        """The idempotency key of ``node``'s in-flight turn (see :class:`~graphflow_durable.ExecutionContext`)."""
        return self.keys.get(node) or f"{run_id}/{node}/{self.dispatch_step.get(node, 0)}"

    @property
    def status(self) -> Literal["running", "interrupted", "stopped", "finished"]:
        """The run status this cursor implies: finished, stopped, interrupted (nodes in flight) or running."""
        if self.finished:
            return "stopped" if self.stopped else "finished"
        return "interrupted" if self.sched.in_flight else "running"

    # -- JSON ----------------------------------------------------------------------------------

    def to_json(self, spec: GraphSpec) -> dict[str, Any]:
        """The compact form stored with each step; its size follows the active frontier only."""
        # Built in place, key by key (no merged partial dicts): this runs on every transition.
        out: dict[str, Any] = {
            "s": self.sched.to_sparse_json(spec),
            "origin": self.origin,
            "round_start": self.round_start,
            "batch_start": self.batch_start,
            "finished": self.finished,
        }
        if self.stopped:
            out["stopped"] = True
        if self.end_due:
            out["end_due"] = True
        in_flight = self.sched.in_flight
        # Sorted once; a batch of one (the usual case) is its own sorted set.
        flying = in_flight if len(in_flight) < 2 else sorted(set(in_flight))
        dispatches, attempts, steps = self.dispatches, self.attempts, self.dispatch_step
        out["dispatches"] = {n: list(dispatches[n]) for n in flying if n in dispatches}
        out["attempts"] = {n: attempts[n] for n in flying if n in attempts}
        out["dispatch_step"] = {n: steps[n] for n in flying if n in steps}
        if self.keys:
            out["keys"] = {n: self.keys[n] for n in flying if n in self.keys}
        if self.failures or self.crashes or self.retry_at:  # a run with a failure only
            out.update(_counts("failures", self.failures, flying))
            out.update(_counts("crashes", self.crashes, flying))
            out.update(_counts("crash_with", {n: list(w) for n, w in self.crash_with.items()}, flying))
            out.update(_counts("retry_at", self.retry_at, flying))
        return out

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], spec: GraphSpec, dispatches: Mapping[str, tuple[int, ...]]
    ) -> Cursor:
        """Inverse of :meth:`to_json`; ``dispatches`` of nodes not in flight come from the step log."""
        try:
            merged = dict(dispatches)
            merged.update({n: tuple(v) for n, v in data.get("dispatches", {}).items()})
            return cls(
                sched=SchedulerState.from_sparse_json(data["s"], spec),
                origin=int(data["origin"]),
                round_start=int(data["round_start"]),
                batch_start=int(data["batch_start"]),
                finished=bool(data["finished"]),
                dispatches=merged,
                stopped=bool(data.get("stopped", False)),
                **_turn_maps(data),
                end_due=bool(data.get("end_due", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # AttributeError: a list for a map
            raise StateFormatError(f"stored cursor has the wrong shape: {exc!r}") from exc

    def extension(
        self,
        run_id: str | None,
        *,
        status: str | None = None,
        graph_fingerprint: str | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """The ``graphflow_durable`` section of a saved state (see docs/state-format.md).

        ``status`` defaults to what the cursor says (:attr:`status`); ``graph_fingerprint`` is
        written when given, and so is ``stop_reason`` (the stop of an ended round). ``keys`` holds every in-flight node's idempotency key, so a turn moved to
        another run keeps its key.
        """
        if status is None:
            status = self.status
        flying = sorted(set(self.sched.in_flight))
        out: dict[str, Any] = {
            "format": FORMAT,
            "scheduler": self.sched.to_json(),
            "dispatches": {n: list(v) for n, v in sorted(self.dispatches.items())},
            "attempts": dict(self.attempts),
            "dispatch_step": dict(self.dispatch_step),
            "keys": {n: self.key(run_id or "", n) for n in flying if run_id or n in self.keys},
            "batch_start": self.batch_start,
            "round_start": self.round_start,
            "origin": self.origin,
            "status": status,
            "run_id": run_id,
            **_counts("failures", self.failures, flying),
            **_counts("crashes", self.crashes, flying),
            **_counts("crash_with", {n: list(w) for n, w in self.crash_with.items()}, flying),
            **({"end_due": True} if self.end_due else {}),
            **_counts("retry_at", self.retry_at, flying),
        }
        if graph_fingerprint is not None:
            out["graph_fingerprint"] = graph_fingerprint
        if stop_reason is not None and self.finished:
            out["stop_reason"] = stop_reason
        return out

    @classmethod
    def from_extension(cls, ext: Mapping[str, Any]) -> Cursor:
        """Inverse of :meth:`extension`."""
        if ext.get("format") != FORMAT:
            raise StateFormatError(
                f"unknown graphflow_durable state format {ext.get('format')!r}; this version reads format {FORMAT}"
            )
        try:
            return cls(
                sched=SchedulerState.from_json(ext["scheduler"]),
                origin=int(ext.get("origin", 0)),
                round_start=int(ext.get("round_start", 0)),
                batch_start=int(ext.get("batch_start", 0)),
                finished=ext.get("status") in ("finished", "stopped"),
                stopped=ext.get("status") == "stopped",
                end_due=bool(ext.get("end_due", False)),
                dispatches={n: tuple(int(i) for i in v) for n, v in ext.get("dispatches", {}).items()},
                **_turn_maps(ext),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # AttributeError: a list for a map
            raise StateFormatError(f"graphflow_durable section has the wrong shape: {exc!r}") from exc


_new = object.__new__


def _with(cursor: Cursor, changes: dict[str, Any]) -> Cursor:
    """``dataclasses.replace(cursor, **changes)``, the same value, made without the frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` call per field, about twice the time): a
    transition makes one."""
    new: Cursor = _new(Cursor)
    fields = new.__dict__
    fields.update(cursor.__dict__)
    fields.update(changes)
    return new
