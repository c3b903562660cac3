"""Human input in one process, on both backends: parking, answering (by node, by request id, as a
task), bad answers, concurrent answers, several requests at once, deadlines, inline answers, and
the settings' round trip through the component config."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sys
import time
from pathlib import Path

import pytest
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder

from graphflow_durable import (
    DurableGraphFlow,
    HumanInput,
    InputDeadlineError,
    NotWaitingError,
    RunExistsError,
    RunNotFoundError,
    Store,
    UsageError,
    Worker,
)
from graphflow_durable.cli.runs import EXIT_CONFLICT, EXIT_OK, main
from graphflow_durable.store import InputRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents import Gate, Hook, Scripted

asked: list[str] = []


def person(prompt: str) -> str:
    asked.append(prompt)
    return "typed"


def fan(
    url: str,
    run_id: str = "r",
    *,
    people: tuple[str, ...] = ("H1", "H2"),
    before: Hook | None = None,
    **kw: object,
) -> DurableGraphFlow:
    """A -> (H1, H2, B) -> C: two people (or ``people``) and an agent (its turn starts with
    ``before``) in parallel, C joins them."""
    a, b, c = Scripted("A"), Scripted("B", before=before), Scripted("C")
    humans = [UserProxyAgent(name, input_func=person) for name in people]
    builder = DiGraphBuilder()
    for node in (a, *humans, b, c):
        builder.add_node(node)
    for mid in (*humans, b):
        builder.add_edge(a, mid).add_edge(mid, c)
    return DurableGraphFlow([a, *humans, b, c], builder.build(), store=url, run_id=run_id, **kw)  # type: ignore[arg-type]


async def until_asked(store: Store, run_id: str, request_ids: list[str]) -> None:
    """Wait until the run's pending requests are ``request_ids``."""
    for _ in range(500):
        if [r.request_id for r in store.pending_requests(run_id)] == request_ids:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} never asked {request_ids}")


def one(url: str, run_id: str = "r", **kw: object) -> DurableGraphFlow:
    """A -> H -> C."""
    a, c, h = Scripted("A"), Scripted("C"), UserProxyAgent("H", input_func=person)
    graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
    return DurableGraphFlow([a, h, c], graph, store=url, run_id=run_id, **kw)  # type: ignore[arg-type]


def texts(result: object) -> list[tuple[str, str]]:
    return [(m.source, m.to_text()) for m in result.messages if m.source != "H" or m.to_text()]  # type: ignore[attr-defined]


async def test_several_waiting_nodes_are_answered_one_by_one_by_node_and_by_request_id(
    store_url: str,
) -> None:
    asked.clear()
    team = fan(store_url, human_input="wait")
    parked = await team.run(task="go")
    info = team.run_info()
    assert info is not None and info.status == "waiting"
    assert [r.node for r in info.pending] == ["H1", "H2"]
    assert "H1 asks" in str(parked.stop_reason) and "H2 asks" in str(parked.stop_reason)
    with pytest.raises(NotWaitingError, match="waits on 2 requests"):
        await team.respond("which?")  # several pending, none named: nothing changes
    assert len(team.store.pending_requests("r")) == 2

    await team.respond("one", node="H1")
    again = await team.run()  # H1 completes, H2 still waits: parked again
    assert team.run_info().status == "waiting"  # type: ignore[union-attr]
    assert "H2 asks" in str(again.stop_reason) and "H1" not in str(again.stop_reason)
    rid = team.store.pending_requests("r")[0].request_id
    await team.respond("two", request_id=rid)
    done = await team.run()
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    assert ("H2", "two") in texts(done)  # the call returns what it produced, as GraphFlow's does
    thread = [(m.body["source"], m.body.get("content")) for m in team.store.load("r").messages]
    assert [s for s, _ in thread] == ["user", "A", "B", "H1", "H2", "C"]
    assert ("H1", "one") in thread and ("H2", "two") in thread
    assert asked == []  # in wait mode the input function is never called
    with pytest.raises(NotWaitingError, match="not waiting"):
        await team.respond("late")


async def test_a_run_answered_by_one_of_two_people_still_reads_waiting_and_a_pool_takes_it_once_both_answered(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    def factory(run_id: str, **durable: object) -> DurableGraphFlow:
        return fan(durable.pop("store"), run_id=run_id, human_input="wait", **durable)  # type: ignore[arg-type]

    store.queue.submit("r", task="go", team="t")
    worker = Worker(store, {"t": factory}, poll_interval=0.01)
    await worker.run_until_idle()
    assert store.respond("r", "one", node="H1").request_id == "H1/3"
    run = store.get_run("r")
    assert run is not None and run.status == "waiting"  # H2 still waits
    assert [r.request_id for r in store.pending_requests("r")] == ["H2/3"]
    capsys.readouterr()
    assert main(["runs", "list", "--status", "waiting", "--store", store.url]) == EXIT_OK
    listed = capsys.readouterr().out
    assert "waits for H2/3: H2 asks" in listed and "H1/3" not in listed, listed
    await worker.run_until_idle()  # nothing to do until H2 answers
    assert [o.outcome for o in worker.outcomes] == ["waiting"]
    store.respond("r", "two", node="H2")
    assert store.get_run("r").status == "interrupted"  # type: ignore[union-attr]
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["waiting", "finished"]
    thread = [(m.body["source"], m.body.get("content")) for m in store.load("r").messages]
    assert ("H1", "one") in thread and ("H2", "two") in thread and thread[-1][0] == "C"


async def test_an_answer_given_while_the_run_is_driven_is_taken_by_that_run_which_finishes(
    store_url: str,
) -> None:
    gate = Gate()
    team = fan(store_url, people=("H",), before=gate, human_input="wait")
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)  # B runs, H asked
    await until_asked(team.store, "r", ["H/3"])
    with Store(store_url) as other:
        other.respond("r", "yes")
    gate.open()
    result = await asyncio.wait_for(running, 30)  # no second run(): this driver took the answer
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    assert ("H", "yes") in texts(result) and result.messages[-1].source == "C"
    assert result.stop_reason is not None and "waiting" not in result.stop_reason


async def test_an_answer_to_one_of_two_people_given_while_the_run_is_driven_leaves_it_waiting_for_the_other(
    store_url: str,
) -> None:
    gate = Gate()
    team = fan(store_url, before=gate, human_input="wait")
    running = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(running)
    await until_asked(team.store, "r", ["H1/3", "H2/3"])
    with Store(store_url) as other:
        other.respond("r", "one", node="H1")
    gate.open()
    result = await asyncio.wait_for(running, 30)
    info = team.run_info()
    assert info is not None and info.status == "waiting" and [r.request_id for r in info.pending] == ["H2/3"]
    assert "H2 asks" in str(result.stop_reason) and "H1" not in str(result.stop_reason)
    assert ("H1", "one") in texts(result)  # H1's turn took its answer in this call
    await team.respond("two")
    done = await team.run()
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    assert ("H2", "two") in texts(done)
    thread = [(m.body["source"], m.body.get("content")) for m in team.store.load("r").messages]
    assert [s for s, _ in thread] == ["user", "A", "B", "H1", "H2", "C"]


async def test_a_task_given_to_a_waiting_run_is_the_answer_and_the_same_task_is_not(store_url: str) -> None:
    team = one(store_url, human_input="wait")
    await team.run(task="go")
    same = await one(store_url, human_input="wait").run(task="go")  # a re-run script: still waiting
    assert same.stop_reason is not None and same.stop_reason.startswith("waiting for input: H")
    resumed = await one(store_url, human_input="wait").run(task="yes")
    assert [s for s, _ in texts(resumed)][-2:] == ["H", "C"] and ("H", "yes") in texts(resumed)
    assert team.run_info().status == "finished"  # type: ignore[union-attr]


async def test_of_two_concurrent_answers_exactly_one_wins(store_url: str) -> None:
    team = one(store_url, human_input="wait")
    await team.run(task="go")
    stores = [Store(store_url) for _ in range(4)]
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(s.respond, "r", f"answer {i}") for i, s in enumerate(stores)]
            outcomes = [f.exception() or f.result() for f in futures]
    finally:
        for s in stores:
            s.close()
    wins = [o for o in outcomes if isinstance(o, InputRequest)]
    assert len(wins) == 1 and all(isinstance(o, NotWaitingError) for o in outcomes if o not in wins)
    done = await team.run()
    assert ("H", wins[0].answer) in texts(done)


async def test_a_deadline_takes_the_default_answer_or_fails_the_run(store_url: str) -> None:
    team = one(store_url, "d", human_input=HumanInput("wait", timeout=0.2, default="no answer"))
    await team.run(task="go")
    assert team.run_info().status == "waiting"  # type: ignore[union-attr]
    time.sleep(0.3)
    done = await team.run()  # past the deadline: the default is the answer
    assert ("H", "no answer") in texts(done)
    assert team.store.requests.get("d", "H/3").answered_by == "default"  # type: ignore[union-attr]

    failing = one(store_url, "f", human_input={"H": HumanInput("wait", timeout=0.2)})
    await failing.run(task="go")
    time.sleep(0.3)
    with pytest.raises(RuntimeError, match="passed its deadline"):
        await failing.run()
    assert failing.run_info().status == "failed"  # type: ignore[union-attr]


async def test_a_run_that_finished_after_failing_on_a_deadline_no_longer_shows_that_error(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    team = one(store_url, "f", human_input=HumanInput("wait", timeout=0.2))
    await team.run(task="go")
    time.sleep(0.3)
    with pytest.raises(InputDeadlineError):
        await team.run()
    assert (team.store.queue.get_submission("f").last_error or "").startswith("InputDeadlineError")  # type: ignore[union-attr]
    team.store.respond("f", "late, but yes")
    await one(store_url, "f", human_input=HumanInput("wait", timeout=0.2)).run()
    assert team.run_info().status == "finished"  # type: ignore[union-attr]
    capsys.readouterr()
    assert main(["runs", "show", "f", "--store", store_url]) == EXIT_OK
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("last error")] == [
        "last error  -"
    ]
    assert main(["runs", "show", "f", "--json", "--store", store_url]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["last_error"] is None
    assert main(["runs", "list", "--json", "--store", store_url]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["last_error"] is None


async def test_runs_respond_says_that_a_worker_or_the_next_run_resumes_the_run(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await one(store_url, "r", human_input="wait").run(task="go")
    capsys.readouterr()
    assert main(["runs", "respond", "r", "yes", "--store", store_url]) == EXIT_OK
    assert capsys.readouterr().out == (
        "r: answered H/3 (H); run interrupted: a worker or the next run() resumes it\n"
    )


async def test_a_deadline_without_a_default_raises_input_deadline_error_recorded_as_the_runs_last_error(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    team = one(store_url, "f", human_input=HumanInput("wait", timeout=0.2))
    await team.run(task="go")
    request = team.store.requests.get("f", "H/3")
    assert request is not None and request.deadline is not None
    time.sleep(0.3)
    with pytest.raises(InputDeadlineError) as raised:
        await team.run()
    error = raised.value
    assert (error.run_id, error.request_id, error.deadline) == ("f", "H/3", request.deadline)
    assert "passed its deadline" in str(error) and "\n" not in str(error)
    assert isinstance(error.__cause__, RuntimeError)  # what GraphFlow raised, chained
    assert team.run_info().status == "failed"  # type: ignore[union-attr]
    capsys.readouterr()
    assert main(["runs", "show", "f", "--store", store_url]) == EXIT_OK
    shown = capsys.readouterr().out.splitlines()
    last = [line for line in shown if line.startswith("last error")]
    assert last == [f"last error  InputDeadlineError: {error}"], shown
    asked_line = [line for line in shown if line.startswith("asked")]
    assert len(asked_line) == 1 and "'runs respond'" in asked_line[0] and "'runs retry'" in asked_line[0], (
        shown
    )
    with pytest.raises(RunExistsError, match="was not submitted"):  # its error's bookkeeping is no submission
        team.store.queue.submit("f", task="go", team=None)


def _pool_factory(run_id: str, **durable: object) -> DurableGraphFlow:
    return one(durable.pop("store"), run_id=run_id, human_input=HumanInput("wait", timeout=1.0), **durable)  # type: ignore[arg-type]


async def test_a_pool_run_failed_by_a_deadline_is_left_alone_until_retried_then_asks_again(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.queue.submit("w", task="go", team="t")
    worker = Worker(store, {"t": _pool_factory}, poll_interval=0.01, backoff_seconds=0.01)
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["waiting"]
    time.sleep(1.1)
    caplog.clear()
    await worker.run_until_idle()  # past the deadline, no default: the run fails, once
    assert [o.outcome for o in worker.outcomes] == ["waiting", "failed"]
    assert (worker.outcomes[-1].error or "").startswith("InputDeadlineError: run w: request H/3")
    assert store.get_run("w").status == "failed"  # type: ignore[union-attr]
    assert (store.queue.get_submission("w").last_error or "").startswith("InputDeadlineError:")  # type: ignore[union-attr]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]  # one WARNING line from the worker, no traceback
    time.sleep(0.1)  # past any back-off: still not claimed, it would fail the same way
    await worker.run_until_idle()
    assert len(worker.outcomes) == 2
    assert store.retry_run("w").asked_again == ("H/3",)  # asks again, with a new deadline
    assert store.requests.get("w", "H/3").deadline > time.time() + 0.5  # type: ignore[operator,union-attr]
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes][2:] == ["waiting"]
    assert [r.request_id for r in store.pending_requests("w")] == ["H/3"]
    store.respond("w", "yes")
    await worker.run_until_idle()
    assert store.get_run("w").status == "finished"  # type: ignore[union-attr]
    assert ("H", "yes") in [(m.body["source"], m.body.get("content")) for m in store.load("w").messages]


async def test_a_pool_run_failed_by_a_deadline_is_finished_by_the_pool_once_answered(store: Store) -> None:
    store.queue.submit("w", task="go", team="t")
    worker = Worker(store, {"t": _pool_factory}, poll_interval=0.01, backoff_seconds=0.01)
    await worker.run_until_idle()
    time.sleep(1.1)
    await worker.run_until_idle()
    assert store.get_run("w").status == "failed"  # type: ignore[union-attr]
    store.respond("w", "late, but yes")  # the answer the run failed for
    time.sleep(0.05)
    await worker.run_until_idle()
    assert [o.outcome for o in worker.outcomes] == ["waiting", "failed", "finished"]
    assert ("H", "late, but yes") in [
        (m.body["source"], m.body.get("content")) for m in store.load("w").messages
    ]


async def test_inline_input_is_asked_once_and_recorded(store_url: str) -> None:
    asked.clear()
    team = one(store_url, human_input="inline")
    done = await team.run(task="go")
    assert ("H", "typed") in texts(done) and len(asked) == 1
    request = team.store.requests.get("r", "H/3")
    assert request is not None and (request.status, request.answer, request.answered_by) == (
        "answered",
        "typed",
        "inline",
    )


async def test_the_human_input_setting_survives_the_component_config(sqlite_url: str) -> None:
    team = one(sqlite_url, human_input={"H": HumanInput("wait", timeout=60, default="x")})
    config = team.dump_component()
    assert config.config["human_input"]["H"] == {"mode": "wait", "timeout": 60, "default": "x"}


def test_bad_human_input_settings_are_refused_clearly(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="'wait' or 'inline'"):
        one(sqlite_url, human_input="later")
    with pytest.raises(ValueError, match="'Z', which is not a participant"):
        one(sqlite_url, human_input={"Z": "wait"})
    with pytest.raises(ValueError, match="timeout must be"):
        HumanInput("wait", timeout=-1)


def test_a_human_input_setting_for_a_node_that_is_not_a_user_proxy_is_refused_naming_its_type(
    sqlite_url: str,
) -> None:
    with pytest.raises(
        UsageError, match=r"human_input names 'A', a Scripted, not a UserProxyAgent"
    ) as caught:
        one(sqlite_url, human_input={"A": "wait", "H": "wait"})
    assert caught.value.option == "human_input" and "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)
    one(sqlite_url, human_input={"H": "wait", "*": "inline"})  # a UserProxyAgent and '*': accepted


def test_answering_a_run_that_does_not_exist_is_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFoundError):
        store.respond("nope", "x")


async def test_an_ambiguous_answer_given_as_a_task_is_refused_and_the_run_keeps_waiting(
    store_url: str,
) -> None:
    team = fan(store_url, human_input="wait")
    await team.run(task="go")
    with pytest.raises(NotWaitingError, match="waits on 2 requests"):
        await fan(store_url, human_input="wait").run(task="yes")
    info = team.run_info()
    assert info is not None and info.status == "waiting" and len(info.pending) == 2
    assert info.lease_owner is None  # the refused call gave the run back


async def test_answers_that_name_no_pending_request_are_refused_with_what_is_pending(store_url: str) -> None:
    team = one(store_url, human_input="wait")
    await team.run(task="go")
    store = team.store
    with pytest.raises(NotWaitingError, match="has no such request") as unknown:
        store.respond("r", "x", request_id="H/99")
    assert unknown.value.pending == ("H/3",) and unknown.value.request_id == "H/99"
    with pytest.raises(NotWaitingError, match="from node 'A'"):
        store.respond("r", "x", node="A")
    store.respond("r", "first", request_id="H/3")
    with pytest.raises(NotWaitingError, match="has request 'H/3' answered"):
        store.respond("r", "second", request_id="H/3")
    assert store.requests.get("r", "H/3").answer == "first"  # type: ignore[union-attr]


async def test_reset_cancels_the_pending_requests_of_the_run(store_url: str) -> None:
    team = one(store_url, human_input="wait")
    await team.run(task="go")
    await team.reset()
    assert team.store.pending_requests("r") == []
    assert team.store.requests.get("r", "H/3").status == "cancelled"  # type: ignore[union-attr]
    with pytest.raises(NotWaitingError):
        await team.respond("too late")


async def test_an_answer_to_a_cancelled_run_is_refused_and_the_resumed_run_asks_again(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cancelled while it waits for a person: the run stays cancelled and an answer is refused
    (nothing changed: the request stays open); run() resumes it, the node asks the same request
    again and the run waits; the answer given then is the one the node gets."""
    team = one(store_url, human_input="wait")
    await team.run(task="go")
    done = team.store.cancel_run("r")
    assert (done.outcome, done.status) == ("cancelled", "cancelled")
    with pytest.raises(NotWaitingError, match="run r is cancelled") as refused:
        await team.respond("too early")
    assert refused.value.pending == ("H/3",)
    capsys.readouterr()
    assert main(["runs", "respond", "r", "too early", "--store", store_url]) == EXIT_CONFLICT
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "run r is cancelled" in err[0] and "nothing was changed" in err[0], err
    assert team.store.get_run("r").status == "cancelled"  # type: ignore[union-attr]
    assert [(r.request_id, r.status) for r in team.store.pending_requests("r")] == [("H/3", "pending")]
    assert main(["runs", "show", "r", "--store", store_url]) == EXIT_OK
    shown = capsys.readouterr().out.splitlines()
    assert not [line for line in shown if line.startswith("waits for")]  # a cancelled run waits for nothing
    asked = [line for line in shown if line.startswith("asked")]
    assert len(asked) == 1 and "H/3: H asks" in asked[0] and "once the run is resumed" in asked[0], shown
    again = await one(store_url, human_input="wait").run()  # resumed: H asks again and waits
    assert again.stop_reason is not None and again.stop_reason.startswith("waiting for input: H")
    assert team.run_info().status == "waiting"  # type: ignore[union-attr]
    await team.respond("yes")
    finished = await one(store_url, human_input="wait").run()
    assert ("H", "yes") in texts(finished) and team.run_info().status == "finished"  # type: ignore[union-attr]
    thread = [(m.body["source"], m.body.get("content")) for m in team.store.load("r").messages]
    assert [s for s, _ in thread] == ["user", "A", "H", "C"] and ("H", "yes") in thread


async def test_a_worker_takes_the_default_answer_of_a_waiting_run_once_its_deadline_passed(
    store: Store,
) -> None:
    def factory(run_id: str, **durable: object) -> DurableGraphFlow:
        a, c, h = Scripted("A"), Scripted("C"), UserProxyAgent("H", input_func=person)
        graph = DiGraphBuilder().add_node(a).add_node(h).add_node(c).add_edge(a, h).add_edge(h, c).build()
        setting = HumanInput("wait", timeout=0.3, default="silence is consent")
        return DurableGraphFlow([a, h, c], graph, run_id=run_id, human_input=setting, **durable)  # type: ignore[arg-type]

    store.queue.submit("w", task="go", team="t")
    worker = Worker(store, {"t": factory}, poll_interval=0.01)
    await worker.run_until_idle()
    assert store.get_run("w").status == "waiting"  # type: ignore[union-attr]
    assert [o.outcome for o in worker.outcomes] == ["waiting"]
    await worker.run_until_idle()  # before the deadline: a waiting run is not claimed
    assert len(worker.outcomes) == 1
    time.sleep(0.4)
    await worker.run_until_idle()
    assert store.get_run("w").status == "finished"  # type: ignore[union-attr]
    thread = [(m.body["source"], m.body.get("content")) for m in store.load("w").messages]
    assert ("H", "silence is consent") in thread


async def test_a_cancelled_waiting_run_of_a_pool_is_left_alone_until_retried_then_asks_again(
    store: Store,
) -> None:
    def factory(run_id: str, **durable: object) -> DurableGraphFlow:
        return one(durable.pop("store"), run_id=run_id, human_input="wait", **durable)  # type: ignore[arg-type]

    store.queue.submit("w", task="go", team="t")
    worker = Worker(store, {"t": factory}, poll_interval=0.01)
    await worker.run_until_idle()
    assert store.cancel_run("w").status == "cancelled"
    await worker.run_until_idle()  # a cancelled run is not claimed
    assert len(worker.outcomes) == 1 and store.get_run("w").status == "cancelled"  # type: ignore[union-attr]
    with pytest.raises(NotWaitingError, match="is cancelled"):
        store.respond("w", "no")
    assert store.retry_run("w").status == "interrupted"
    await worker.run_until_idle()  # claimed: H asks the same request again, the run waits
    assert [o.outcome for o in worker.outcomes] == ["waiting", "waiting"]
    assert [r.request_id for r in store.pending_requests("w")] == ["H/3"]
    store.respond("w", "yes")
    await worker.run_until_idle()
    assert store.get_run("w").status == "finished"  # type: ignore[union-attr]
    assert ("H", "yes") in [(m.body["source"], m.body.get("content")) for m in store.load("w").messages]


async def test_wait_inside_a_nested_team_fails_the_turn_clearly_instead_of_recording_a_partial_answer(
    sqlite_url: str,
) -> None:
    from autogen_agentchat.agents import SocietyOfMindAgent
    from autogen_ext.models.replay import ReplayChatCompletionClient

    h = UserProxyAgent("H", input_func=person)
    inner = DurableGraphFlow([h], DiGraphBuilder().add_node(h).build(), name="inner", human_input="wait")
    mind = SocietyOfMindAgent("M", team=inner, model_client=ReplayChatCompletionClient(["summary"]))
    outer = DurableGraphFlow([mind], DiGraphBuilder().add_node(mind).build(), store=sqlite_url, run_id="o")
    with pytest.raises(RuntimeError, match="inside a nested team"):
        await outer.run(task="go")
    assert outer.run_info().status == "failed"  # type: ignore[union-attr]


async def test_a_waiting_run_exported_and_imported_asks_again_and_finishes(
    store_url: str, tmp_path: Path
) -> None:
    asked.clear()
    parked = await one(store_url, run_id="src", human_input="wait").run(task="go")
    assert "waiting for input" in (parked.stop_reason or "")
    with Store(store_url) as store:
        document = store.export_run("src")
    with Store(f"sqlite:///{tmp_path / 'moved.db'}") as elsewhere:
        moved = elsewhere.import_run(document)
        assert moved.status == "interrupted" and elsewhere.pending_requests("src") == []
    team = one(f"sqlite:///{tmp_path / 'moved.db'}", run_id="src", human_input="wait")
    again = await team.run()  # H's turn runs again and asks again: a new request, here
    assert "waiting for input" in (again.stop_reason or "")
    info = team.run_info()
    assert info is not None and [r.node for r in info.pending] == ["H"]
    await team.respond("typed")
    done = await team.run()
    assert [m.source for m in done.messages][-1] == "C" and asked == []
