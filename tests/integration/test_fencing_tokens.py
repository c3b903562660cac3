"""Fencing tokens never repeat for a run id: a driver that still holds a token of a deleted run
cannot commit into a new run of the same id, whether that run was imported, created or forked.

Driver P runs K (A -> B -> C) in this process and is held while B is in flight (head 3). Meanwhile
K is deleted (force) and a new K appears at head 3: imported from K's export, driven anew by
another team, or forked from an unrelated run at its step 3. When B answers, P's commit must be
refused (``LeaseLostError``) and nothing of P's may land in the new K.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core import CancellationToken

from agents import OPEN_TEAMS, Gate, Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable._model.graphid import describe_graph
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import LeaseLostError
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Step, StepKind, Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def snapshot(store: Store, run_id: str) -> tuple[Any, ...]:
    """What a stale driver must not change: the run's row (lease and token included) and its log."""
    run = store.get_run(run_id)
    assert run is not None
    log = store.load(run_id)
    return (
        (run.status, run.head_seq, run.message_count, run.lease_owner, run.fencing_token),
        [(s.seq, s.kind, s.node) for s in log.steps],
        [m.body for m in log.messages],
    )


async def stale_driver_after(store_url: str, replace: Callable[[Store], Awaitable[None]]) -> None:
    """Drive K as P until B is in flight; ``replace`` deletes K and makes a new K at head 3; then let
    B answer and check that P's commit is refused and leaves the new K as it was."""
    gate = Gate()
    calls: list[str] = []
    agents = [Scripted(n, ["from P"], calls=calls, before=gate if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "K", lease_owner="P")
    driving = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(driving)
    with Store(store_url) as other:
        run = other.get_run("K")
        assert run is not None and run.head_seq == 3 and run.lease_owner == "P"
        await replace(other)
        replaced = other.get_run("K")
        assert replaced is not None and replaced.head_seq == 3
        before = snapshot(other, "K")
        gate.open()
        with pytest.raises(LeaseLostError):
            await asyncio.wait_for(driving, 30)
        assert calls == ["A", "B"]  # C never ran for P
        assert snapshot(other, "K") == before  # B's answer, C's turn, the end: none of them
        assert [body["source"] for body in before[2]] == ["user", "A"]


async def test_a_stale_driver_cannot_commit_into_its_run_deleted_and_imported_again(store_url: str) -> None:
    async def reimport(store: Store) -> None:
        document = store.export_run("K")
        store.delete_run("K", force=True)
        imported = store.import_run(document)
        assert imported.status == "interrupted" and imported.head_seq == 3

    await stale_driver_after(store_url, reimport)


async def test_a_stale_driver_cannot_commit_into_a_new_run_of_the_same_id(store_url: str) -> None:
    """The new K is driven by another team (owner Q), itself held while its B is in flight: P's
    answer must not land in it, and Q then finishes it with its own answers only."""
    gate = Gate()
    agents = [Scripted(n, calls=[], before=gate if n == "B" else None) for n in "ABC"]
    successor: list[DurableGraphFlow] = []
    running: list[asyncio.Future[Any]] = []

    async def recreate(store: Store) -> None:
        store.delete_run("K", force=True)
        team = durable(agents, chain(*agents), store_url, "K", lease_owner="Q")
        successor.append(team)
        running.append(asyncio.ensure_future(team.run(task="go again")))
        await gate.reached(running[-1])

    await stale_driver_after(store_url, recreate)
    gate.open()
    result = await asyncio.wait_for(running[0], 30)
    assert [m.source for m in result.messages] == ["user", "A", "B", "C"]
    transcript = stored_transcript(successor[0])
    assert [s for s, _ in transcript] == ["user", "A", "B", "C"]
    assert not any("from P" in text for _, text in transcript)


async def test_a_stale_driver_cannot_commit_into_a_fork_of_another_run_given_its_id(store_url: str) -> None:
    agents = [Scripted(n) for n in "ABC"]
    other_run = durable(agents, chain(*agents), store_url, "OTHER")
    await asyncio.wait_for(other_run.run(task="something else"), 30)

    async def fork(store: Store) -> None:
        store.delete_run("K", force=True)
        forked = store.fork("OTHER", 3, new_run_id="K")
        assert forked.head_seq == 3 and forked.parent_run_id == "OTHER"

    await stale_driver_after(store_url, fork)


def test_tokens_never_repeat_across_creations_imports_forks_and_takeovers_of_one_run_id(
    store_url: str,
) -> None:
    """Every way a run id gets a lease or a new incarnation draws a token above all issued before."""
    a, b = Scripted("A"), Scripted("B")
    graph = describe_graph(chain(a, b), ["A", "B"])  # a graph the import's checks accept
    with Store(store_url) as store:
        seen: list[int] = []
        run = store._driver.create_run(
            CreateRequest("r", graph_fingerprint="f", graph=graph, owner="w1", lease_seconds=0.01)
        )
        seen.append(run.fencing_token)
        time.sleep(0.05)  # its lease expires: w2 takes it over
        seen.append(store._driver.acquire_lease("r", "w2", lease_seconds=30, host="h", pid=1))
        document = store.export_run("r")
        store.delete_run("r", force=True)
        seen.append(store.import_run(document).fencing_token)
        seen.append(store._driver.acquire_lease("r", "w3", lease_seconds=30))
        first = Step(StepKind.CREATED, None, {})
        src = store._driver.create_run(
            CreateRequest(
                "src", graph_fingerprint="f", graph={}, owner="w1", lease_seconds=30, first_step=first
            )
        )
        store._driver.release_lease("src", src.fencing_token)  # a run at rest: it may be forked at its head
        store.delete_run("r", force=True)
        seen.append(store.fork("src", 1, new_run_id="r").fencing_token)
        store.delete_run("r", force=True)
        seen.append(
            store._driver.create_run(
                CreateRequest("r", graph_fingerprint="f", graph={}, owner="w4", lease_seconds=0.01)
            ).fencing_token
        )
        time.sleep(0.05)
        claim = store.queue.claim("worker", lease_seconds=30)  # a run whose lease expired
        assert claim is not None and claim.kind == "run"
        seen.append(claim.fencing_token)
        store.queue.release_claim(claim)
        assert store.cancel_run("r").outcome == "cancelled"  # nobody holds it: its token moves on
        seen.append(store.get_run("r").fencing_token)  # type: ignore[union-attr]
        store.retry_run("r")
        seen.append(store.get_run("r").fencing_token)  # type: ignore[union-attr]
        store.queue.submit("s", task="t", team="pool")
        claim = store.queue.claim("worker", lease_seconds=30, teams=["pool"])  # a submission
        assert claim is not None and claim.kind == "submission"
        seen.append(claim.fencing_token)
        assert seen == sorted(set(seen)), seen


async def test_a_stale_drivers_inline_answer_is_not_recorded_in_a_new_run_of_its_id(store_url: str) -> None:
    """An input function's answer is a driver's write too: P's person answers after K was deleted
    and imported again; the request is not recorded in the new K, and nothing else of P's lands."""
    asking, typed = asyncio.Event(), asyncio.Event()

    async def person(prompt: str, cancellation_token: CancellationToken | None = None) -> str:
        asking.set()
        await typed.wait()
        return "P's person answered"

    a, c, h = Scripted("A"), Scripted("C"), UserProxyAgent("H", input_func=person)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    team = DurableGraphFlow(
        [a, h, c], graph, store=store_url, run_id="K", lease_owner="P", human_input="inline"
    )
    OPEN_TEAMS.append(team)
    driving = asyncio.ensure_future(team.run(task="go"))
    await asyncio.wait_for(asking.wait(), 30)
    with Store(store_url) as other:
        document = other.export_run("K")
        other.delete_run("K", force=True)
        other.import_run(document)
        before = snapshot(other, "K")
        typed.set()
        with pytest.raises(RuntimeError) as raised:  # LeaseLostError, or the agent's error around it
            await asyncio.wait_for(driving, 30)
        assert "fencing token" in str(raised.value), raised.value
        assert other.requests.get("K", "H/3") is None and other.pending_requests("K") == []
        assert snapshot(other, "K") == before
