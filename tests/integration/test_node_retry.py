"""Per-node retries and timeouts: a failed attempt is a step of the history, the agent is put back
at its stored state, and the turn runs again; spent attempts fail the run with NodeFailedError."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence

import pytest
from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import BaseChatMessage

from agents import (
    Scripted,
    Streaming,
    chain,
    close_stores,
    durable,
    failing,
    fan,
    hanging,
    loop_agents,
    loop_graph,
    stored_transcript,
    wait_for,
)
from graphflow_durable import DurableGraphFlow, NodeFailedError, NodeRetryEvent, RetryPolicy, TimeoutPolicy
from graphflow_durable.cli.runs import main
from graphflow_durable.errors import NodeTimeoutError, UsageError

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _reference(url: str) -> list[tuple[str, str]]:
    agents = [Scripted(n) for n in "ABC"]
    await durable(agents, chain(*agents), url, "reference").run(task="go")
    return stored_transcript(durable(agents, chain(*agents), url, "reference"))


def _attempts_failed(team: DurableGraphFlow) -> list[dict[str, object]]:
    return [dict(s.data) for s in team.store.load(team.run_id).steps if s.kind.value == "attempt_failed"]


async def test_retryable_error_twice_then_an_answer_finishes_as_an_uninterrupted_run(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=failing(2) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", retry=FAST)
    events: list[object] = []
    with caplog.at_level(logging.WARNING, logger="graphflow_durable"):
        async for item in team.run_stream(task="go"):
            events.append(item)
    assert isinstance(events[-1], TaskResult)
    assert team.run_info().status == "finished"
    assert stored_transcript(team) == await _reference(store_url)
    failed = _attempts_failed(team)
    assert [(f["node"], f["attempt"], f["error_type"]) for f in failed] == [
        ("B", 1, "ConnectionError"),
        ("B", 2, "ConnectionError"),
    ]
    assert all(f["error"] == "B: connection reset by peer" and f["elapsed"] >= 0 for f in failed)
    assert calls == ["A", "B", "B", "B", "C"]
    # One turn's worth of memory, in the agent and in the store (not three).
    assert agents[1].turn == 1
    assert team.store.load("run").agent_states["B"] == {"turn": 1}
    retries = [e for e in events if isinstance(e, NodeRetryEvent)]
    assert [(r.node, r.attempt, r.error) for r in retries] == [
        ("B", 1, "ConnectionError: B: connection reset by peer"),
        ("B", 2, "ConnectionError: B: connection reset by peer"),
    ]
    assert not any(isinstance(m, NodeRetryEvent) for m in team.transcript())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("'B'" in r.getMessage() for r in warnings)


async def test_non_retryable_error_fails_at_once_with_node_failed_error(store_url: str) -> None:
    calls: list[str] = []
    agents = [Scripted(n, calls=calls, before=failing(5, ValueError) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", retry=FAST)
    with pytest.raises(NodeFailedError) as raised:
        await team.run(task="go")
    error = raised.value
    assert (error.node, error.attempts, error.error_type) == ("B", 1, "ValueError")
    assert error.error == "B: connection reset by peer" and error.run_id == "run"
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == error.error
    assert isinstance(error, RuntimeError)
    assert calls == ["A", "B"]
    run = team.run_info()
    assert run.status == "failed"
    assert run.result["node_failed"] == {
        "node": "B",
        "attempts": 1,
        "error_type": "ValueError",
        "error": "B: connection reset by peer",
        "cause": "error",
    }
    assert len(_attempts_failed(team)) == 1


@pytest.mark.parametrize(
    "policy, why",
    [
        (
            FAST,
            "failed after 1 of 3 allowed attempts: ValueError is not retryable under its retry policy "
            "(retry_on=[]); add it to retry_on to retry it; last error: ValueError: B: connection reset",
        ),
        (
            RetryPolicy(max_attempts=4, retry_on=("KeyError",), non_retryable=("ConnectionError",)),
            "failed after 1 of 4 allowed attempts: ConnectionError is not retryable under its retry "
            "policy (non_retryable=['ConnectionError']); remove it from non_retryable; last error: ",
        ),
    ],
    ids=["not-retryable", "listed-non-retryable"],
)
async def test_a_failure_with_attempts_left_says_why_it_was_not_retried_now_and_on_every_later_run(
    store_url: str, policy: RetryPolicy, why: str
) -> None:
    error_type = ValueError if policy is FAST else ConnectionError
    agents = [Scripted(n, before=failing(5, error_type) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", retry=policy)
    with pytest.raises(NodeFailedError) as raised:
        await team.run(task="go")
    assert why in str(raised.value), str(raised.value)
    assert "\n" not in str(raised.value)
    with pytest.raises(NodeFailedError) as again:  # a later run(), from the stored run
        await durable(agents, chain(*agents), store_url, "run", retry=policy).run()
    assert str(again.value) == str(raised.value)


async def test_spent_attempts_fail_the_run_with_the_last_error_chained(store_url: str) -> None:
    agents = [Scripted(n, before=failing(9) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", retry={"B": 2, "*": None})
    with pytest.raises(NodeFailedError) as raised:
        await team.run(task="go")
    assert (raised.value.node, raised.value.attempts, raised.value.error_type) == ("B", 2, "ConnectionError")
    assert "node 'B' failed after 2 of 2 allowed attempts; last error: ConnectionError" in str(raised.value)
    assert isinstance(raised.value.__cause__, ConnectionError)
    run = team.run_info()
    assert run.status == "failed" and run.result["node_failed"]["attempts"] == 2
    assert [f["attempt"] for f in _attempts_failed(team)] == [1, 2]
    assert run.lease_owner is None


async def test_without_a_policy_an_agent_error_fails_the_run_as_graphflow_does(store_url: str) -> None:
    agents = [Scripted(n, before=failing(1) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run")
    with pytest.raises(RuntimeError, match="connection reset by peer") as raised:
        await team.run(task="go")
    assert not isinstance(raised.value, NodeFailedError)
    assert team.run_info().status == "failed" and _attempts_failed(team) == []
    assert "node_failed" not in (team.run_info().result or {})
    await durable(agents, chain(*agents), store_url, "run").run()  # resumes the failed round, as today
    assert team.run_info().status == "finished"


async def test_idle_timeout_stops_a_hung_agent_and_retries_it(store_url: str) -> None:
    agents = [Scripted(n, before=hanging(1) if n == "B" else None) for n in "ABC"]
    team = durable(
        agents, chain(*agents), store_url, "run", retry=FAST, timeout=TimeoutPolicy(idle_timeout=0.3)
    )
    await team.run(task="go")
    assert team.run_info().status == "finished"
    [failed] = _attempts_failed(team)
    assert (failed["node"], failed["attempt"], failed["error_type"]) == ("B", 1, "NodeTimeoutError")
    assert "idle_timeout" in str(failed["error"])
    assert agents[1].turn == 1


async def test_timeout_without_a_retry_policy_fails_after_one_attempt(sqlite_url: str) -> None:
    agents = [Scripted(n, before=hanging(1) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), sqlite_url, "run", timeout={"B": 0.2})
    with pytest.raises(NodeFailedError) as raised:
        await team.run(task="go")
    assert raised.value.attempts == 1 and raised.value.error_type == "NodeTimeoutError"
    assert isinstance(raised.value.__cause__, NodeTimeoutError)
    assert team.run_info().result["node_failed"]["cause"] == "timeout"


async def test_an_agent_streaming_steadily_past_idle_timeout_is_not_stopped(sqlite_url: str) -> None:
    agent = Streaming("S", chunks=8, every=0.05)
    team = durable([agent], chain(agent), sqlite_url, "run", timeout=TimeoutPolicy(idle_timeout=0.2))  # type: ignore[list-item, arg-type]
    result = await team.run(task="go")
    assert result.messages[-1].to_text() == "done"
    assert team.run_info().status == "finished"


async def test_run_timeout_stops_a_steadily_streaming_agent(sqlite_url: str) -> None:
    agent = Streaming("S", chunks=40, every=0.05)
    team = durable(  # type: ignore[arg-type]
        [agent],  # type: ignore[list-item]
        chain(agent),  # type: ignore[arg-type]
        sqlite_url,
        "run",
        timeout=TimeoutPolicy(run_timeout=0.4, idle_timeout=0.2),
    )
    with pytest.raises(NodeFailedError) as raised:
        await team.run(task="go")
    assert isinstance(raised.value.__cause__, NodeTimeoutError)
    assert raised.value.__cause__.kind == "run_timeout"


def test_policies_round_trip_through_the_component_config() -> None:
    agents = [Scripted(n) for n in "ABC"]
    retry = {"*": RetryPolicy(max_attempts=3), "B": 5, "C": None}
    timeout = {"*": TimeoutPolicy(run_timeout=900, idle_timeout=120), "A": 60.0}
    team = DurableGraphFlow(agents, chain(*agents), store="sqlite://", retry=retry, timeout=timeout)  # type: ignore[arg-type]
    config = team.dump_component()
    loaded = DurableGraphFlow.load_component(config)
    assert loaded.dump_component().config == config.config
    turns = loaded._session.turns
    assert turns.retry == {"A": RetryPolicy(max_attempts=3), "B": RetryPolicy(max_attempts=5), "C": None}
    assert turns.timeout["A"] == TimeoutPolicy(run_timeout=60.0)
    assert turns.timeout["B"] == TimeoutPolicy(run_timeout=900, idle_timeout=120)
    plain = DurableGraphFlow(agents, chain(*agents), store="sqlite://")  # type: ignore[arg-type]
    assert plain.dump_component().config.get("retry") is None


def test_a_policy_for_an_unknown_node_is_refused_at_construction() -> None:
    agents = [Scripted(n) for n in "AB"]
    with pytest.raises(UsageError, match="'Z'"):
        DurableGraphFlow(agents, chain(*agents), store="sqlite://", retry={"Z": 3})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="'Z'"):
        DurableGraphFlow(agents, chain(*agents), store="sqlite://", timeout={"Z": 3.0})  # type: ignore[arg-type]


async def test_runs_history_shows_each_failed_attempt_with_its_error_and_elapsed_time(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = [Scripted(n, before=failing(2) if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "run", retry=FAST)
    await team.run(task="go")
    assert main(["runs", "history", "--store", store_url, "run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "attempt_failed" in line]
    assert len(lines) == 2
    for attempt, line in enumerate(lines, 1):
        cells = line.split()
        assert cells[2:5] == ["attempt_failed", "B", str(attempt)]
        assert "ConnectionError: B: connection reset by peer (after " in line and line.endswith(" s)")
    assert main(["runs", "history", "--store", store_url, "run", "--json", "--node", "B"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["attempt"]) for r in rows] == [
        ("attempt_failed", 1),
        ("attempt_failed", 2),
        ("complete", 3),
    ]
    assert rows[0]["error_type"] == "ConnectionError" and rows[0]["error"] == "B: connection reset by peer"
    assert isinstance(rows[0]["elapsed"], float) and "error_type" not in rows[2]
    assert rows == [s.as_dict() for s in team.history(node="B")]


async def test_an_interrupt_during_the_back_off_leaves_the_rest_of_it_to_the_next_driver(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agents = [Scripted(n, before=failing(1) if n == "B" else None) for n in "ABC"]
    slow = RetryPolicy(max_attempts=3, initial_interval=2.0, jitter=False)
    team = durable(agents, chain(*agents), store_url, "run", retry=slow, interrupt_grace_seconds=5)
    running = asyncio.ensure_future(team.run(task="go"))
    await wait_for(lambda: bool(team.store.get_run("run")) and len(_attempts_failed(team)) == 1)
    running.cancel()
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        await running
    assert not [r for r in caplog.records if "interrupt_grace_seconds" in r.getMessage()]
    retry_at = _attempts_failed(team)[0]["retry_at"]
    assert isinstance(retry_at, float)
    run = team.run_info()
    # An orderly interrupt: the run is interrupted, not running (the next driver counts no crash).
    assert run.status == "interrupted" and run.lease_owner is None
    assert run.next_attempt_at == retry_at
    assert team.store.load("run").scheduler["s"]["in_flight"] == ["B"]
    for interrupt in (True, False):
        resumed = durable(agents, chain(*agents), store_url, "run", retry=slow)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="graphflow_durable"):
            resuming = asyncio.ensure_future(resumed.run())
            # The next driver holds the run and waits out what is left of the back-off, counting no crash.
            await wait_for(lambda: any("backing off until" in r.getMessage() for r in caplog.records))
        assert team.store.get_run("run").lease_owner == resumed._session.owner
        waiting = team.run_info()
        assert waiting.status == "interrupted" and waiting.next_attempt_at == retry_at
        assert waiting.turns == {"B": {"attempts": 1, "failures": 1, "crashes": 0}}
        if interrupt:  # interrupted again while it waits: nothing dispatched, the lease released
            resuming.cancel()
            with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
                await resuming
            again = team.run_info()
            assert again.status == "interrupted" and again.lease_owner is None
            assert again.next_attempt_at == retry_at and again.turns == waiting.turns
        else:
            await resuming
    assert not [r for r in caplog.records if "interrupt_grace_seconds" in r.getMessage()]
    assert stored_transcript(team) == await _reference(store_url)
    # The interrupted back-off dispatched nothing: the next driver's is the second attempt, and it
    # was dispatched once the recorded time had come, not before.
    assert [(s.kind, s.attempt) for s in team.history(node="B")] == [("attempt_failed", 1), ("complete", 2)]
    redispatch = next(s for s in team.history() if s.kind == "resume" and "B" in s.dispatched)
    assert redispatch.time >= retry_at
    assert team.run_info().next_attempt_at is None


async def test_a_timeout_cancels_only_its_own_turn_the_batch_siblings_run_on(sqlite_url: str) -> None:
    async def slow_but_cancellable(agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        waiting = asyncio.ensure_future(asyncio.sleep(0.6))
        assert agent.token is not None
        agent.token.link_future(waiting)  # as a model call does: the turn's token cancels it
        await waiting

    hooks = {"B1": hanging(1), "B2": slow_but_cancellable}
    agents = [Scripted(n, before=hooks.get(n)) for n in ("A", "B1", "B2", "D")]
    team = durable(
        agents,
        fan(*agents),
        sqlite_url,
        "run",
        retry={"B1": FAST},
        timeout={"B1": TimeoutPolicy(idle_timeout=0.2)},
    )
    await asyncio.wait_for(team.run(task="go"), 30)  # a cancelled sibling would leave the batch hanging
    assert team.run_info().status == "finished"
    steps = sorted((s.kind, s.node, s.attempt) for s in team.history() if s.node in ("B1", "B2"))
    assert steps == [("attempt_failed", "B1", 1), ("complete", "B1", 2), ("complete", "B2", 1)]
    assert [a.turn for a in agents] == [1, 1, 1, 1]


async def test_a_later_turn_that_fails_is_retried_from_the_agents_state_after_its_last_turn(
    store_url: str,
) -> None:
    def reference_agents() -> dict[str, Scripted]:
        return loop_agents([])

    reference = reference_agents()
    await durable(reference, loop_graph(reference), store_url, "reference", max_turns=40).run(task="go")

    agents = loop_agents([], {"R": failing(2, turn=2)})  # R's second turn drops twice
    team = durable(agents, loop_graph(agents), store_url, "run", max_turns=40, retry={"R": FAST})
    await team.run(task="go")
    assert stored_transcript(team) == stored_transcript(
        durable(reference, loop_graph(reference), store_url, "reference", max_turns=40)
    )
    assert [(f["node"], f["attempt"]) for f in _attempts_failed(team)] == [("R", 1), ("R", 2)]
    assert agents["R"].turn == reference["R"].turn == 3
