"""A cancelled token, a cancelled consumer task and ``aclose()`` stop the flow;
the team object stays usable (``run()`` resumes; ``reset()`` then ``run(task)`` starts over)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from autogen_agentchat.messages import BaseChatMessage
from autogen_core import CancellationToken

from agents import Gate, Scripted, chain, close_stores, durable, stored_transcript, text
from graphflow_durable.flow import DurableGraphFlow

NAMES = "ABCD"


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _consume(stream: AsyncGenerator[Any, None]) -> None:
    async for _ in stream:
        pass


async def _by_token(team: DurableGraphFlow, gate: Gate) -> None:
    token = CancellationToken()
    running = asyncio.ensure_future(_consume(team.run_stream(task="go", cancellation_token=token)))
    await gate.reached(running)
    token.cancel()
    asyncio.get_running_loop().call_soon(gate.open)
    with pytest.raises(asyncio.CancelledError):
        await running


async def _by_task_cancel(team: DurableGraphFlow, gate: Gate) -> None:
    running = asyncio.ensure_future(_consume(team.run_stream(task="go")))
    await gate.reached(running)
    running.cancel()  # what Ctrl+C does to the main task under asyncio.run
    asyncio.get_running_loop().call_soon(gate.open)
    with pytest.raises(asyncio.CancelledError):
        await running


async def _by_aclose(team: DurableGraphFlow, gate: Gate) -> None:
    stream = team.run_stream(task="go")
    seen = [await anext(stream), await anext(stream)]  # the task, then A's answer
    assert [m.source for m in seen] == ["user", "A"]
    await gate.reached()
    asyncio.get_running_loop().call_soon(gate.open)
    await stream.aclose()


INTERRUPTS: dict[str, Callable[[DurableGraphFlow, Gate], Awaitable[None]]] = {
    "cancellation_token": _by_token,
    "consumer_task_cancelled": _by_task_cancel,
    "stream_aclose": _by_aclose,
}


@pytest.mark.parametrize("interrupt", list(INTERRUPTS))
async def test_interrupt_stops_dispatching_and_team_object_resumes_then_resets(
    store_url: str, interrupt: str
) -> None:
    ref_agents = [Scripted(n) for n in NAMES]
    reference = text(
        (await durable(ref_agents, chain(*ref_agents), store_url, "ref").run(task="go")).messages
    )

    gate = Gate()
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=gate if n == "B" else None) for n in NAMES]
    team = durable(agents, chain(*agents), store_url, "run")
    await INTERRUPTS[interrupt](team, gate)

    # B may still finish its turn (and have it recorded), but nothing new is dispatched
    await asyncio.sleep(0.05)
    assert calls == ["A", "B"]
    assert team.run_info().status == "interrupted"

    # the same object resumes to the uninterrupted transcript
    await team.run()
    assert stored_transcript(team) == reference
    assert calls.count("A") == 1 and calls.count("C") == 1 and calls.count("D") == 1

    # reset() then run(task) starts over
    await team.reset()
    again = await team.run(task="go")
    assert text(again.messages) == reference
    assert again.stop_reason == "Digraph execution is complete"


@pytest.mark.parametrize("cancels", [1, 2])
async def test_an_interrupt_while_an_answer_is_being_committed_records_it_then_the_interrupt(
    sqlite_url: str, cancels: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A's answer is handed to the writer while another connection holds SQLite's write lock; the
    consumer task is cancelled meanwhile (a second time: stop waiting for the turns in flight).
    The event loop runs on (this test releases the lock from it); the task ends only once the
    answer is committed, and the run's end is recorded after it: ``interrupted``, with A's answer,
    and ``run()`` goes on from B without running A again. (The end used to be written by a
    blocking commit on the event loop, queued behind A's: the loop froze for two busy timeouts,
    the lock was never released, and both A's answer and the end were lost.)"""
    ref_agents = [Scripted(n) for n in NAMES]
    reference = text(
        (await durable(ref_agents, chain(*ref_agents), sqlite_url, "ref").run(task="go")).messages
    )

    path = sqlite_url.removeprefix("sqlite:///")
    lock: list[sqlite3.Connection] = []

    async def take_the_write_lock(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        held = sqlite3.connect(path, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")  # A's answer now waits in the writer for the lock
        lock.append(held)

    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=take_the_write_lock if n == "A" else None) for n in NAMES]
    team = durable(agents, chain(*agents), sqlite_url, "run")
    running = asyncio.ensure_future(_consume(team.run_stream(task="go")))
    try:
        for _ in range(cancels):
            await asyncio.sleep(0.2)
            running.cancel()
        await asyncio.sleep(0.2)
        assert not running.done()  # the commit has not settled: the task still waits for it
    finally:
        lock[0].execute("ROLLBACK")
        lock[0].close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 10)

    assert calls == ["A"]
    assert team.run_info().status == "interrupted"
    assert stored_transcript(team) == reference[:2]  # the task, then A's answer: it was committed
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == cancels - 1  # a second cancel: one line, for the turn it stopped waiting for
    assert all("did not end within interrupt_grace_seconds" in w for w in warnings)
    await team.run()
    assert calls == list(NAMES)
    assert stored_transcript(team) == reference
