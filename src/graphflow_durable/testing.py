"""The crash kit: prove that a user's own team survives a crash at any point (see docs/crash-kit.md).

:func:`crash_matrix` runs the team once, uninterrupted, to learn its commits (the reference); then,
for each crash point, runs it again under a fresh run id, crashes it there, builds a fresh team
with the user's factory, resumes it with ``run()`` and compares the resumed run with the reference:
the transcript (ids and times aside), each node's completed turns, the turns run again, the effects
the agents recorded with :func:`record_effect` (once per idempotency key), the run's end status,
and that no lease is left held. A run that parks for a person (``human_input="wait"``) is answered
from ``answers=`` and run again by a fresh team, in every run the kit makes.

A crash point is "after commit k" (the commit is durable, nothing after it is written: the round's
start is commit 0, its last commit the last point) or, with ``points="mid-turn"``, "inside turn j"
(the agent's turn ran, its effects happened, its answer is not committed). In process the crash is
:class:`_Crash`, a ``BaseException`` raised from the store's commit path, which this module wraps
for the one run it crashes; no write of the crashed team lands after it. In a subprocess the
process kills itself with SIGKILL at the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autogen_agentchat.base import ChatAgent
from autogen_agentchat.messages import BaseChatMessage

from graphflow_durable._model.records import StepKind
from graphflow_durable.context import current_execution
from graphflow_durable.errors import UsageError
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.preflight import build_team, check_factory
from graphflow_durable.store import InputRequest, Store

__all__ = ["SAMPLE_ENV", "CrashFailure", "CrashReport", "crash_matrix", "record_effect"]

#: The environment variable that gives ``sample`` when a call gives none (the pytest plugin's
#: ``--gfd-crash-sample=N`` sets it).
SAMPLE_ENV = "GRAPHFLOW_DURABLE_CRASH_SAMPLE"
#: The always-resume switch of the runtime: off for the kit's own runs (it does its own crashing).
_ALWAYS_RESUME_ENV = "GRAPHFLOW_DURABLE_ALWAYS_RESUME"
#: Where a crashed subprocess appends its ledger lines (JSON), for the parent to read.
_LEDGER_ENV = "GRAPHFLOW_DURABLE_CRASH_LEDGER"
#: Message fields that differ between two runs of the same team.
_VOLATILE = ("id", "created_at")

Points = Literal["every-commit", "mid-turn", "both"]
Mode = Literal["inprocess", "subprocess"]
#: What answers a waiting person (``human_input="wait"``), by node: the text, or a function of the
#: prompt that returns it.
Answers = Mapping[str, "str | Callable[[str], str]"]


@dataclass(frozen=True)
class CrashFailure:
    """One crash point whose resumed run differs from the uninterrupted one.

    Attributes:
        point: the crash point's number (0 is the first point of the matrix).
        node: the node whose commit or turn the crash hit (``None`` for a commit of no node).
        difference: what differed, in words.
    """

    point: int
    node: str | None
    difference: str


@dataclass
class CrashReport:
    """What :func:`crash_matrix` found: ``points`` tried, one :class:`CrashFailure` per divergent one."""

    points: int
    failures: list[CrashFailure] = field(default_factory=list)

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` naming the first failure's point, node and difference."""
        if self.failures:
            first = self.failures[0]
            more = f" ({len(self.failures) - 1} more failing points)" if len(self.failures) > 1 else ""
            raise AssertionError(f"crash point {first.point} (node {first.node}): {first.difference}{more}")


class _Crash(BaseException):
    """The simulated crash (in process): a ``BaseException``, so no ``except Exception`` stops it."""


# -- the ledger: turns run and effects applied, by run ------------------------------------------


@dataclass(frozen=True)
class _Entry:
    kind: str  # "turn" or "effect"
    run_id: str
    key: str
    node: str
    name: str


_ledger: list[_Entry] = []
#: Crash matrices running in this process: outside them nothing is noted (the ledger stays empty).
_matrices = 0


def _note(entry: _Entry) -> None:
    if not _matrices and _LEDGER_ENV not in os.environ:
        return  # no kit is running: nothing reads the entry, and production code never grows it
    _ledger.append(entry)
    path = os.environ.get(_LEDGER_ENV)
    if path:  # a subprocess: the parent reads what ran before the kill (flushed line by line)
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps([entry.kind, entry.run_id, entry.key, entry.node, entry.name]) + "\n")


def record_effect(name: str) -> None:
    """Record that the current agent turn applied the side effect ``name`` (an email sent, a card
    charged), for :func:`crash_matrix` to check that each turn's effects are applied once.

    Call it where the effect really happens. A turn that runs again after a crash has the same
    idempotency key (:attr:`ExecutionContext.idempotency_key`): code that applies its effect
    again under that key is reported. Outside a durable turn it raises ``UsageError``. Outside a
    running :func:`crash_matrix` (production code) it records nothing and keeps nothing.
    """
    ctx = current_execution()
    if ctx is None:
        raise UsageError(
            "record_effect() was called outside a durable agent turn; call it from an agent's turn"
        )
    _note(_Entry("effect", ctx.run_id, ctx.idempotency_key, ctx.node, name))


def _watch_agents(team: DurableGraphFlow) -> None:
    """Note every turn each participant runs (its idempotency key), wrapping its stream."""
    for agent in team._participants:
        if not isinstance(agent, ChatAgent):
            continue  # a nested team: its own turns are not the outer graph's
        stream = agent.on_messages_stream

        def watched(*args: Any, __stream: Any = stream, **kwargs: Any) -> Any:
            ctx = current_execution()
            if ctx is not None:
                _note(_Entry("turn", ctx.run_id, ctx.idempotency_key, ctx.node, ""))
            return __stream(*args, **kwargs)

        agent.on_messages_stream = watched  # type: ignore[method-assign]


# -- crash points --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Point:
    kind: Literal["after", "turn"]  # after commit `index` / inside the turn of completion `index`
    index: int
    node: str | None

    def describe(self) -> str:
        if self.kind == "after":
            what = (
                "the round's start" if self.index == 0 else f"{self.node}'s answer" if self.node else "a step"
            )
            return f"after commit {self.index} ({what})"
        return f"inside turn {self.index} ({self.node}'s, its answer not committed)"


class _Trap:
    """Wraps the store's commit path for one run: counts its commits and, when armed, crashes at
    the point (``action`` raises :class:`_Crash` in process, or SIGKILLs a subprocess)."""

    def __init__(self, store: Store, run_id: str, point: _Point | None, action: Callable[[], None]) -> None:
        self.store, self.run_id, self.point, self.action = store, run_id, point, action
        self.commits: list[tuple[str, str | None]] = []  # (step kind, node) of each commit, in order
        self.fired = False
        self.on_fire: Callable[[], None] = lambda: None  # told once the crash point is reached

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self.on_fire()
        self.action()

    def _hit(self, request: Any, kind: str) -> bool:
        point = self.point
        if point is None:
            return False
        if point.kind == "turn":
            turns = sum(1 for k, _ in self.commits if k == StepKind.COMPLETE.value)
            return kind == StepKind.COMPLETE.value and turns == point.index
        return len(self.commits) == point.index

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        driver = self.store._driver
        submit, release = driver.submit_commit, driver.release_lease

        def submit_commit(request: Any) -> Any:
            if request.run_id != self.run_id:
                return submit(request)
            if self.fired:
                raise _Crash("the process is gone")
            kind = str(getattr(request.step.kind, "value", request.step.kind))
            if self.point is not None and self.point.kind == "turn" and self._hit(request, kind):
                self._fire()
            after = self.point is not None and self.point.kind == "after" and self._hit(request, kind)
            self.commits.append((kind, request.step.node))
            future = submit(request)
            if not after:
                return future
            self.fired = True  # nothing after this commit is written (its writer is told when durable)
            crashed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            def durable(done: asyncio.Future[Any]) -> None:
                self.on_fire()
                if done.cancelled() or done.exception() is not None:
                    if not crashed.done():
                        crashed.set_exception(_Crash("the commit failed before the crash"))
                    return
                try:
                    self.action()
                except _Crash as exc:
                    if not crashed.done():
                        crashed.set_exception(exc)

            future.add_done_callback(durable)
            return crashed

        def release_lease(run_id: str, fencing_token: int) -> bool:
            if run_id == self.run_id and self.fired:
                raise _Crash("the process is gone")
            return release(run_id, fencing_token)

        driver.submit_commit = submit_commit  # type: ignore[method-assign]
        driver.release_lease = release_lease  # type: ignore[method-assign]
        try:
            yield
        finally:
            del driver.submit_commit, driver.release_lease  # the class's methods again


def _stop(leg: asyncio.Future[Any]) -> None:
    """The crashed team stops at once: its run's task is cancelled until it ends (the second
    cancellation stops the flow's wait for the turns in flight), as if its process were gone."""
    loop = asyncio.get_running_loop()

    def again(left: int) -> None:
        if not leg.done() and left > 0:
            leg.cancel()
            loop.call_later(0.01, again, left - 1)

    loop.call_soon(again, 500)


class _CrashLogs(logging.Filter):
    """AutoGen logs a handler's exception with its traceback: not the simulated crash's."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _Crash)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logger, quiet = logging.getLogger("autogen_core"), _CrashLogs()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextlib.asynccontextmanager
async def _buried() -> AsyncIterator[None]:
    """The crashed team's tasks end as a dead process's do, unheard: every task the crashed run
    makes (the task started here, the tasks those tasks or a callback start: the runtime's message
    handlers, GraphFlow's stream) is cancelled once it has stopped, awaited, and its outcome
    retrieved, so that asyncio reports none of them later ("Task was destroyed but it is
    pending!", "Task exception was never retrieved"). Another task's tasks are left alone."""
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []
    owners: set[asyncio.Task[Any] | None] = {asyncio.current_task(), None}
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        creator = asyncio.current_task(loop)
        task = (
            previous(loop, coro, **kwargs)
            if previous is not None
            else asyncio.Task(coro, loop=loop, **kwargs)
        )
        if isinstance(task, asyncio.Task) and creator in owners:
            made.append(task)
            owners.add(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield
        for _ in range(100):  # a task may make another as it ends
            pending = [t for t in made if not t.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.1)
    finally:
        loop.set_task_factory(previous)
        for task in made:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the crash's doing, not a finding


def _raise_crash() -> None:
    raise _Crash("simulated crash")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# -- what a run produced -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    transcript: list[dict[str, Any]]
    completions: Counter[str]
    status: str
    held_by: str | None


def _outcome(store: Store, run_id: str) -> _Outcome:
    log = store.load(run_id)
    run = store.get_run(run_id)
    transcript = [{k: v for k, v in m.body.items() if k not in _VOLATILE} for m in log.messages]
    completions = Counter(s.node for s in log.steps if s.kind == StepKind.COMPLETE and s.node)
    status = run.status if run is not None else "missing"
    return _Outcome(transcript, completions, status, run.lease_owner if run is not None else None)


@dataclass(frozen=True)
class _Reference:
    """The uninterrupted run: its outcome, the turns each node ran, the effects per node."""

    outcome: _Outcome
    turns: Counter[str]
    effects: Counter[tuple[str, str]]


def _turns(entries: Sequence[_Entry], run_id: str) -> Counter[str]:
    """Turns run per node, counting each idempotency key once (a stream may call itself)."""
    keys = {(e.key, e.node) for e in entries if e.kind == "turn" and e.run_id == run_id}
    return Counter(node for _, node in keys)


def _effects(entries: Sequence[_Entry], run_id: str) -> list[_Entry]:
    return [e for e in entries if e.kind == "effect" and e.run_id == run_id]


def _text(body: Mapping[str, Any]) -> str:
    text = json.dumps(body.get("content", body), sort_keys=True, default=str)
    return f"{body.get('source')}: {text[:120]}"


def _compare(
    reference: _Reference,
    got: _Outcome,
    before: Counter[str],
    resumed_turns: Counter[str],
    effects: list[_Entry],
) -> str | None:
    """The first difference between the reference and a crashed-and-resumed run, in words."""
    ref, ref_turns, ref_effects = reference.outcome, reference.turns, reference.effects
    if got.transcript != ref.transcript:
        for i, (a, b) in enumerate(zip(ref.transcript, got.transcript, strict=False)):
            if a != b:
                return f"transcript differs at message {i}: expected {_text(a)!r}, got {_text(b)!r}"
        return f"transcript has {len(got.transcript)} messages, expected {len(ref.transcript)}"
    if got.completions != ref.completions:
        return f"completed turns per node {dict(got.completions)}, expected {dict(ref.completions)}"
    for node in sorted(set(ref_turns) | set(resumed_turns)):
        expected = ref_turns[node] - before[node]
        if resumed_turns[node] != expected:
            return (
                f"node {node} ran {resumed_turns[node]} turns after the resume, expected {expected} "
                f"({before[node]} of its {ref_turns[node]} were committed before the crash)"
            )
    applied = Counter((e.key, e.name) for e in effects)
    for (key, name), count in sorted(applied.items()):
        if count > 1:
            return f"effect {name!r} of turn {key} applied {count} times"
    by_node = Counter((e.node, e.name) for e in effects)
    if by_node != ref_effects:
        return f"effects per node {dict(by_node)}, expected {dict(ref_effects)}"
    if got.status != ref.status:
        return f"run ended {got.status!r}, expected {ref.status!r}"
    if got.held_by is not None:
        return f"run left held by {got.held_by} after the resume"
    return None


# -- the matrix ----------------------------------------------------------------------------------


def _sample_size(sample: int | None) -> int | None:
    if sample is None:
        raw = os.environ.get(SAMPLE_ENV, "").strip()
        if not raw:
            return None
        try:
            sample = int(raw)
        except ValueError:
            raise UsageError(f"{SAMPLE_ENV}={raw!r} is not a number; set it to an int 1 or more") from None
        where = SAMPLE_ENV
    else:
        where = "sample"
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise UsageError(f"{where} must be an int 1 or more, not {sample!r}", option="sample")
    return sample


def _sampled(count: int, sample: int | None) -> list[int]:
    """``sample`` indices of ``count``, evenly spaced, first and last included (all when None)."""
    if sample is None or sample >= count:
        return list(range(count))
    if sample == 1:
        return [0]
    return sorted({round(i * (count - 1) / (sample - 1)) for i in range(sample)})


def _factory(make_team: Callable[..., DurableGraphFlow] | str) -> Callable[..., DurableGraphFlow]:
    if not isinstance(make_team, str):
        if not callable(make_team):
            raise UsageError(
                f"make_team must be a callable or 'module:factory', not {type(make_team).__name__}",
                option="make_team",
            )
        return make_team
    module_name, _, attribute = make_team.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"make_team {make_team!r} is not 'module:factory'; give e.g. 'myteam:make_team'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UsageError(
            f"make_team {make_team!r} cannot be imported ({exc}); check the module and name"
        ) from None
    if not callable(obj):
        raise UsageError(f"make_team {make_team!r} is not callable; name the team factory")
    return obj  # type: ignore[no-any-return]


def _build(factory: Callable[..., DurableGraphFlow], run_id: str, store: Store) -> DurableGraphFlow:
    """A fresh team from the user's factory (``UsageError`` naming ``make_team`` for anything else)."""
    return build_team(factory, run_id, store, option="make_team")


def _spec(make_team: Callable[..., DurableGraphFlow] | str) -> str:
    """``module:factory`` for a subprocess, proven to import back to the same object."""
    if isinstance(make_team, str):
        _factory(make_team)
        return make_team
    module, name = getattr(make_team, "__module__", None), getattr(make_team, "__qualname__", "")
    spec = f"{module}:{name}"
    if module in (None, "__main__") or "<" in name:
        raise UsageError(
            f"make_team {spec} cannot be imported by name in a subprocess; give it as 'module:factory'"
        )
    try:
        same = _factory(spec) is make_team
    except UsageError:
        same = False
    if not same:
        raise UsageError(f"make_team {spec} does not import back by name; give it as 'module:factory'")
    return spec


def _store_url(store: Store | str) -> str:
    return store if isinstance(store, str) else store.config_url


def _check(task: Any, store: Any, points: Any, mode: Any, answers: Any) -> dict[str, Any]:
    """The arguments checked (nothing run yet); returns the answers as a dict."""
    if not isinstance(store, (Store, str)):
        raise UsageError(
            f"store must be a Store or a store URL, not {type(store).__name__}; pass store='sqlite:///runs.db'",
            option="store",
        )
    if points not in ("every-commit", "mid-turn", "both"):
        raise UsageError(
            f"points must be 'every-commit', 'mid-turn' or 'both', not {points!r}", option="points"
        )
    if mode not in ("inprocess", "subprocess"):
        raise UsageError(f"mode must be 'inprocess' or 'subprocess', not {mode!r}", option="mode")
    if mode == "subprocess" and not isinstance(task, str):
        raise UsageError(
            "mode='subprocess' takes a task given as text (str); pass the task's text", option="task"
        )
    if answers is None:
        return {}
    if not isinstance(answers, Mapping) or not all(
        isinstance(k, str) and (isinstance(v, str) or callable(v)) for k, v in answers.items()
    ):
        raise UsageError(
            "answers must map node names to an answer's text or a function of the prompt, e.g. "
            "answers={'approver': 'approved'}",
            option="answers",
        )
    if mode == "subprocess" and not all(isinstance(v, str) for v in answers.values()):
        raise UsageError(
            "mode='subprocess' takes answers given as text (a function cannot reach the process); "
            "give each answer's text",
            option="answers",
        )
    return dict(answers)


def _check_answers(team: DurableGraphFlow, answers: Mapping[str, Any]) -> None:
    names = [p.name for p in team._participants]
    unknown = sorted(set(answers) - set(names))
    if unknown:
        raise UsageError(
            f"answers names {', '.join(map(repr, unknown))}, which is not a participant "
            f"(participants: {', '.join(names)})",
            option="answers",
        )


@contextlib.contextmanager
def _no_always_resume() -> Iterator[None]:
    saved = os.environ.pop(_ALWAYS_RESUME_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[_ALWAYS_RESUME_ENV] = saved


def _fresh(factory: Callable[..., DurableGraphFlow], run_id: str, store: Store) -> DurableGraphFlow:
    team = _build(factory, run_id, store)
    _watch_agents(team)
    return team


def _answer(answers: Answers, request: InputRequest) -> str:
    given = answers.get(request.node)
    if given is None:
        raise UsageError(
            f"node {request.node} waits for input (human_input='wait', asked {request.prompt!r}); "
            f"give crash_matrix answers={{{request.node!r}: 'the answer'}}",
            option="answers",
        )
    return given if isinstance(given, str) else str(given(request.prompt))


def _parked(store: Store, run_id: str) -> list[InputRequest]:
    """The requests the run is parked on (none unless it is ``waiting``)."""
    run = store.get_run(run_id)
    return store.pending_requests(run_id) if run is not None and run.status == "waiting" else []


async def _drive(
    factory: Callable[..., DurableGraphFlow],
    task: Any,
    store: Store,
    run_id: str,
    answers: Answers,
    team: DurableGraphFlow,
    gone: Callable[[], bool] = lambda: False,
) -> None:
    """Run (or resume) the team's run to its end; a run already ended returns its stored result. A
    run parked for a person (``human_input="wait"``) is answered from ``answers`` and run again by a
    fresh team, as a person answers and a worker resumes, until it ends (``gone``: crashed, stop)."""
    await team.run(task=task)
    while not gone() and (pending := await asyncio.to_thread(_parked, store, run_id)):
        for request in pending:
            text = _answer(answers, request)
            await asyncio.to_thread(store.respond, run_id, text, request_id=request.request_id)
        team = _fresh(factory, run_id, store)
        await team.run()


async def crash_matrix(
    make_team: Callable[..., DurableGraphFlow] | str,
    task: str | BaseChatMessage | Sequence[BaseChatMessage],
    *,
    store: Store | str,
    points: Points = "every-commit",
    mode: Mode = "inprocess",
    sample: int | None = None,
    answers: Answers | None = None,
) -> CrashReport:
    """Crash the team at every commit (and inside every turn), resume it, compare with an
    uninterrupted run; see docs/crash-kit.md.

    Args:
        make_team: the team factory, called ``make_team(run_id, store=store)`` for a fresh team with
            fresh agents (as the worker's factories), or ``"module:factory"`` (required with
            ``mode="subprocess"`` for a callable that cannot be imported by name).
        task: the task of the run.
        store: a :class:`Store` or a store URL; each crash point runs under its own run id there.
        points: ``"every-commit"`` (after each commit: the round's start to its last commit),
            ``"mid-turn"`` (inside each agent turn, its answer not committed), or ``"both"``.
        mode: ``"inprocess"`` (a ``BaseException`` raised from the commit path, every object
            dropped) or ``"subprocess"`` (a real process killed with SIGKILL; the resume runs here).
        sample: try only this many points, evenly spaced, the first and last included; ``None``:
            ``$GRAPHFLOW_DURABLE_CRASH_SAMPLE`` if set, else every point.
        answers: for a team with people in it (``human_input="wait"``): node name -> the answer's
            text, or a function of the prompt that returns it (text only with
            ``mode="subprocess"``). Each run that parks is answered with ``Store.respond`` and run
            again by a fresh team, as a person and a worker would; a node that waits with no
            answer given is a ``UsageError``.

    Returns:
        A :class:`CrashReport`; ``report.assert_ok()`` raises on the first divergent point.

    Raises:
        UsageError: a bad argument (the message names it and the fix), nothing was run; or
            ``make_team`` raised or returned something other than a :class:`DurableGraphFlow`, or a
            node waits for input that ``answers`` does not answer.
    """
    given = _check(task, store, points, mode, answers)
    size = _sample_size(sample)
    factory = _factory(make_team)
    check_factory(factory, option="make_team")
    spec = _spec(make_team) if mode == "subprocess" else None
    global _matrices
    _matrices += 1
    mark = len(_ledger)
    try:
        with _no_always_resume(), _quiet():
            if isinstance(store, str):
                with Store(store) as opened:
                    return await _matrix(_Setup(factory, spec, task, opened, given), points, size)
            return await _matrix(_Setup(factory, spec, task, store, given), points, size)
    finally:
        _matrices -= 1
        del _ledger[mark:]  # the matrix's own entries: none outlives it


@dataclass(frozen=True)
class _Setup:
    """What every run of one matrix is made of."""

    factory: Callable[..., DurableGraphFlow]
    spec: str | None  # "module:factory" in subprocess mode
    task: Any
    store: Store
    answers: Mapping[str, str | Callable[[str], str]]

    async def drive(
        self, run_id: str, team: DurableGraphFlow, gone: Callable[[], bool] = lambda: False
    ) -> None:
        await _drive(self.factory, self.task, self.store, run_id, self.answers, team, gone)


async def _matrix(setup: _Setup, points: Points, sample: int | None) -> CrashReport:
    store = setup.store
    prefix = uuid.uuid4().hex[:8]
    ref_id = f"crashkit-{prefix}-reference"
    team = _fresh(setup.factory, ref_id, store)
    _check_answers(team, setup.answers)
    trap = _Trap(store, ref_id, None, _raise_crash)
    start = len(_ledger)
    with trap.installed():
        await setup.drive(ref_id, team)
    ref = _Reference(
        await asyncio.to_thread(_outcome, store, ref_id),
        _turns(_ledger[start:], ref_id),
        Counter((e.node, e.name) for e in _effects(_ledger[start:], ref_id)),
    )
    candidates: list[_Point] = []
    turn = 0
    for k, (kind, node) in enumerate(trap.commits):
        if kind == StepKind.COMPLETE.value:
            if points in ("mid-turn", "both"):
                candidates.append(_Point("turn", turn, node))
            turn += 1
        if points in ("every-commit", "both"):
            candidates.append(_Point("after", k, node))
    chosen = _sampled(len(candidates), sample)
    report = CrashReport(points=len(chosen))
    for number in chosen:
        point = candidates[number]
        run_id = f"crashkit-{prefix}-{number}"
        if setup.spec is None:
            difference = await _inprocess(setup, run_id, point, ref)
        else:
            difference = await _subprocess(setup, setup.spec, run_id, point, ref)
        if difference is not None:
            report.failures.append(CrashFailure(number, point.node, f"{point.describe()}: {difference}"))
    return report


async def _inprocess(setup: _Setup, run_id: str, point: _Point, ref: _Reference) -> str | None:
    start = len(_ledger)
    trap = _Trap(setup.store, run_id, point, _raise_crash)
    team: DurableGraphFlow | None = _fresh(setup.factory, run_id, setup.store)
    assert team is not None
    # Whatever the crashed run raises is the crash's doing: the resume is what is checked.
    with trap.installed():
        async with _buried():
            leg = asyncio.ensure_future(setup.drive(run_id, team, lambda: trap.fired))
            trap.on_fire = lambda: _stop(leg)
            with contextlib.suppress(_Crash, asyncio.CancelledError, Exception):
                await leg
    team = leg = None  # type: ignore[assignment]  # every object of the crashed team dropped
    if not trap.fired:
        return "the crash point was never reached: the run did not repeat the reference's commits"
    return await _resume(setup, run_id, start, ref)


async def _resume(setup: _Setup, run_id: str, start: int, ref: _Reference) -> str | None:
    """Resume the crashed run in a fresh team and compare it with the reference."""
    store = setup.store
    crashed = await asyncio.to_thread(store.get_run, run_id)
    if crashed is not None and crashed.lease_owner is not None:
        # The crashed holder is gone: as the next driver proves of a dead process on this host.
        await asyncio.to_thread(store._driver.release_lease, run_id, crashed.fencing_token)
    before = (await asyncio.to_thread(_outcome, store, run_id)).completions if crashed else Counter()
    middle = len(_ledger)
    try:
        await setup.drive(run_id, _fresh(setup.factory, run_id, store))
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - the resume's own failure is the finding, reported
        return f"the resume raised {type(exc).__name__}: {exc}"
    got = await asyncio.to_thread(_outcome, store, run_id)
    resumed = _turns(_ledger[middle:], run_id)
    return _compare(ref, got, before, resumed, _effects(_ledger[start:], run_id))


async def _subprocess(setup: _Setup, spec: str, run_id: str, point: _Point, ref: _Reference) -> str | None:
    with tempfile.TemporaryDirectory(prefix="gfd-crashkit-") as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        env = {k: v for k, v in os.environ.items() if k != _ALWAYS_RESUME_ENV}
        env[_LEDGER_ENV] = str(ledger)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        argv = [spec, _store_url(setup.store), run_id, setup.task, point.kind, str(point.index)]
        argv.append(json.dumps(setup.answers))
        code = "import sys; from graphflow_durable.testing import _child; sys.exit(_child(sys.argv[1:]))"
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        if proc.returncode != -signal.SIGKILL:
            tail = proc.stderr.strip().splitlines()[-1:] or [""]
            return f"the process was not killed at the point (exit {proc.returncode}) {tail[0]}".rstrip()
        start = len(_ledger)
        if ledger.exists():
            for line in ledger.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError, TypeError):  # a line cut by the kill
                    _ledger.append(_Entry(*json.loads(line)))
    return await _resume(setup, run_id, start, ref)


def _child(argv: list[str]) -> int:
    """A subprocess of ``mode="subprocess"``: run the team, SIGKILL itself at the point."""
    spec, url, run_id, task, kind, index, answers = argv
    factory = _factory(spec)

    async def main() -> None:
        with Store(url) as store:
            setup = _Setup(factory, spec, task, store, json.loads(answers))
            point = _Point("after" if kind == "after" else "turn", int(index), None)
            with _Trap(store, run_id, point, _die).installed():
                await setup.drive(run_id, _fresh(factory, run_id, store))

    asyncio.run(main())
    return 0
