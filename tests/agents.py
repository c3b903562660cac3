"""Deterministic agents and small graphs shared by the tests (the one set of test agents: the
legacy-fixture maker ``tests/fixtures/make_legacy.py`` and the worker-pool team
``tests/pool/poolteam.py`` build theirs from :class:`Scripted` too).

:class:`Scripted` answers with its name, its turn number and a digest of everything it was given,
so a lost or duplicated input, or a wrongly restored agent state (the turn number is its saved
state), shows in the transcript. Hooks let a test make a turn wait, fail, hang or look around;
:class:`Streaming` streams events (or hangs); the worker scripts of ``tests/crash`` and
``tests/pool`` log their turns with :func:`log_turn` and kill themselves with :func:`die`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import re
import signal
import sqlite3
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response, TerminationCondition
from autogen_agentchat.messages import (
    BaseAgentEvent,
    BaseChatMessage,
    ModelClientStreamingChunkEvent,
    TextMessage,
)
from autogen_agentchat.teams import DiGraph, DiGraphBuilder
from autogen_core import CancellationToken, Component
from pydantic import BaseModel

from graphflow_durable._storage.driver import CommitRequest
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store

Hook = Callable[["Scripted", Sequence[BaseChatMessage]], Awaitable[None]]


def digest_reply(agent: Scripted, messages: Sequence[BaseChatMessage], word: str) -> str:
    """``"<name>#<turn> saw <count>:<digest of the input> <word>"``: any change of input shows."""
    seen = hashlib.sha256("|".join(m.to_text() for m in messages).encode()).hexdigest()[:8]
    return f"{agent.name}#{agent.turn} saw {len(messages)}:{seen} {word}".rstrip()


def heard_reply(agent: Scripted, messages: Sequence[BaseChatMessage], word: str) -> str:
    """``"<name> turn <turn>: <word or ok> [<sources heard>]"``: the text of the legacy fixtures."""
    heard = ",".join(m.source for m in messages)
    return f"{agent.name} turn {agent.turn}: {word or 'ok'} [{heard}]"


#: Reply formats by name (a name, so that the component config stays JSON).
REPLIES: dict[str, Callable[[Scripted, Sequence[BaseChatMessage], str], str]] = {
    "digest": digest_reply,
    "heard": heard_reply,
}


class ScriptedConfig(BaseModel):
    name: str
    says: list[str] = []
    reply: str = "digest"


class TextAgent(BaseChatAgent):
    """A test agent that answers with a :class:`TextMessage` and has nothing to reset: a subclass
    writes ``on_messages`` (and ``on_reset`` when it holds something to forget)."""

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


class Scripted(TextAgent, Component[ScriptedConfig]):
    """A deterministic agent.

    Args:
        name: its name.
        says: what it adds on each turn (e.g. ``"again"``, ``"done"``, ``"STOP"``).
        reply: the reply format, a key of :data:`REPLIES` (``"digest"``, or ``"heard"`` for the
            legacy fixtures).
        calls: a list shared between teams; every call appends the agent's name (also a failing one).
        before: awaited at the start of every turn, after the turn counter moved (it may wait on an
            Event, record ``current_execution()``, or raise to simulate a crash of the turn).
    """

    component_config_schema = ScriptedConfig
    component_provider_override = "agents.Scripted"

    def __init__(
        self,
        name: str,
        says: Sequence[str] = (),
        *,
        reply: str = "digest",
        calls: list[str] | None = None,
        before: Hook | None = None,
    ) -> None:
        super().__init__(name, f"scripted agent {name}")
        if reply not in REPLIES:
            raise ValueError(f"unknown reply format {reply!r}: one of {sorted(REPLIES)}")
        self.turn = 0
        self.says = list(says)
        self.reply = reply
        self.calls = calls if calls is not None else []
        self.before = before
        self.token: CancellationToken | None = None

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        self.calls.append(self.name)
        self.turn += 1
        self.token = cancellation_token
        if self.before is not None:
            await self.before(self, messages)
        await asyncio.sleep(0)
        word = self.says[self.turn - 1] if self.turn <= len(self.says) else ""
        content = REPLIES[self.reply](self, messages, word)
        return Response(chat_message=TextMessage(content=content, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        self.turn = 0

    async def save_state(self) -> Mapping[str, Any]:
        return {"turn": self.turn}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.turn = int(state["turn"])

    def _to_config(self) -> ScriptedConfig:
        return ScriptedConfig(name=self.name, says=self.says, reply=self.reply)

    @classmethod
    def _from_config(cls, config: ScriptedConfig) -> Scripted:
        return cls(config.name, config.says, reply=config.reply)


# -- hooks ----------------------------------------------------------------------------------------


class Boom(RuntimeError):
    """What a failing agent raises."""


def fail_once(after: Hook | None = None) -> Hook:
    """Raise :class:`Boom` on the first call (after awaiting ``after``, if given); pass afterwards."""
    state = {"failed": False}

    async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if after is not None:
            await after(agent, messages)
        if not state["failed"]:
            state["failed"] = True
            raise Boom(f"{agent.name} crashed on purpose")

    return hook


def fail_on_turn(turn: int) -> Hook:
    """Raise :class:`Boom` the first time the agent reaches its ``turn``-th turn."""
    state = {"failed": False}

    async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if agent.turn == turn and not state["failed"]:
            state["failed"] = True
            raise Boom(f"{agent.name} crashed on purpose on turn {turn}")

    return hook


def failing(times: int, error: type[Exception] = ConnectionError, *, turn: int | None = None) -> Hook:
    """Raise ``error`` on the agent's first ``times`` calls (only on its ``turn``-th turn, when
    given), after its turn counter moved, as a half-done model call changes an agent's memory
    before it fails; pass afterwards."""
    left = {"n": times}

    async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if left["n"] > 0 and (turn is None or agent.turn == turn):
            left["n"] -= 1
            raise error(f"{agent.name}: connection reset by peer")

    return hook


def hanging(times: int) -> Hook:
    """Hang (yield nothing, for an hour) on the agent's first ``times`` calls; pass afterwards."""
    left = {"n": times}

    async def hook(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if left["n"] > 0:
            left["n"] -= 1
            await asyncio.sleep(3600)

    return hook


# -- worker processes -------------------------------------------------------------------------


def log_turn(*fields: object) -> None:
    """Append ``"<pid> <fields...>"`` to the file ``$GFD_EXEC_LOG`` names (if set), durably: the
    line survives the SIGKILL that may follow it."""
    path = os.environ.get("GFD_EXEC_LOG")
    if path:
        with open(path, "a") as f:
            f.write(" ".join(map(str, (os.getpid(), *fields))) + "\n")
            f.flush()
            os.fsync(f.fileno())


def die() -> None:
    """SIGKILL this process (as the kernel's OOM killer does: no clean-up runs)."""
    os.kill(os.getpid(), signal.SIGKILL)


class Streaming(TextAgent):
    """Yields a chunk every ``every`` seconds, ``chunks`` times, then answers ``"done"`` (or, with
    ``chunks=None``, yields one chunk after ``every`` seconds and then hangs). ``cancelled`` says
    whether its stream was cancelled."""

    def __init__(self, name: str, *, every: float, chunks: int | None) -> None:
        super().__init__(name, "streams")
        self.every = every
        self.chunks = chunks
        self.cancelled = False

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        raise NotImplementedError("streams only: GraphFlow calls on_messages_stream")

    async def on_messages_stream(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> AsyncGenerator[BaseAgentEvent | BaseChatMessage | Response, None]:
        try:
            if self.chunks is None:
                await asyncio.sleep(self.every)
                yield ModelClientStreamingChunkEvent(content="thinking", source=self.name)
                await asyncio.Event().wait()  # hangs: no event ever again
            for i in range(self.chunks or 0):
                await asyncio.sleep(self.every)
                yield ModelClientStreamingChunkEvent(content=str(i), source=self.name)
            yield Response(chat_message=TextMessage(content="done", source=self.name))
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Ticker:
    """Counts the event loop's 10 ms ticks while it runs (``async with Ticker() as ticker``): a loop
    blocked by a call does not tick. ``ticks`` may be read and reset from another thread."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class Gate:
    """A turn that announces it started and then waits until the test opens the gate.

    With ``turn`` given, only the agent's ``turn``-th turn waits; the others pass. Like a model
    call, the wait ends when the turn is cancelled, unless ``cancellable=False`` (the turn then
    answers once the gate opens, even after a cancellation).
    """

    def __init__(self, turn: int | None = None, *, cancellable: bool = True) -> None:
        self.turn = turn
        self.cancellable = cancellable
        self.started = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        if self.turn is not None and agent.turn != self.turn:
            return
        self.started.set()
        waiting = asyncio.ensure_future(self.opened.wait())
        if self.cancellable and agent.token is not None:
            agent.token.link_future(waiting)  # like a model call, the wait honours cancellation
        await waiting

    def open(self) -> None:
        self.opened.set()

    async def reached(self, running: asyncio.Future[Any] | None = None, timeout: float = 60.0) -> None:
        """Wait until a turn waits at the gate. ``running`` (the run's task): if it ends first, fail
        with how it ended rather than a bare timeout. ``timeout`` only bounds a hang: a loaded
        machine may take seconds to get there."""
        started = asyncio.ensure_future(self.started.wait())
        waiting: set[asyncio.Future[Any]] = {started} if running is None else {started, running}
        try:
            await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if self.started.is_set():
            return
        if running is not None and running.done():
            error = None if running.cancelled() else running.exception()
            raise AssertionError(f"the run ended before any turn reached the gate: {error!r}") from error
        raise TimeoutError(f"no turn reached the gate within {timeout} s")


# -- graphs -----------------------------------------------------------------------------------


def chain(*agents: Scripted) -> DiGraph:
    """agents[0] -> agents[1] -> ... -> agents[-1]."""
    b = DiGraphBuilder()
    for agent in agents:
        b.add_node(agent)
    for source, target in itertools.pairwise(agents):
        b.add_edge(source, target)
    b.set_entry_point(agents[0])
    return b.build()


def fan(a: Scripted, b1: Scripted, b2: Scripted, d: Scripted) -> DiGraph:
    """a -> (b1, b2) -> d, d waiting for both."""
    b = DiGraphBuilder()
    for agent in (a, b1, b2, d):
        b.add_node(agent)
    b.add_edge(a, b1).add_edge(a, b2).add_edge(b1, d).add_edge(b2, d)
    b.set_entry_point(a)
    return b.build()


def loop_graph(agents: Mapping[str, Scripted]) -> DiGraph:
    """Fan-out S->(P1,P2), join ->J, loop J->R->J ("any", while R says "again"), exit R->E."""
    s, p1, p2, j, r, e = (agents[n] for n in ("S", "P1", "P2", "J", "R", "E"))
    b = DiGraphBuilder()
    for agent in (s, p1, p2, j, r, e):
        b.add_node(agent)
    b.add_edge(s, p1).add_edge(s, p2)
    b.add_edge(p1, j, activation_group="join").add_edge(p2, j, activation_group="join")
    b.add_edge(j, r)
    b.add_edge(r, j, condition="again", activation_group="loop", activation_condition="any")
    b.add_edge(r, e, condition="done")
    b.set_entry_point(s)
    return b.build()


LOOP_SAYS = {"R": ["again", "again", "done"]}


def loop_agents(calls: list[str], hooks: Mapping[str, Hook] | None = None) -> dict[str, Scripted]:
    hooks = hooks or {}
    return {
        n: Scripted(n, LOOP_SAYS.get(n, ()), calls=calls, before=hooks.get(n))
        for n in ("S", "P1", "P2", "J", "R", "E")
    }


def durable(
    agents: Sequence[Scripted] | Mapping[str, Scripted],
    graph: DiGraph,
    url: str | Store,
    run_id: str,
    termination: TerminationCondition | None = None,
    **kwargs: Any,
) -> DurableGraphFlow:
    participants = list(agents.values()) if isinstance(agents, Mapping) else list(agents)
    team = DurableGraphFlow(
        participants, graph, termination_condition=termination, store=url, run_id=run_id, **kwargs
    )
    OPEN_TEAMS.append(team)
    return team


OPEN_TEAMS: list[DurableGraphFlow] = []


def close_stores() -> None:
    """Close the stores of every team :func:`durable` made (call it at the end of each test)."""
    while OPEN_TEAMS:
        team = OPEN_TEAMS.pop()
        if team._session.opened_store is not None:
            team._session.opened_store.close()


def text(messages: Sequence[BaseAgentEvent | BaseChatMessage]) -> list[tuple[str, str]]:
    """``[(source, content)]`` of the chat messages of a result."""
    return [(m.source, m.to_text()) for m in messages if isinstance(m, BaseChatMessage)]


def stored_transcript(team: DurableGraphFlow) -> list[tuple[str, str]]:
    """``[(source, content)]`` of the run's whole stored thread."""
    log = team.store.load(team.run_id)
    return [(str(m.body["source"]), str(m.body.get("content"))) for m in log.messages]


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds (fail after ``timeout`` seconds)."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)


# -- spying on a team ---------------------------------------------------------------------------


class CommitSpy:
    """Records every commit a team makes: kind, node, message sources, the states it wrote (as the
    store holds them after it), scheduler and data."""

    def __init__(self, team: DurableGraphFlow) -> None:
        self.commits: list[dict[str, Any]] = []
        store = team.store
        driver = store._driver
        commit, submit_commit = driver.commit, driver.submit_commit

        def record(request: CommitRequest, head: int) -> None:
            step = request.step
            written = [s.node for s in request.agent_states]
            # The states as the store holds them after this commit (rows may be splices).
            held = store.load(request.run_id).agent_states if written else {}
            self.commits.append(
                {
                    "kind": step.kind,
                    "node": step.node,
                    "sources": [m.body["source"] for m in request.messages],
                    "states": {node: dict(held[node]) for node in written},
                    "scheduler": dict(step.scheduler),
                    "data": dict(step.data),
                    "head": head,
                }
            )

        def spied_commit(request: CommitRequest) -> int:
            head = commit(request)
            record(request, head)
            return head

        def spied_submit(request: CommitRequest) -> asyncio.Future[int]:
            future = submit_commit(request)

            def done(f: asyncio.Future[int]) -> None:  # runs before the committer resumes
                if not f.cancelled() and f.exception() is None:
                    record(request, f.result())

            future.add_done_callback(done)
            return future

        driver.commit = spied_commit  # type: ignore[method-assign]
        driver.submit_commit = spied_submit  # type: ignore[method-assign]

    def completed(self, node: str) -> bool:
        return any(c["kind"] == "complete" and c["node"] == node for c in self.commits)


def capture_manager(team: DurableGraphFlow) -> list[Any]:
    """A list that receives the team's group chat manager when the team initialises."""
    managers: list[Any] = []
    original = team._create_group_chat_manager_factory

    def patched(*args: Any, **kwargs: Any) -> Callable[[], Any]:
        factory = original(*args, **kwargs)

        def make() -> Any:
            manager = factory()
            managers.append(manager)
            return manager

        return make

    team._create_group_chat_manager_factory = patched  # type: ignore[method-assign]
    return managers


def manager_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The manager's entry of a saved team state."""
    return next(s for s in state["agent_states"].values() if "message_thread" in s)


@contextlib.contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The statements the database runs for ``store`` inside the block, as the database saw them:
    SQLite's statement text (its trace callback), PostgreSQL's command tags (libpq's trace of the
    protocol: ``INSERT 0 3`` is one statement that inserted three rows)."""
    seen: list[str] = []
    engine = store._e.engine
    trace = tempfile.TemporaryFile()  # noqa: SIM115 -- libpq writes to it until the block ends

    def checkout(dbapi: Any, _record: Any, _proxy: Any) -> None:
        if isinstance(dbapi, sqlite3.Connection):
            dbapi.set_trace_callback(seen.append)
        else:
            dbapi.pgconn.trace(trace.fileno())

    def checkin(dbapi: Any, _record: Any) -> None:
        if not isinstance(dbapi, sqlite3.Connection) and dbapi is not None:
            dbapi.pgconn.untrace()

    sa.event.listen(engine, "checkout", checkout)
    sa.event.listen(engine, "checkin", checkin)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "checkout", checkout)
        sa.event.remove(engine, "checkin", checkin)
        with trace:
            trace.seek(0)
            seen += re.findall(r'\tCommandComplete\t "([^"]*)"', trace.read().decode(errors="replace"))
