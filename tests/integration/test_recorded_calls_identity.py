"""Which record a resumed turn's tool call replays, on SQLite and PostgreSQL: calls that share one
call id (scripted clients, Ollama's per-client numbering, servers that send ``""`` for every id)
each get their own record, in the order the agent made them; a tool record whose id, name and
arguments match is replayed even after a model divergence earlier in the turn; a tool that acts
again because of a discarded record says so in a WARNING; a call-record row changed outside the
store stops the resume; a tool can read its own call (``current_tool_call``).

The "crash" is the one of ``test_recorded_calls``: an error just after a model call's record is
committed, which fails the turn; a fresh team then resumes it (attempt 2)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import CreateResult, FunctionExecutionResultMessage, LLMMessage, RequestUsage
from autogen_core.tools import FunctionTool, StaticWorkbench

from agents import close_stores
from graphflow_durable import StoreCorruptError, ToolCallContext, current_execution, current_tool_call

from .test_recorded_calls import OPEN, Ran, ScriptedModel, assistant, crashed, rows, team_of

__all__ = ["OPEN"]


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


#: A step of a script: the calls of one model answer, ``(call id, tool, arguments)`` each.
Calls = list[tuple[str, str, dict[str, Any]]]


class Batches(ScriptedModel):
    """Answers the n-th model call of a turn (n = the tool-result messages the request holds) with
    ``script[n]``: the tool calls of one answer (run in parallel by the agent), or the final text."""

    def __init__(self, calls: list[int], script: Sequence[Calls | str]) -> None:
        super().__init__(calls)
        self.script = list(script)

    def _answer(self, messages: Sequence[LLMMessage]) -> CreateResult:
        position = sum(isinstance(m, FunctionExecutionResultMessage) for m in messages)
        self.calls.append(position)
        step = self.script[position]
        usage = RequestUsage(prompt_tokens=100 + position, completion_tokens=10 + position)
        if isinstance(step, str):
            return CreateResult(finish_reason="stop", content=step, usage=usage, cached=False)
        content = [FunctionCall(id=i, name=n, arguments=json.dumps(a)) for i, n, a in step]
        return CreateResult(finish_reason="function_calls", content=content, usage=usage, cached=False)


class Ledger:
    """Tools whose side effect is a line on the ledger: ``pay`` (its result numbers the payment in
    the order payments finished) and ``add``."""

    def __init__(self, slow_first: bool = False) -> None:
        self.lines: list[str] = []
        self.slow_first = slow_first  # the first payment started finishes after the second

    def tools(self) -> list[FunctionTool]:
        started: list[int] = []

        async def pay(to: str, amount: int) -> str:
            """Pay someone."""
            started.append(amount)
            if self.slow_first and len(started) == 1:
                await asyncio.sleep(0.2)
            self.lines.append(f"pay {to} {amount}")
            return f"payment #{len(self.lines)}: {amount} to {to}"

        async def add(a: int, b: int) -> int:
            """Add two numbers."""
            self.lines.append(f"add {a} {b}")
            return a + b

        return [FunctionTool(pay, "Pay someone."), FunctionTool(add, "Add two numbers.")]


def agent(calls: list[int], ledger: Ledger, script: Sequence[Calls | str], system: str = "Pay.") -> Any:
    return AssistantAgent(
        "A",
        model_client=Batches(calls, script),
        tools=ledger.tools(),
        system_message=system,
        max_tool_iterations=5,
    )


def transcript(result: Any) -> list[tuple[str, str]]:
    return [(m.source, m.to_text()) for m in result.messages]


async def resumed_like_uninterrupted(
    store_url: str, script: Sequence[Calls | str], crash_at: str, *, slow_first: bool = False
) -> tuple[Ledger, list[int], Any]:
    """Run ``script`` uninterrupted; run it again, crashed after model call ``crash_at`` is
    recorded, and resume it with a fresh agent on the same ledger (the world the tools act on).
    Returns the lines the resume added to the ledger, its live model calls, and the resumed team;
    asserts the resumed transcript equals the uninterrupted one."""
    reference = team_of(agent([], Ledger(slow_first), script), store_url, run_id="reference")
    expected = transcript(await reference.run(task="go"))
    world = Ledger(slow_first)
    await crashed(team_of(agent([], world, script), store_url), "model", crash_at)
    done_before = len(world.lines)
    again: list[int] = []
    team = team_of(agent(again, world, script), store_url)
    assert transcript(await team.run()) == expected
    added = Ledger()
    added.lines = world.lines[done_before:]
    return added, again, team


# -- calls that share one call id -----------------------------------------------------------------


async def test_two_parallel_calls_with_the_empty_id_each_replay_their_own_record(store_url: str) -> None:
    script: list[Calls | str] = [
        [("", "pay", {"to": "ann", "amount": 7}), ("", "pay", {"to": "bob", "amount": 9})],
        "paid",
    ]
    ledger, again, team = await resumed_like_uninterrupted(store_url, script, "1")
    assert ledger.lines == [], "each payment was recorded: neither acts again"
    assert again == [], "both model calls are replayed"
    assert [(a, k, i, o) for a, k, i, o, _ in rows(team) if a == 2] == [
        (2, "model", "0", "replayed"),
        (2, "tool", "", "replayed"),
        (2, "tool", "", "replayed"),
        (2, "model", "1", "replayed"),
    ]


async def test_identical_parallel_calls_replay_in_the_order_they_were_made_not_written(
    store_url: str,
) -> None:
    """Two calls with one id, tool and arguments; the first one made finishes last, so the records
    are written in the other order: each call still gets back the result it had."""
    same = ("", "pay", {"to": "ann", "amount": 7})
    ledger, again, _ = await resumed_like_uninterrupted(
        store_url, [[same, same], "paid"], "1", slow_first=True
    )
    assert ledger.lines == [] and again == []


async def test_a_second_call_reusing_an_id_runs_instead_of_replaying_the_first_calls_record(
    store_url: str,
) -> None:
    """A client that numbers its calls from 0 in each process gives the same id to two calls of a
    turn; the turn dies after the first one: the second one still runs, once."""
    script: list[Calls | str] = [
        [("call-0", "pay", {"to": "ann", "amount": 7})],
        [("call-0", "pay", {"to": "ann", "amount": 7})],
        "paid twice",
    ]
    ledger, again, team = await resumed_like_uninterrupted(store_url, script, "1")
    assert ledger.lines == ["pay ann 7"], "the first payment is replayed, the second made"
    assert again == [2]
    tools = [(a, o) for a, k, _, o, _ in rows(team) if k == "tool"]
    assert tools == [(1, "live"), (2, "replayed"), (2, "live")]


# -- a model divergence does not make a recorded tool act again ----------------------------------


async def test_a_matching_tool_record_is_replayed_after_a_model_divergence(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await crashed(team_of(assistant([], Ran()), store_url), "model", "1")
    again: list[int] = []
    ran = Ran()
    team = team_of(assistant(again, ran, system="You are terse."), store_url)
    with caplog.at_level(logging.INFO, logger="graphflow_durable.flow"):
        await team.run()
    assert again == [0, 1, 2], "the changed prompt diverges model call 0: every model call is made"
    assert ran.runs == ["charge"], "add (same id, name and arguments) is replayed, not run again"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("graphflow")]
    assert [r for r in rows(team) if r[1] == "tool"] == [
        (1, "tool", "call-0", "live", False),
        (2, "tool", "call-0", "replayed", False),
        (2, "tool", "call-1", "live", False),
    ]


async def test_a_tool_that_acts_again_because_its_record_was_discarded_logs_a_warning_naming_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = team_of(assistant([], Ran()), store_url)
    await crashed(first, "model", "1")
    first.store.calls.discard_from("run", "run/A/2", 1, fencing_token=None)  # every record voided
    ran = Ran()
    team = team_of(assistant([], ran), store_url)
    with caplog.at_level(logging.INFO, logger="graphflow_durable.flow"):
        await team.run()
    assert ran.runs == ["add", "charge"]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("graphflow")
    ]
    assert len(warnings) == 1, warnings
    assert "tool add" in warnings[0] and "'call-0'" in warnings[0] and "discarded" in warnings[0]


async def test_a_tool_called_again_under_its_id_with_other_arguments_logs_a_warning_naming_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    before: list[Calls | str] = [[("c1", "pay", {"to": "ann", "amount": 7})], "paid"]
    after: list[Calls | str] = [[("c1", "pay", {"to": "ann", "amount": 8})], "paid"]
    await crashed(team_of(agent([], Ledger(), before), store_url), "model", "1")
    ledger = Ledger()
    team = team_of(agent([], ledger, after, system="Pay more."), store_url)
    with caplog.at_level(logging.INFO, logger="graphflow_durable.flow"):
        await team.run()
    assert ledger.lines == ["pay ann 8"]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("graphflow")
    ]
    assert len(warnings) == 1 and "tool pay" in warnings[0] and "other arguments" in warnings[0]


# -- damaged rows stop the resume -----------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    ["discarded = true", "outcome = 'replayed', result = NULL"],
    ids=["flipped-to-discarded", "flipped-to-replayed"],
)
async def test_a_call_record_changed_outside_the_store_stops_the_resume(store_url: str, damage: str) -> None:
    await crashed(team_of(assistant([], Ran()), store_url), "model", "1")
    raw = sa.create_engine(store_url)
    try:
        with raw.begin() as conn:  # the tool's record (seq 2): its checksum no longer matches
            conn.execute(sa.text(f"UPDATE graphflow_call_records SET {damage} WHERE seq = 2"))
    finally:
        raw.dispose()
    again: list[int] = []
    ran = Ran()
    with pytest.raises(StoreCorruptError, match="call record 2"):
        await team_of(assistant(again, ran), store_url).run()
    assert again == [] and ran.runs == [], "nothing was paid or done again"


# -- a tool reads its own call --------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False], ids=["stream-workbench", "workbench"])
async def test_a_tool_reads_its_run_node_attempt_and_call_id_and_a_key_stable_across_attempts(
    store_url: str, streaming: bool
) -> None:
    seen: list[tuple[int, ToolCallContext | None]] = []

    async def pay(to: str, amount: int) -> str:
        """Pay someone."""
        ctx = current_execution()
        seen.append((ctx.attempt if ctx else 0, current_tool_call()))
        return f"paid {amount} to {to}"

    script: list[Calls | str] = [
        [("", "pay", {"to": "ann", "amount": 7}), ("", "pay", {"to": "bob", "amount": 9})],
        [("", "pay", {"to": "cy", "amount": 1})],
        "paid",
    ]

    def make(calls: list[int]) -> AssistantAgent:
        tools = [FunctionTool(pay, "Pay.")]
        bench = {"tools": tools} if streaming else {"workbench": StaticWorkbench(tools)}
        return AssistantAgent("A", model_client=Batches(calls, script), max_tool_iterations=5, **bench)  # type: ignore[arg-type]

    first_team = team_of(make([]), store_url)
    await crashed(first_team, "model", "1")  # ann and bob paid, then the turn died
    first_team.store.calls.discard_from("run", "run/A/2", 1, fencing_token=None)  # both act again
    await team_of(make([]), store_url).run()
    assert [(a, c and c.name, c and c.call_id) for a, c in seen] == [(1, "pay", "")] * 2 + [
        (2, "pay", "")
    ] * 3
    calls = [c for _, c in seen if c is not None]
    assert [(c.execution.run_id, c.execution.node, c.execution.attempt) for c in calls] == [
        ("run", "A", 1),
        ("run", "A", 1),
        ("run", "A", 2),
        ("run", "A", 2),
        ("run", "A", 2),
    ]
    keys = [c.idempotency_key for c in calls]
    assert keys[:2] == keys[2:4], "ann's and bob's calls have the same keys on both attempts"
    assert len(set(keys)) == 3, "one id shared by three calls: three keys"
    assert all(k.startswith(calls[0].execution.idempotency_key + "/") for k in keys)
    outside = await FunctionTool(pay, "Pay.").run_json({"to": "x", "amount": 1}, CancellationToken())
    assert outside == "paid 1 to x" and seen[-1][1] is None, "outside a recorded turn: no call"
