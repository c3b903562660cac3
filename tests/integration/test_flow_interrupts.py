"""Issue 6, behaviour 4: a cancelled token, a cancelled consumer task and ``aclose()`` stop the flow;
the team object stays usable (``run()`` resumes; ``reset()`` then ``run(task)`` starts over)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any

import pytest
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
    await asyncio.wait_for(gate.started.wait(), 5)
    token.cancel()
    asyncio.get_running_loop().call_soon(gate.open)
    with pytest.raises(asyncio.CancelledError):
        await running


async def _by_task_cancel(team: DurableGraphFlow, gate: Gate) -> None:
    running = asyncio.ensure_future(_consume(team.run_stream(task="go")))
    await asyncio.wait_for(gate.started.wait(), 5)
    running.cancel()  # what Ctrl+C does to the main task under asyncio.run
    asyncio.get_running_loop().call_soon(gate.open)
    with pytest.raises(asyncio.CancelledError):
        await running


async def _by_aclose(team: DurableGraphFlow, gate: Gate) -> None:
    stream = team.run_stream(task="go")
    seen = [await anext(stream), await anext(stream)]  # the task, then A's answer
    assert [m.source for m in seen] == ["user", "A"]
    await asyncio.wait_for(gate.started.wait(), 5)
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
