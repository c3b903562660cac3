"""A tool call's record that cannot be written (a lost lease, a database error, a result JSON cannot
hold) ends the turn; a tool call's arguments that cannot be recorded (not an object, a lone
surrogate) are called as the unwrapped workbench would; none of them leaves the agent waiting
forever. A call record that a database fault kept out of the store leaves the run interrupted, not
failed, and its resume does not pay for the call again.

``AssistantAgent`` runs its tool calls in a task that signals their end on a queue; a workbench call
that raises never signals it, and the agent waits forever. A recorded workbench must therefore not
raise from a tool call: the failure is kept, and the turn's next recorded call (here its next model
call), or the end of the attempt, raises it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core.models import CreateResult, LLMMessage
from autogen_core.tools import FunctionTool, StaticWorkbench

from agents import OPEN_TEAMS, close_stores
from graphflow_durable import DurableGraphFlow, RetryPolicy
from graphflow_durable.errors import LeaseLostError, NotSerializableError, StoreError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from scripted_model import CLERK_SCRIPT, ScriptedModel, append_line, ledger_tools

#: A run that fails must end within this many seconds (a hang fails the test).
BOUND = 30.0


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _team(
    url: str,
    log: Path,
    run_id: str,
    *,
    model: ScriptedModel | None = None,
    tools: Sequence[FunctionTool] | None = None,
    record_calls: bool = True,
    **options: Any,
) -> DurableGraphFlow:
    clerk = AssistantAgent(
        "clerk",
        model_client=model or ScriptedModel("clerk", CLERK_SCRIPT, log=log),
        tools=ledger_tools(log) if tools is None else list(tools),
        max_tool_iterations=options.pop("max_tool_iterations", 3),
    )
    graph = DiGraphBuilder().add_node(clerk).build()
    team = DurableGraphFlow([clerk], graph, store=url, run_id=run_id, record_calls=record_calls, **options)
    OPEN_TEAMS.append(team)
    return team


def _lines(log: Path) -> list[list[str]]:
    return [line.split()[1:] for line in log.read_text().splitlines()] if log.exists() else []


def _fail_tool_records(team: DurableGraphFlow, error: Exception) -> None:
    """Every tool call's record raises ``error`` (model calls are recorded as usual)."""
    calls = team.store.calls
    record = calls.record

    def failing(rec: Any, *, fencing_token: int | None) -> Any:
        if rec.kind == "tool":
            raise error
        return record(rec, fencing_token=fencing_token)

    calls.record = failing  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "error",
    [
        LeaseLostError("run r: lease lost (test)", run_id="r", token=1),
        StoreError("database unreachable (test)"),
    ],
    ids=["lease-lost", "store-error"],
)
async def test_a_tool_record_that_cannot_be_written_ends_the_turn_before_its_next_model_call(
    store_url: str, tmp_path: Path, error: Exception
) -> None:
    log = tmp_path / "exec.log"
    team = _team(store_url, log, "faulty")
    _fail_tool_records(team, error)
    # Not a hang: the run ends with the error (a lost lease as itself; another as GraphFlow passes
    # an agent's error on, in a RuntimeError's text).
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(team.run(task="Refund order A17."), 30)
    assert raised.value is error or type(error).__name__ in str(raised.value)
    lines = [line.split()[1:] for line in log.read_text().splitlines()]
    # The first tool ran (its record failed); no model call went out after it, no other tool ran.
    assert lines == [["model", "clerk", "0"], ["lookup_order", "A17"]]


async def test_a_tool_record_that_cannot_be_written_fails_the_turn_when_it_is_the_turns_last_call(
    store_url: str, tmp_path: Path
) -> None:
    """No model call follows the tool call (one tool iteration, no reflection): the turn does not end
    as answered with its tool call unrecorded; it fails with the record's error at its end."""
    log = tmp_path / "exec.log"
    team = _team(store_url, log, "last", max_tool_iterations=1)
    error = StoreError("database unreachable (test)")
    _fail_tool_records(team, error)
    with pytest.raises(StoreError) as raised:
        await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert raised.value is error
    assert team.run_info().status == "interrupted"  # a database fault, not the run's failure
    assert _lines(log) == [["model", "clerk", "0"], ["lookup_order", "A17"]]


class _RawArguments(ScriptedModel):
    """The clerk's model, whose ``lookup_order`` call carries ``raw`` as its arguments' JSON text."""

    def __init__(self, raw: str, log: Path) -> None:
        super().__init__("clerk", CLERK_SCRIPT, log=log)
        self.raw = raw

    def answer(self, messages: Sequence[LLMMessage]) -> CreateResult:
        result = super().answer(messages)
        if isinstance(result.content, list) and result.content[0].name == "lookup_order":
            call = dataclasses.replace(result.content[0], arguments=self.raw)
            result = result.model_copy(update={"content": [call]})
        return result


def _tools(ledger: Path, *, order: str = "2 items, paid 40.00") -> list[FunctionTool]:
    """The ledger tools, whose ``lookup_order`` takes any JSON value and answers ``order``."""

    async def lookup_order(order_id: Any) -> str:
        append_line(ledger, "lookup_order", ascii(order_id))
        return f"order {order_id!a}: {order}"

    async def issue_refund(order_id: str, amount: float) -> str:
        append_line(ledger, "issue_refund", order_id, amount)
        return f"refunded {amount:.2f} on {order_id}"

    return [
        FunctionTool(lookup_order, description="Look an order up."),
        FunctionTool(issue_refund, "Refund."),
    ]


@pytest.mark.parametrize("record_calls", [False, True], ids=["unrecorded", "recorded"])
@pytest.mark.parametrize(
    "raw", ["5", "[1, 2]", '{"order_id": "\\ud800"}'], ids=["number", "array", "surrogate"]
)
async def test_tool_arguments_that_cannot_be_recorded_end_the_turn_as_the_unwrapped_call_does(
    store_url: str, tmp_path: Path, raw: str, record_calls: bool
) -> None:
    """Arguments that are not an object fail the tool's validation, as AutoGen's workbench reports
    it, and the model goes on; a lone surrogate (JSON cannot store it) reaches the tool, which runs
    unrecorded. Either way the run finishes as without recording, instead of hanging."""
    log = tmp_path / "exec.log"
    model = _RawArguments(raw, log)
    team = _team(store_url, log, "args", model=model, tools=_tools(log), record_calls=record_calls)
    result = await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert team.run_info().status == "finished"
    final = result.messages[-1].to_text()
    assert final.startswith("Refund done (") and "refunded 40.00 on A17" in final
    looked_up = [["lookup_order", "'\\ud800'"]] if "ud800" in raw else []
    assert _lines(log) == [
        ["model", "clerk", "0"],
        *looked_up,
        ["model", "clerk", "1"],
        ["issue_refund", "A17", "40.0"],
        ["model", "clerk", "2"],
    ]
    if record_calls:
        tools = [c for c in team.store.calls.list("args") if c.kind == "tool"]
        # The refund is recorded; the lookup too when its arguments could be recorded (its error).
        assert [c.name for c in tools] == (
            ["issue_refund"] if looked_up else ["lookup_order", "issue_refund"]
        )


@pytest.mark.parametrize("record_calls", [False, True], ids=["unrecorded", "recorded"])
async def test_a_tool_result_that_json_cannot_hold_fails_the_run_with_not_serializable_error(
    store_url: str, tmp_path: Path, record_calls: bool
) -> None:
    log = tmp_path / "exec.log"
    team = _team(store_url, log, "result", tools=_tools(log, order="\ud800"), record_calls=record_calls)
    with pytest.raises((RuntimeError, NotSerializableError)) as raised:  # the agent's error, or itself
        await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    error = raised.value
    assert isinstance(error, NotSerializableError) or "NotSerializableError" in str(error), repr(error)
    assert team.run_info().status == "failed"
    if record_calls:  # the turn ends at its next call: the refund is never made
        assert _lines(log) == [["model", "clerk", "0"], ["lookup_order", "'A17'"]]
        assert [c.kind for c in team.store.calls.list("result")] == ["model"]


class _Fault:
    """A real database fault striking the record of one call (``target``: kind and ident): on SQLite,
    another connection holds the write lock (the store waits its 0.5 s busy timeout: "database is
    locked") and lets go once the record failed; on PostgreSQL, the server terminates the record's
    own connection just before its INSERT."""

    def __init__(self, url: str, admin: sa.Engine | None, target: tuple[str, str]) -> None:
        self.target = target
        self.sqlite = url.startswith("sqlite")
        self.url = f"{url}?timeout=0.5" if self.sqlite else url
        self._admin = admin
        self._armed = False
        self.struck = 0

    def arm(self, team: DurableGraphFlow) -> None:
        calls = team.store.calls
        record = calls.record

        def striking(rec: Any, *, fencing_token: int | None) -> Any:
            if self.struck or (rec.kind, rec.ident) != self.target:
                return record(rec, fencing_token=fencing_token)
            lock = None
            if self.sqlite:
                lock = sqlite3.connect(self.url.split("///")[1].split("?")[0], isolation_level=None)
                lock.execute("BEGIN IMMEDIATE")
            self._armed = True
            try:
                return record(rec, fencing_token=fencing_token)
            except StoreError:
                self.struck += 1
                raise
            finally:
                self._armed = False
                if lock is not None:
                    lock.execute("ROLLBACK")
                    lock.close()

        calls.record = striking  # type: ignore[method-assign]
        if not self.sqlite:
            sa.event.listen(sa.Engine, "before_cursor_execute", self._terminate)

    def _terminate(self, conn: sa.Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if not self._armed or not statement.lstrip().startswith("INSERT INTO graphflow_call_records"):
            return
        assert self._admin is not None
        sa.event.remove(sa.Engine, "before_cursor_execute", self._terminate)
        pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with self._admin.connect() as admin:
            ended = admin.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)}, 5000)").scalar()
        assert ended is True


@pytest.mark.parametrize("retry", [None, 3], ids=["no-policy", "retry-policy"])
@pytest.mark.parametrize("target", [("model", "1"), ("tool", "clerk-1-issue_refund")], ids=["model", "tool"])
async def test_a_database_fault_while_recording_a_call_interrupts_the_run_and_its_resume_pays_no_call_twice(
    store_url: str, tmp_path: Path, request: pytest.FixtureRequest, retry: int | None, target: tuple[str, str]
) -> None:
    """As a database fault on a commit: the run ends ``interrupted`` (not ``failed``, whatever the
    node's retry policy), and ``run()`` resumes it. The call whose record the fault kept out of the
    store was made: the resume replays it (written first), as every call recorded before it."""
    admin = None if store_url.startswith("sqlite") else request.getfixturevalue("postgres_admin")
    fault = _Fault(store_url, admin, target)
    log = tmp_path / "exec.log"
    team = _team(fault.url, log, "faulty", retry=retry)
    fault.arm(team)
    with pytest.raises(StoreError) as raised:
        await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert fault.struck == 1
    assert "recording a call" in str(raised.value)
    assert team.run_info().status == "interrupted"
    # The call was made, its record failed; a tool call's turn ended at its next model call.
    made = _CLERK_CALLS[:3] if target[0] == "model" else _CLERK_CALLS[:4]
    assert _lines(log) == made
    result = await asyncio.wait_for(team.run(), BOUND)
    assert team.run_info().status == "finished"
    assert result.messages[-1].to_text().startswith("Refund done (")
    assert _lines(log) == _CLERK_CALLS
    assert [(c.kind, c.outcome) for c in team.store.calls.list("faulty") if c.outcome == "live"] == [
        ("model", "live"),
        ("tool", "live"),
        ("model", "live"),
        ("tool", "live"),
        ("model", "live"),
    ]


#: The clerk's calls, each made once by a run that pays for nothing twice.
_CLERK_CALLS = [
    ["model", "clerk", "0"],
    ["lookup_order", "A17"],
    ["model", "clerk", "1"],
    ["issue_refund", "A17", "40.0"],
    ["model", "clerk", "2"],
]


def _flaky_tools(ledger: Path, error: Exception) -> list[FunctionTool]:
    """The ledger tools, whose first ``issue_refund`` raises ``error`` after its line (the bank
    dropped the connection); the next one refunds."""
    raised: list[Exception] = []

    async def lookup_order(order_id: str) -> str:
        append_line(ledger, "lookup_order", order_id)
        return f"order {order_id}: 2 items, paid 40.00"

    async def issue_refund(order_id: str, amount: float) -> str:
        append_line(ledger, "issue_refund", order_id, amount)
        if not raised:
            raised.append(error)
            raise error
        return f"refunded {amount:.2f} on {order_id}"

    return [
        FunctionTool(lookup_order, description="Look an order up."),
        FunctionTool(issue_refund, "Refund."),
    ]


@pytest.mark.parametrize("workbench", ["tools", "workbench"])
async def test_a_tool_exception_the_retry_policy_retries_fails_the_turn_and_the_retry_runs_only_that_call_again(
    store_url: str, tmp_path: Path, workbench: str
) -> None:
    """The tool's error result goes back to the agent; its next model call fails the attempt with
    the tool's exception instead of calling out. The retried attempt replays the calls made before
    (not paid twice) and runs the failed tool call again (its error result was not recorded)."""
    log = tmp_path / "exec.log"
    tools = _flaky_tools(log, ConnectionError("connection reset by the bank"))
    clerk = AssistantAgent(
        "clerk",
        model_client=ScriptedModel("clerk", CLERK_SCRIPT, log=log),
        **({"tools": tools} if workbench == "tools" else {"workbench": StaticWorkbench(tools)}),  # type: ignore[arg-type]
        max_tool_iterations=3,
    )
    graph = DiGraphBuilder().add_node(clerk).build()
    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    team = DurableGraphFlow([clerk], graph, store=store_url, run_id="flaky", record_calls=True, retry=policy)
    OPEN_TEAMS.append(team)
    result = await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert team.run_info().status == "finished"
    assert "refunded 40.00 on A17" in result.messages[-1].to_text()
    assert _lines(log) == [*_CLERK_CALLS[:4], ["issue_refund", "A17", "40.0"], ["model", "clerk", "2"]]
    failed = [s.data for s in team.store.load("flaky").steps if s.kind.value == "attempt_failed"]
    assert [(f["attempt"], f["error_type"], f["error"]) for f in failed] == [
        (1, "ConnectionError", "connection reset by the bank")
    ]


async def test_a_tool_exception_the_retry_policy_does_not_retry_goes_to_the_model_as_before(
    store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "exec.log"
    tools = _flaky_tools(log, ValueError("amount must be positive"))
    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    team = _team(store_url, log, "flaky", tools=tools, retry=policy)
    result = await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert team.run_info().status == "finished"
    assert "amount must be positive" in result.messages[-1].to_text()  # the model was told
    assert _lines(log) == _CLERK_CALLS
    assert not [s for s in team.store.load("flaky").steps if s.kind.value == "attempt_failed"]


@pytest.mark.parametrize("record_calls", [False, True], ids=["unrecorded", "recorded"])
async def test_a_turn_that_failed_inside_its_tool_loop_resumes_with_run_on_the_same_team(
    store_url: str, tmp_path: Path, record_calls: bool
) -> None:
    """The model call after a tool call raises (the agent's error fails the run, as in GraphFlow);
    run() on the same team object resumes the round and finishes it, instead of waiting forever
    (AutoGen's runtime kept an exception of the failed run's shutdown for its next start)."""

    class FailsAfterATool(ScriptedModel):
        failed = False

        async def create(self, messages: Sequence[LLMMessage], **options: Any) -> CreateResult:
            if self.tool_results(messages) and not self.failed:
                self.failed = True
                raise RuntimeError("the model provider is down")
            return await super().create(messages, **options)

    log = tmp_path / "exec.log"
    model = FailsAfterATool("clerk", CLERK_SCRIPT, log=log)
    team = _team(store_url, log, "loop", model=model, record_calls=record_calls)
    with pytest.raises(RuntimeError, match="the model provider is down"):
        await asyncio.wait_for(team.run(task="Refund order A17."), BOUND)
    assert team.run_info().status == "failed"
    result = await asyncio.wait_for(team.run(), BOUND)
    assert team.run_info().status == "finished"
    assert result.messages[-1].to_text().startswith("Refund done (")
    lookups = [line for line in _lines(log) if line[0] == "lookup_order"]
    assert len(lookups) == (1 if record_calls else 2)  # recorded: replayed, not made again
