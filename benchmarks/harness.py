"""Shared pieces of the benchmark: agents, graph shapes, configurations, single measurements.

Imported by ``run.py`` (the orchestrator), ``resume_worker.py`` (cold resume in a new process)
and ``profile_loop.py``. Everything here builds a team the same way in every process, so a run
written by one process can be reopened by another.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import inspect
import itertools
import os
import sqlite3
import time
import tracemalloc
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow
from autogen_core import CancellationToken

from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store

#: The ``+policy`` configurations: a retry and a timeout policy on every node, never triggered (no
#: agent fails, none comes near 60 s): what a policy costs a transition that does not need it.
POLICY: dict[str, Any] = {"retry": {"*": 3}, "timeout": {"*": 60.0}}


def has_policies() -> bool:
    """Whether this tree's DurableGraphFlow takes ``retry=``/``timeout=`` (a tree before them,
    measured with ``PYTHONPATH``, does not: its ``+policy`` column is skipped)."""
    return "retry" in inspect.signature(DurableGraphFlow.__init__).parameters


EXIT_MARK = "!exit!"  # never produced by base64 text; the cycles' exit condition looks for it
FANOUT_WIDTH = 4


def random_text(size: int) -> str:
    """``size`` characters of incompressible text, different on every call."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


def has_replay_client() -> bool:
    try:
        from autogen_ext.models.replay import ReplayChatCompletionClient  # noqa: F401
    except ImportError:
        return False
    return True


def has_langgraph() -> bool:
    try:
        import langgraph.checkpoint.sqlite
        import langgraph.graph  # noqa: F401
    except ImportError:
        return False
    return True


class TextAgent(BaseChatAgent):
    """A trivial deterministic agent: answers every request with ``size`` fresh random characters,
    after ``latency`` seconds of waiting (as for a model's answer; 0: at once)."""

    def __init__(self, name: str, size: int, latency: float = 0.0) -> None:
        super().__init__(name, f"benchmark agent {name}")
        self.size = size
        self.latency = latency

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        if self.latency:
            await asyncio.sleep(self.latency)
        return Response(chat_message=TextMessage(content=random_text(self.size), source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


def _agent(kind: str, name: str, size: int, turns: int, latency_ms: int = 0) -> Any:
    if kind == "text":
        return TextAgent(name, size, latency_ms / 1000)
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.replay import ReplayChatCompletionClient

    # Scripted answers; the model context (the agent's saved state) grows by two messages a turn.
    client = ReplayChatCompletionClient([random_text(size) for _ in range(turns + 1)])
    return AssistantAgent(name, model_client=client, system_message="You are a benchmark agent.")


def _not_exit(message: BaseChatMessage) -> bool:
    return EXIT_MARK not in message.to_text()


def _exit(message: BaseChatMessage) -> bool:
    return EXIT_MARK in message.to_text()


@dataclass(frozen=True)
class Case:
    """One workload: a graph shape, its size N (agent completions), message size and agent kind."""

    shape: str  # "loop" | "chain" | "fanout"
    n: int
    size: int
    agent: str = "text"  # "text" | "assistant"
    latency_ms: int = 0  # text agents: each answer waits this long (as for a model's answer)

    @property
    def key(self) -> str:
        wait = f"/latency={self.latency_ms}ms" if self.latency_ms else ""
        return f"{self.shape}/{self.agent}/n={self.n}/size={self.size}{wait}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "n": self.n,
            "size": self.size,
            "agent": self.agent,
            "latency_ms": self.latency_ms,
        }


def build_team(
    case: Case, *, durable: Store | None = None, run_id: str | None = None, **options: Any
) -> GraphFlow:
    """The case's team: plain GraphFlow, or DurableGraphFlow on ``durable`` (with ``options``:
    ``lease_owner``, ``lease_seconds``... as a worker's team factory receives them).

    - loop: A -> B -> A (conditional, exit to X), bounded by MaxMessageTermination(N + 1);
    - chain: a0 -> a1 -> ... -> a(N-1), ends by itself after N completions;
    - fanout: S -> W1..W4 -> J -> S (conditional, exit to X), bounded by max_turns (~N completions).
    """
    b = DiGraphBuilder()
    termination = None
    max_turns = None
    if case.shape == "loop":
        turns = case.n // 2 + 1
        a, bb, x = (_agent(case.agent, n, case.size, turns, case.latency_ms) for n in ("A", "B", "X"))
        for p in (a, bb, x):
            b.add_node(p)
        b.add_edge(a, bb)
        b.add_edge(bb, a, condition=_not_exit)
        b.add_edge(bb, x, condition=_exit)
        b.set_entry_point(a)
        participants = [a, bb, x]
        termination = MaxMessageTermination(case.n + 1)
    elif case.shape == "chain":
        participants = [_agent(case.agent, f"a{i}", case.size, 1, case.latency_ms) for i in range(case.n)]
        for p in participants:
            b.add_node(p)
        for p, q in itertools.pairwise(participants):
            b.add_edge(p, q)
        b.set_entry_point(participants[0])
    elif case.shape == "fanout":
        rounds = case.n // (FANOUT_WIDTH + 2) + 2
        s = _agent(case.agent, "S", case.size, rounds, case.latency_ms)
        workers = [
            _agent(case.agent, f"W{i}", case.size, rounds, case.latency_ms) for i in range(FANOUT_WIDTH)
        ]
        j = _agent(case.agent, "J", case.size, rounds, case.latency_ms)
        x = _agent(case.agent, "X", case.size, 1, case.latency_ms)
        participants = [s, *workers, j, x]
        for p in participants:
            b.add_node(p)
        for w in workers:
            b.add_edge(s, w)
            b.add_edge(w, j)
        b.add_edge(j, s, condition=_not_exit)
        b.add_edge(j, x, condition=_exit)
        b.set_entry_point(s)
        # Bounded by batches, not messages: plain GraphFlow shows its termination condition only
        # the last answer of a parallel batch, so a message count would bound the two differently.
        max_turns = 3 * -(-case.n // (FANOUT_WIDTH + 2))
    else:
        raise ValueError(f"unknown shape {case.shape!r}")
    graph = b.build()
    if durable is None:
        return GraphFlow(participants, graph, termination_condition=termination, max_turns=max_turns)
    return DurableGraphFlow(
        participants,
        graph,
        termination_condition=termination,
        max_turns=max_turns,
        store=durable,
        run_id=run_id,
        **options,
    )


# -- database sizes ---------------------------------------------------------------------------------


def sqlite_bytes(path: Path) -> int:
    """The database's size once its WAL is checkpointed into it (db + whatever WAL remains)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    total = 0
    for suffix in ("", "-wal"):
        p = Path(f"{path}{suffix}")
        if p.exists():
            total += p.stat().st_size
    return total


def postgres_bytes(store: Store) -> int:
    import sqlalchemy as sa

    engine = store._e.engine
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "WHERE c.relname LIKE 'graphflow_%' AND c.relkind = 'r'"
                )
            ).scalar()
            or 0
        )


# -- one measured run --------------------------------------------------------------------------------


@dataclass
class RunResult:
    seconds: float
    transitions: int
    db_bytes: int | None = None
    peak_bytes: int | None = None
    run_id: str | None = None
    db_url: str | None = None
    state_path: str | None = None
    state_bytes: int | None = None


TASK = "benchmark task"


async def run_graphflow(
    case: Case,
    config: str,
    workdir: Path,
    *,
    postgres_url: str | None = None,
    trace_memory: bool = False,
    save_plain_state: bool = False,
) -> RunResult:
    """Run the case once under ``config`` (plain | sqlite-full | sqlite-normal | postgres; a durable
    one with ``+policy``: :data:`POLICY` on every node).

    The store is opened (schema created) and the team constructed before the clock starts; the
    clock covers ``team.run()``: run creation, every transition and the final commit.
    """
    store: Store | None = None
    db_path: Path | None = None
    empty = 0
    run_id = uuid.uuid4().hex
    url = None
    name = config.replace("+", "-")
    config, _, extra = config.partition("+")
    options = POLICY if extra == "policy" else {}
    if config.startswith("sqlite-"):
        db_path = workdir / f"{name}-{run_id}.db"
        url = f"sqlite:///{db_path}"
        store = Store(url, synchronous=config.split("-", 1)[1].upper())
        empty = sqlite_bytes(db_path)
    elif config == "postgres":
        assert postgres_url
        url = postgres_url
        store = Store(postgres_url)
        empty = postgres_bytes(store)
    team = build_team(case, durable=store, run_id=run_id, **options)
    gc.collect()
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    result = await team.run(task=TASK)
    seconds = time.perf_counter() - t0
    peak = None
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out = RunResult(seconds=seconds, transitions=len(result.messages) - 1, peak_bytes=peak)
    if save_plain_state and store is None:
        import json

        text = json.dumps(await team.save_state())
        path = workdir / f"plain-{run_id}.json"
        path.write_text(text)
        out.state_path, out.state_bytes = str(path), len(text.encode())
    if store is not None:
        store.close()
        if db_path is not None:
            out.db_bytes = sqlite_bytes(db_path) - empty
        else:
            reopened = Store(url)  # type: ignore[arg-type]
            out.db_bytes = postgres_bytes(reopened) - empty
            reopened.close()
        out.run_id, out.db_url = run_id, url
    return out


async def commit_parts(
    case: Case, config: str, workdir: Path, *, postgres_url: str | None = None
) -> dict[str, Any]:
    """Where a commit's time goes, without a profiler: ``case`` run twice under ``config`` (sqlite-full,
    sqlite-normal or postgres). The first run counts the statements the database executes (SQLite's
    trace callback; libpq's protocol trace on PostgreSQL: its command tags), the second times the
    commit path's parts: ``encode_commit`` (JSON and, inside it, the checksums) on the event loop,
    and the writer's transaction (BEGIN to COMMIT, on PostgreSQL also the followers' notification;
    inline on the loop at NORMAL, on the writer thread at FULL and on PostgreSQL). Per commit
    (every item the writer wrote, the run's creation included); microseconds."""
    import sys

    from graphflow_durable._storage import driver, writer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from agents import statements  # the tests' counter: SQLite's trace callback, libpq's command tags

    url = postgres_url if config == "postgres" else f"sqlite:///{workdir / f'parts-{uuid.uuid4().hex}.db'}"
    assert url is not None
    sync = {} if config == "postgres" else {"synchronous": config.split("-", 1)[1].upper()}
    store = Store(url, **sync)
    with statements(store) as seen:
        await build_team(case, durable=store, run_id=uuid.uuid4().hex).run(task=TASK)
        store.close()  # its kept connection checked in: the whole run is in ``seen``
    per_commit = len(seen) / store._writer.commits

    spent = {"encode": 0.0, "checksums": 0.0, "transaction": 0.0}

    def timed(part: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - t0

        return wrapper

    originals = (driver.encode_commit, driver.add_sums, writer.CommitWriter._transaction)
    driver.encode_commit = timed("encode", driver.encode_commit)
    driver.add_sums = timed("checksums", driver.add_sums)
    writer.CommitWriter._transaction = timed("transaction", writer.CommitWriter._transaction)  # type: ignore[method-assign]
    try:
        store = Store(url, **sync)
        team = build_team(case, durable=store, run_id=uuid.uuid4().hex)
        gc.collect()
        await team.run(task=TASK)
        store.close()
    finally:
        driver.encode_commit, driver.add_sums, writer.CommitWriter._transaction = originals  # type: ignore[method-assign]
    commits = store._writer.commits
    return {
        "config": config,
        "case": case.key,
        "commits": commits,
        "statements_per_commit": per_commit,
        "transaction_us": spent["transaction"] * 1e6 / commits,
        "encoding_us": spent["encode"] * 1e6 / commits,
        "checksums_us": spent["checksums"] * 1e6 / commits,
    }


def raw_commit(workdir: Path, size: int, synchronous: str, count: int) -> dict[str, float]:
    """The floor: one SQLAlchemy INSERT + COMMIT of ``size`` random characters, same pragmas as the store.

    WAL, ``BEGIN IMMEDIATE``, ``synchronous`` as given; returns the median and mean per commit (ms).
    """
    import statistics

    import sqlalchemy as sa
    from sqlalchemy import event

    path = workdir / f"raw-{synchronous}-{uuid.uuid4().hex}.db"
    engine = sa.create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute(f"PRAGMA synchronous={synchronous}")

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    meta = sa.MetaData()
    table = sa.Table("t", meta, sa.Column("id", sa.Integer, primary_key=True), sa.Column("body", sa.Text))
    meta.create_all(engine)
    insert = table.insert()
    bodies = [random_text(size) for _ in range(count)]
    times = []
    for body in bodies:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(insert, {"body": body})
        times.append(time.perf_counter() - t0)
    engine.dispose()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return {"median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3}


def has_call_records() -> bool:
    """Whether this tree's store records model and tool calls (``store.calls``)."""
    return hasattr(Store, "calls")


async def recorded_call(
    config: str, workdir: Path, size: int, count: int, *, postgres_url: str | None = None
) -> dict[str, float]:
    """The cost of one recorded model call as a driver writes it: ``store.calls.record`` of a
    ``size``-character result, fenced by the run's lease token (a row and a commit), ``count`` times
    in a row on one run (sqlite-full | sqlite-normal | postgres); median and mean per record (ms).

    The run is made by a one-node durable team first (not timed); the lease is then taken as a
    driver takes it, for its fencing token.
    """
    import json
    import statistics

    from graphflow_durable._model.records import CallRecord

    run_id = uuid.uuid4().hex
    db_path: Path | None = None
    if config.startswith("sqlite-"):
        db_path = workdir / f"calls-{config}-{run_id}.db"
        store = Store(f"sqlite:///{db_path}", synchronous=config.split("-", 1)[1].upper())
    else:
        assert postgres_url
        store = Store(postgres_url)
    try:
        await build_team(Case("chain", 1, 100), durable=store, run_id=run_id).run(task=TASK)
        token = store._driver.acquire_lease(run_id, "bench", lease_seconds=600)
        results = [json.dumps({"content": random_text(size), "finish_reason": "stop"}) for _ in range(count)]
        times = []
        for ordinal, result in enumerate(results):
            record = CallRecord(
                run_id=run_id,
                turn_key=f"{run_id}/a0/1",
                node="a0",
                step=1,
                attempt=1,
                kind="model",
                name="bench-model",
                ident=str(ordinal),
                fingerprint=uuid.uuid4().hex * 2,
                outcome="live",
                result=result,
                prompt_tokens=size // 4,
                completion_tokens=size // 4,
                created_at=time.time(),
            )
            t0 = time.perf_counter()
            store.calls.record(record, fencing_token=token)
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
        if db_path is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    return {"median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3}


# -- LangGraph peer ----------------------------------------------------------------------------------


def _langgraph_state() -> Any:
    from typing import Annotated, TypedDict

    from langgraph.graph.message import add_messages

    # Built at run time (not in annotations) so ``from __future__ import annotations`` does not hide it.
    return TypedDict("State", {"messages": Annotated[list, add_messages]})


def run_langgraph(case: Case, workdir: Path, *, checkpointed: bool, trace_memory: bool = False) -> RunResult:
    """Two nodes alternating N steps over a message list (add_messages), bare or with SqliteSaver."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph

    State = _langgraph_state()
    n, size = case.n, case.size

    def node(name: str) -> Any:
        def step(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [AIMessage(content=random_text(size), name=name)]}

        return step

    def route(state: dict[str, Any]) -> str:
        return END if len(state["messages"]) > n else "A"

    def route_a(state: dict[str, Any]) -> str:
        return END if len(state["messages"]) > n else "B"

    g = StateGraph(State)
    g.add_node("A", node("A"))
    g.add_node("B", node("B"))
    g.add_edge(START, "A")
    g.add_conditional_edges("A", route_a)
    g.add_conditional_edges("B", route)
    conn = None
    db_path = None
    saver = None
    if checkpointed:
        from langgraph.checkpoint.sqlite import SqliteSaver

        db_path = workdir / f"langgraph-{uuid.uuid4().hex}.db"
        conn = sqlite3.connect(db_path, check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
    app = g.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": n + 10}
    gc.collect()
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    out = app.invoke({"messages": [("user", TASK)]}, config)
    seconds = time.perf_counter() - t0
    peak = None
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    result = RunResult(seconds=seconds, transitions=len(out["messages"]) - 1, peak_bytes=peak)
    if conn is not None and db_path is not None:
        conn.close()
        result.db_bytes = sqlite_bytes(db_path)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    return result
