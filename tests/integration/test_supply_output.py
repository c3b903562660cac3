"""An operator's answer for a failed node (``Store.supply_output``, ``runs supply``): the run whose
node spent its retry or crash budget continues without that node. The answer is recorded as the
node's completion (a ``complete`` step marked supplied), the scheduler moves as it would for a real
answer, the run becomes ``interrupted``, and ``run()`` or a pool worker continues it. Refused input
changes nothing; a driver that held the run before cannot write after it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from autogen_agentchat.conditions import TextMentionTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import DiGraphBuilder

from agents import Scripted, chain, close_stores, durable, fan, loop_agents, loop_graph, stored_transcript
from graphflow_durable import NodeFailedError, RetryPolicy, Worker
from graphflow_durable._storage.driver import CommitRequest
from graphflow_durable.cli.runs import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, main
from graphflow_durable.errors import (
    LeaseLostError,
    RunLockedError,
    RunNotFoundError,
    RunStateError,
    StoreError,
    UsageError,
)
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Step, StepKind, Store, Supply
from pgserver import Server
from processes import run_script
from smalldisk import SmallDisk

ONCE = RetryPolicy(max_attempts=1, initial_interval=0.01, jitter=False)
ANSWER = "B's answer, written by an operator"
CRASH_WORKER = Path(__file__).resolve().parents[1] / "crash" / "crash_loop_worker.py"


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def unreachable(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
    raise ConnectionError(f"{agent.name}: connection reset by peer")


def team(
    url: str | Store, run_id: str, calls: list[str], *, b_fails: bool = True, **kw: Any
) -> DurableGraphFlow:
    """A -> B -> C; B raises a retryable error on every call when ``b_fails``; one attempt allowed."""
    agents = [Scripted(n, calls=calls, before=unreachable if n == "B" and b_fails else None) for n in "ABC"]
    return durable(agents, chain(*agents), url, run_id, retry=ONCE, **kw)


async def failed_on_b(url: str, run_id: str = "r") -> list[str]:
    """A run whose node B spent its budget (status failed, the node_failed marker naming B)."""
    calls: list[str] = []
    with pytest.raises(NodeFailedError):
        await team(url, run_id, calls).run(task="go")
    assert calls == ["A", "B"]
    return calls


def snapshot(store: Store, run_id: str) -> tuple[Any, ...]:
    """What a refused supply must not change: the run's row (lease and token included) and its log."""
    run = store.get_run(run_id)
    assert run is not None
    log = store.load(run_id)
    return (
        (run.status, run.head_seq, run.message_count, run.result, run.lease_owner, run.fencing_token),
        [(s.seq, s.kind, s.node, dict(s.data)) for s in log.steps],
        [m.body for m in log.messages],
    )


def history_line(url: str, run_id: str, step: int, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["runs", "history", run_id, "--store", url]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    return next(line for line in lines if line.split()[0] == str(step))


async def test_a_supplied_answer_continues_a_run_whose_node_spent_its_retries(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await failed_on_b(store_url)
    with Store(store_url) as store:
        failed = store.get_run("r")
        assert (
            failed is not None and failed.status == "failed" and failed.result["node_failed"]["node"] == "B"
        )
        done = store.supply_output("r", "B", ANSWER)
        assert done == Supply("r", "B", failed.head_seq + 1, 2, "interrupted", ("C",))
        run = store.get_run("r")
        assert run is not None and run.status == "interrupted" and run.lease_owner is None
        assert not (isinstance(run.result, dict) and "node_failed" in run.result)
        assert run.fencing_token != failed.fencing_token
        message = store.transcript("r")[-1]
        assert (message.seq, message.step_seq) == (done.message_seq, done.step)
        assert message.body["type"] == "TextMessage" and message.body["source"] == "B"
        assert message.body["content"] == ANSWER

    calls: list[str] = []  # a fresh team, as a new process builds it; B works again
    resumed = team(store_url, "r", calls, b_fails=False)
    await resumed.run()
    assert calls == ["C"]  # neither A nor B runs again; C once
    thread = stored_transcript(resumed)
    assert [s for s, _ in thread] == ["user", "A", "B", "C"]
    assert thread[2] == ("B", ANSWER)
    assert thread[3][1].startswith("C#1 saw 3:")  # C's input: the task, A's answer and the supplied one
    assert resumed.run_info().status == "finished"  # type: ignore[union-attr]
    assert resumed.store.verify(["r"]).ok  # every row of the supplied step checked against its checksum
    log = resumed.store.load("r")
    assert log.agent_states["B"] == {"turn": 0}  # no turn of B ran: its state as stored at its dispatch
    step = next(s for s in resumed.store.history("r") if s.seq == done.step)
    assert (step.kind, step.node, step.supplied, step.attempt) == ("complete", "B", True, None)
    assert step.as_dict()["supplied"] is True
    assert step.message_seqs == (done.message_seq,)
    line = history_line(store_url, "r", done.step, capsys)
    assert line.split()[2:4] == ["complete", "B"] and line.endswith("supplied"), line
    assert not any(s.supplied for s in resumed.store.history("r") if s.seq != done.step)


async def test_runs_supply_writes_the_answer_from_the_command_line(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await failed_on_b(store_url)
    capsys.readouterr()
    assert main(["runs", "supply", "r", "B", ANSWER, "--store", store_url]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("run r: node B's answer supplied (step 5, message 2); interrupted"), out
    assert "continues it with C" in out
    calls: list[str] = []
    await team(store_url, "r", calls, b_fails=False).run()
    assert calls == ["C"]


async def test_a_supplied_answer_that_ends_its_batch_meets_the_termination_condition_on_resume(
    sqlite_url: str,
) -> None:
    """The batch's end (the termination condition on its messages) is decided by the resume, as a real
    answer's commit decides it: an answer that says STOP stops the round before C runs."""
    calls: list[str] = []
    flow = team(sqlite_url, "r", calls, termination=TextMentionTermination("STOP"))
    with pytest.raises(NodeFailedError):
        await flow.run(task="go")
    flow.store.supply_output("r", "B", "enough: STOP")
    result = await flow.run()  # the same team object, which drove the run when it failed
    assert calls == ["A", "B"]  # C never runs
    assert flow.run_info().status == "stopped"  # type: ignore[union-attr]
    assert result.stop_reason is not None and "STOP" in result.stop_reason
    assert [s for s, _ in stored_transcript(flow)] == ["user", "A", "B"]


async def test_refused_supplies_change_nothing_and_name_the_problem(store_url: str) -> None:
    await failed_on_b(store_url)
    with Store(store_url) as store:
        before = snapshot(store, "r")
        with pytest.raises(UsageError, match="run r failed on node B, not A: supply that node's answer"):
            store.supply_output("r", "A", ANSWER)
        with pytest.raises(UsageError, match="holds a NUL character"):
            store.supply_output("r", "B", "half\x00done")
        with pytest.raises(UsageError, match="empty"):
            store.supply_output("r", "B", "  ")
        with pytest.raises(UsageError, match="surrogate"):
            store.supply_output("r", "B", "bad \udc80 byte")
        with pytest.raises(UsageError, match="not text"):
            store.supply_output("r", "B", 42)  # type: ignore[arg-type]
        with pytest.raises(RunNotFoundError):
            store.supply_output("nope", "B", ANSWER)
        assert snapshot(store, "r") == before
        store.supply_output("r", "B", ANSWER)
        supplied = snapshot(store, "r")
        with pytest.raises(RunStateError, match="it is interrupted, not failed"):  # supplied once only
            store.supply_output("r", "B", ANSWER)
        assert snapshot(store, "r") == supplied


async def test_a_run_that_failed_without_a_spent_budget_is_refused(sqlite_url: str) -> None:
    """No retry policy: the agent's error fails the run as GraphFlow's does, with no node_failed
    marker; run() resumes it and the node runs again, so there is no answer to supply."""
    agents = [Scripted(n, before=unreachable if n == "B" else None) for n in "ABC"]
    flow = durable(agents, chain(*agents), sqlite_url, "r")
    with pytest.raises(RuntimeError, match="ConnectionError"):  # as GraphFlow raises an agent's error
        await flow.run(task="go")
    store = flow.store
    assert store.get_run("r").status == "failed"  # type: ignore[union-attr]
    before = snapshot(store, "r")
    with pytest.raises(RunStateError, match="names no failed node"):
        store.supply_output("r", "B", ANSWER)
    assert snapshot(store, "r") == before


async def test_the_command_line_refuses_in_one_line_with_its_exit_codes(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await failed_on_b(sqlite_url)
    with Store(sqlite_url) as store:
        before = snapshot(store, "r")
    for args, code, words in (
        (["r", "A", ANSWER], EXIT_USAGE, "failed on node B, not A"),
        (["r", "B", ""], EXIT_USAGE, "empty"),
        (["nope", "B", ANSWER], EXIT_USAGE, "does not exist"),
    ):
        capsys.readouterr()
        assert main(["runs", "supply", *args, "--store", sqlite_url]) == code
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    with Store(sqlite_url) as store:
        assert snapshot(store, "r") == before
        store.supply_output("r", "B", ANSWER)
    capsys.readouterr()
    assert main(["runs", "supply", "r", "B", ANSWER, "--store", sqlite_url]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "not failed" in err and len(err.strip().splitlines()) == 1, err


async def test_a_live_driver_holding_the_run_refuses_the_supply_and_a_stale_one_cannot_commit_after_it(
    store_url: str,
) -> None:
    await failed_on_b(store_url)
    with Store(store_url) as store:
        failed = store.get_run("r")
        assert failed is not None
        token = store._driver.acquire_lease("r", "X", lease_seconds=30)
        held = snapshot(store, "r")
        with pytest.raises(RunLockedError, match="being driven by X"):
            store.supply_output("r", "B", ANSWER)
        assert snapshot(store, "r") == held
        store._driver.release_lease("r", token)
        stale = store._driver.acquire_lease("r", "Y", lease_seconds=0.2)  # a driver whose lease runs out
        time.sleep(0.3)
        done = store.supply_output("r", "B", ANSWER)
        after = snapshot(store, "r")
        for old in (failed.fencing_token, token, stale):  # every driver that held the run before
            with pytest.raises(LeaseLostError):
                store._driver.commit(
                    CommitRequest(
                        "r",
                        expected_head=done.step,
                        fencing_token=old,
                        step=Step(StepKind.INTERRUPT, None, {}),
                    )
                )
            with pytest.raises(LeaseLostError):
                store._driver.renew_lease("r", "Y", old, lease_seconds=30)
        assert snapshot(store, "r") == after
    calls: list[str] = []
    await team(store_url, "r", calls, b_fails=False).run()
    assert calls == ["C"]


def _pool_factory(run_id: str, **kw: Any) -> DurableGraphFlow:
    calls: list[str] = []
    return team(kw.pop("store"), run_id, calls, b_fails=run_id.endswith("-fails"), **kw)


async def test_a_pool_worker_continues_a_supplied_run_it_left_failed(store_url: str) -> None:
    with Store(store_url) as store:
        store.queue.submit("r-fails", task="go", team="t")
        worker = Worker(store, {"t": _pool_factory}, poll_interval=0.01, backoff_seconds=0.01)
        await worker.run_until_idle()
        assert store.get_run("r-fails").status == "failed"  # type: ignore[union-attr]
        await worker.run_until_idle()  # a failed run is not claimed again on its own
        assert store.get_run("r-fails").status == "failed"  # type: ignore[union-attr]
        store.supply_output("r-fails", "B", ANSWER)
        await worker.run_until_idle()
        run = store.get_run("r-fails")
        assert run is not None and run.status == "finished"
        thread = [(m.body["source"], m.body.get("content")) for m in store.load("r-fails").messages]
        assert [s for s, _ in thread] == ["user", "A", "B", "C"] and thread[2] == ("B", ANSWER)


@pytest.mark.crash
def test_a_run_failed_by_a_crash_loop_accepts_a_supplied_answer(store_url: str, tmp_path: Path) -> None:
    """K kills its process; with max_crash_attempts=1 the next run fails the run (cause crash). The
    supplied answer stands for K; the next run runs B only."""
    log = tmp_path / "exec.log"

    def drive(mode: str) -> Any:
        return run_script(CRASH_WORKER, store_url, "poison", "1", mode, exec_log=log)

    assert drive("kill").returncode == -signal.SIGKILL
    assert drive("kill").returncode == 3  # failed: the process died once during K's turn
    with Store(store_url) as store:
        run = store.get_run("poison")
        assert run is not None and run.status == "failed" and run.result["node_failed"]["cause"] == "crash"
        with pytest.raises(UsageError, match="failed on node K, not B"):
            store.supply_output("poison", "B", "no")
        done = store.supply_output("poison", "K", "K's answer")
        assert done.next == ("B",)
    assert drive("ok").returncode == 0
    assert len(log.read_text().splitlines()) == 1  # K's one deadly turn; never dispatched again
    with Store(store_url) as store:
        assert store.get_run("poison").status == "finished"  # type: ignore[union-attr]
        assert [m.body["source"] for m in store.load("poison").messages] == ["user", "A", "K", "B"]
        assert store.transcript("poison", node="K")[0].body["content"] == "K's answer"


async def test_a_supply_on_a_full_disk_fails_with_a_store_error_and_succeeds_once_space_is_back(
    small_disk: SmallDisk,
) -> None:
    url = f"sqlite:///{small_disk.path / 'runs.db'}"
    await failed_on_b(url)
    with Store(url) as store:
        before = snapshot(store, "r")
        small_disk.fill()
        with pytest.raises(StoreError) as raised:
            store.supply_output("r", "B", ANSWER * 200)
        assert "run r" in str(raised.value) and "\n" not in str(raised.value)
        small_disk.free()
        assert snapshot(store, "r") == before
        assert store.supply_output("r", "B", ANSWER).status == "interrupted"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from Server.serve()


@pytest.mark.postgres
async def test_a_supply_while_postgres_is_down_fails_with_a_store_error_and_succeeds_once_it_is_up(
    server: Server,
) -> None:
    for url in server.database():
        await failed_on_b(url)
        with Store(f"{url}?connect_timeout=2") as store:
            before = snapshot(store, "r")
            await asyncio.to_thread(server.down)
            try:
                with pytest.raises(StoreError) as raised:
                    store.supply_output("r", "B", ANSWER)
                assert "\n" not in str(raised.value)
            finally:
                await asyncio.to_thread(server.up)
            assert snapshot(store, "r") == before
            assert store.supply_output("r", "B", ANSWER).status == "interrupted"


async def test_a_supplied_answer_fires_the_edges_whose_text_condition_it_meets(sqlite_url: str) -> None:
    """In the loop S -> (P1, P2) -> J -> R -> J ("again") | E ("done"), R fails on its first turn;
    the supplied "done" takes the exit edge at once: E runs next, J does not run again."""
    calls: list[str] = []
    agents = loop_agents(calls, {"R": unreachable})
    flow = durable(agents, loop_graph(agents), sqlite_url, "r", retry=ONCE, max_turns=50)
    with pytest.raises(NodeFailedError):
        await flow.run(task="go")
    assert flow.store.supply_output("r", "R", "all good: done").next == ("E",)
    calls.clear()
    fresh = loop_agents(calls)
    await durable(fresh, loop_graph(fresh), sqlite_url, "r", retry=ONCE, max_turns=50).run()
    assert calls == ["E"]
    assert [s for s, _ in stored_transcript(flow)][-2:] == ["R", "E"]


async def test_a_node_whose_edges_have_a_callable_condition_is_refused(sqlite_url: str) -> None:
    a, b, c = Scripted("A"), Scripted("B", before=unreachable), Scripted("C")
    builder = DiGraphBuilder().add_node(a).add_node(b).add_node(c).add_edge(a, b)
    builder.add_edge(b, c, condition=lambda message: "yes" in message.to_text())
    flow = durable([a, b, c], builder.build(), sqlite_url, "r", retry=ONCE)
    with pytest.raises(NodeFailedError):
        await flow.run(task="go")
    before = snapshot(flow.store, "r")
    with pytest.raises(UsageError, match=r"callable condition .*retry the node instead"):
        flow.store.supply_output("r", "B", "yes")
    assert snapshot(flow.store, "r") == before


async def test_a_supplied_answer_in_a_parallel_batch_joins_its_siblings_and_the_join_runs_once(
    store_url: str,
) -> None:
    calls: list[str] = []
    a, b1, b2, d = (
        Scripted(n, calls=calls, before=unreachable if n == "B1" else None) for n in ("A", "B1", "B2", "D")
    )
    flow = durable([a, b1, b2, d], fan(a, b1, b2, d), store_url, "r", retry=ONCE)
    with pytest.raises(NodeFailedError):
        await flow.run(task="go")
    flow.store.supply_output("r", "B1", "B1 supplied")
    calls.clear()
    fresh = [Scripted(n, calls=calls) for n in ("A", "B1", "B2", "D")]
    await durable(fresh, fan(*fresh), store_url, "r", retry=ONCE).run()
    assert calls.count("D") == 1 and "A" not in calls and "B1" not in calls
    thread = stored_transcript(flow)
    assert ("B1", "B1 supplied") in thread and [s for s, _ in thread][-1] == "D"
    assert thread[-1][1].startswith("D#1 saw 4:")  # the task, A, and both siblings' answers
    assert flow.store.get_run("r").status == "finished"  # type: ignore[union-attr]
