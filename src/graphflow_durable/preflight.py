"""The pre-deploy check: stored runs loaded against the current code, with no agent started.

Before a deploy, :func:`check_runs` builds a fresh team for each stored run that a worker could
still resume (every run not finished or cancelled, nested runs aside: their team is built inside an
agent) with the new code's factory, and goes along the resume path as far as it can without
taking a lease, writing anything or running an agent:

1. the graph: the run's fingerprint against the team's, as a resume checks it
   (:meth:`RunSession.check_graph`, the lines of its :class:`GraphMismatchError`);
2. the agents: each participant's stored state, folded as a resume folds it (``Store.load``), fed
   to the fresh agent's ``load_state``;
3. the resume itself: the team put at the head (``plan`` and ``TeamView.restore``: the cursor read
   against the current graph, the thread's messages made by the team's message factory, the
   termination condition replaying the round);
4. the scheduler: the state at the head (``state_of``) checked by the repair engine
   (:func:`~graphflow_durable.integrity.validate_state`), which replays the thread through the
   current graph's rules, edge conditions included, and reports where the stored state diverges.

A run refused at step 1 or 2 is not taken further: its resume stops there. Each problem is one
:class:`Problem`. The check writes nothing: the agents' ``on_messages``/``on_reset`` are never
called, nothing is written to the store and no lease is taken.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from graphflow_durable._model.restore import plan
from graphflow_durable._runtime import team as stored
from graphflow_durable._runtime.session import last_error
from graphflow_durable._storage.statements import not_found
from graphflow_durable.errors import GraphMismatchError, StoreError, UsageError
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.integrity import validate_state
from graphflow_durable.store import RunRecord, Store

__all__ = ["CheckFactory", "Problem", "build_team", "check_factory", "check_runs", "runs_to_check"]

#: What a problem is about: the graph, an agent's stored state, the resume, the scheduler replay.
ProblemKind = Literal["graph", "agent_state", "resume", "scheduler"]

#: Runs nobody resumes again without a new task: the default check leaves them out.
_DONE = ("finished", "cancelled")
#: The run id a factory is built with when there is no run to check (the team is built, never run).
PROBE_RUN_ID = "graphflow-durable-check-probe"


class CheckFactory(Protocol):
    """Builds a fresh team for ``run_id`` (the crash kit's and the worker's convention)::

        def make_team(run_id: str, **durable: Any) -> DurableGraphFlow:
            return DurableGraphFlow(agents(), graph(), run_id=run_id, **durable)

    It is called as ``make_team(run_id, store=store)``.
    """

    def __call__(self, run_id: str, /, *, store: Store) -> DurableGraphFlow: ...


@dataclass(frozen=True)
class Problem:
    """One thing that would go wrong when the current code resumes a stored run.

    Attributes:
        run_id: the run.
        kind: ``"graph"`` (the graph differs: the resume is refused), ``"agent_state"`` (an agent's
            ``load_state`` refused its stored state), ``"resume"`` (the team could not be put at the
            run's head), ``"scheduler"`` (replaying the thread through the current graph diverges
            from the stored scheduler state).
        subject: the agent (``agent_state``) or the repair engine's finding code (``scheduler``,
            documented in docs/repair.md); ``None`` otherwise.
        message: what differs or failed, on one line.
    """

    run_id: str
    kind: ProblemKind
    subject: str | None
    message: str

    def to_json(self) -> dict[str, Any]:
        """``{"run_id", "kind", "subject", "message"}``."""
        return {"run_id": self.run_id, "kind": self.kind, "subject": self.subject, "message": self.message}

    def __str__(self) -> str:
        about = f" {self.subject}" if self.subject else ""
        return f"{self.run_id}: {self.kind}{about}: {self.message}"


def runs_to_check(store: Store, run_ids: Sequence[str] = ()) -> list[RunRecord]:
    """The runs named (all of them, whatever their status), or by default every top-level run that
    is not finished or cancelled, in creation order.

    Raises:
        RunNotFoundError: a named run does not exist.
    """
    if not run_ids:
        return [r for r in store.list_runs() if r.status not in _DONE and r.parent_run_id is None]
    found: list[RunRecord] = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None:
            raise not_found(run_id)
        found.append(run)
    return found


async def check_runs(make_team: CheckFactory, store: Store, runs: Sequence[RunRecord]) -> list[Problem]:
    """Every problem the current code (``make_team``) would meet resuming ``runs``, in order. With no
    run to check, the factory is still called once (run id :data:`PROBE_RUN_ID`, never run), so a
    factory that cannot build a team fails the check even when nothing is resumable.

    Raises:
        UsageError: ``make_team`` cannot be called as ``make_team(run_id, store=store)``, raised,
            or returned something other than a :class:`DurableGraphFlow`.
        StoreError: the store failed (a run's log could not be read, or is damaged).
    """
    check_factory(make_team, option="--team")
    if not runs:
        build_team(make_team, PROBE_RUN_ID, store, option="--team")
        return []
    problems: list[Problem] = []
    for run in runs:
        team = build_team(make_team, run.run_id, store, option="--team")
        problems.extend(await _check_run(team, store, run))
    return problems


def check_factory(make_team: Any, *, option: str) -> None:
    """Refuse a team factory that cannot be called as ``make_team(run_id, store=...)`` (the
    worker's, the check's and the crash kit's convention), before anything is built.

    Raises:
        UsageError: it cannot be called so (the message names ``option``, the argument given).
    """
    try:
        signature = inspect.signature(make_team)
    except (TypeError, ValueError):  # a callable Python cannot describe: the call will tell
        return
    try:
        signature.bind("run", store=None)
    except TypeError as exc:
        raise UsageError(
            f"{option}: the team factory cannot be called as factory(run_id, store=...): {exc}; give "
            "it a signature like make_team(run_id, **durable)",
            option=option,
        ) from None


def build_team(make_team: Any, run_id: str, store: Store, *, option: str) -> DurableGraphFlow:
    """``make_team(run_id, store=store)``, proven to be a :class:`DurableGraphFlow`.

    Raises:
        UsageError: the factory raised, or returned something else (a plain ``GraphFlow``,
            ``None``); the message names ``option``, the argument given.
    """
    try:
        team = make_team(run_id, store=store)
    except Exception as exc:  # noqa: BLE001 -- the user's factory: one line naming what it raised
        raise UsageError(
            f"{option}: the team factory raised {last_error(exc)} (building run {run_id!r})",
            run_id=run_id,
            option=option,
        ) from None
    if not isinstance(team, DurableGraphFlow):
        raise UsageError(
            f"{option}: the team factory returned {type(team).__name__}, expected a DurableGraphFlow; "
            "return DurableGraphFlow(..., run_id=run_id, store=store)",
            run_id=run_id,
            option=option,
        )
    return team


async def _check_run(team: DurableGraphFlow, store: Store, run: RunRecord) -> list[Problem]:
    run_id = run.run_id
    session, view = team._session, team._team_view
    problems: list[Problem] = []
    try:
        session.check_graph(run)
    except GraphMismatchError as exc:
        lines = exc.differences or ("the graph fingerprints differ",)
        problems.extend(Problem(run_id, "graph", None, line) for line in lines)
    log = store.load(run_id)  # the resume's read: every row checked, agent states folded
    for agent in team._participants:
        state = log.agent_states.get(agent.name)
        if state is None or isinstance(agent, DurableGraphFlow):
            # A durable team inside: its load_state makes the state its own run's new start, a
            # write; its run is its own (a nested run, left out of the check).
            continue
        try:
            await agent.load_state(state)
        except Exception as exc:  # noqa: BLE001 -- the user's agent: whatever it raises is the finding
            problems.append(
                Problem(run_id, "agent_state", agent.name, f"load_state raised {last_error(exc)}")
            )
    if problems:
        return problems  # the resume stops at the first of these
    try:
        # The resume's restore with the states just loaded left out (each agent loads once).
        at = plan(log, session.spec, view.participant_names)
        await view.restore(at, {}, run_id)
        state = await stored.state_of(view, log, session.spec, run_id, session.fingerprint)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 -- whatever stops the resume is the finding
        return [
            Problem(run_id, "resume", None, f"putting the team at the run's head raised {last_error(exc)}")
        ]
    report = validate_state(state, session.spec.graph)
    return [
        Problem(run_id, "scheduler", f.code, f"{f.pointer}: {f.message}")
        for f in report.findings
        if f.severity != "info"
    ]
