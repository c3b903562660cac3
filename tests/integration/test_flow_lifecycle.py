"""The run lifecycle of DESIGN §4: what run() does with and without a task, by run status."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agents import Scripted, chain, close_stores, durable, fail_once, stored_transcript


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def team(url: str, calls: list[str], fail_b: bool = False):  # type: ignore[no-untyped-def]
    agents = [Scripted(n, calls=calls, before=fail_once() if fail_b and n == "B" else None) for n in "ABC"]
    return durable(agents, chain(*agents), url, "life")


async def interrupted(url: str) -> list[str]:
    calls: list[str] = []
    with pytest.raises(RuntimeError):
        await team(url, calls, fail_b=True).run(task="write it")
    assert calls == ["A", "B"]
    return calls


async def test_the_same_task_on_an_interrupted_run_resumes_without_adding_it_again(store_url: str) -> None:
    await interrupted(store_url)
    calls: list[str] = []
    fresh = team(store_url, calls)
    await fresh.run(task="write it")
    assert calls == ["B", "C"]
    assert [s for s, _ in stored_transcript(fresh)] == ["user", "A", "B", "C"]


async def test_another_task_on_an_interrupted_run_is_added_once_as_input_and_the_run_continues(
    store_url: str,
) -> None:
    await interrupted(store_url)
    calls: list[str] = []
    fresh = team(store_url, calls)
    await fresh.run(task="and make it short")
    assert calls == ["B", "C"]  # continues: A is not run again
    transcript = stored_transcript(fresh)
    assert [s for s, _ in transcript] == ["user", "A", "user", "B", "C"]
    assert transcript[2][1] == "and make it short"


async def test_run_without_a_task_on_a_finished_run_runs_nothing_and_returns_the_stored_result(
    store_url: str,
) -> None:
    first = await team(store_url, []).run(task="write it")
    calls: list[str] = []
    again = await team(store_url, calls).run()
    assert calls == []
    assert again.stop_reason == first.stop_reason
    assert [m.source for m in again.messages] == ["user", "A", "B", "C"]


async def test_a_task_on_a_finished_run_starts_a_new_round_from_the_start_nodes(store_url: str) -> None:
    await team(store_url, []).run(task="write it")
    calls: list[str] = []
    fresh = team(store_url, calls)
    result = await fresh.run(task="now the summary")
    assert calls == ["A", "B", "C"]
    assert [m.source for m in result.messages] == ["user", "A", "B", "C"]
    assert [s for s, _ in stored_transcript(fresh)] == ["user", "A", "B", "C"] * 2
    # A re-run of the same script after this round finished resumes nothing and runs a third round
    # only when given a task; run() alone returns this round's result.
    calls.clear()
    assert [m.source for m in (await team(store_url, calls).run()).messages] == ["user", "A", "B", "C"]
    assert calls == []
