"""Managing runs from outside their driver: cancel, retry, delete, prune and stats on the Store."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from agents import Scripted
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import (
    LeaseLostError,
    RunLockedError,
    RunNotFoundError,
    RunStateError,
    UsageError,
)
from graphflow_durable.store import AgentStateRecord, RunUpdate, Store

from .test_store import LEASE, commit_text, start

TABLES = ("agent_states", "messages", "steps", "input_requests", "call_records", "queue", "runs")


@pytest.fixture
def raw(store_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    yield engine
    engine.dispose()


def rows_of(raw: sa.Engine, run_id: str) -> dict[str, int]:
    with raw.connect() as conn:
        return {
            t: conn.execute(
                sa.text(f"SELECT COUNT(*) FROM graphflow_{t} WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
            for t in TABLES
        }


def made(store: Store, run_id: str, *, status: str | None = None, parent: str | None = None) -> int:
    """A run with one committed step (a message and an agent state); ``status``: ended with it and
    its lease released. Returns the fencing token."""
    token = store._driver.create_run(
        CreateRequest(
            run_id,
            graph_fingerprint="fp",
            graph={},
            owner="worker-1",
            lease_seconds=LEASE,
            parent_run_id=parent,
        )
    ).fencing_token
    update = None if status is None else RunUpdate(status=status, release_lease=True)  # type: ignore[arg-type]
    commit_text(store, run_id, 0, token, 0, agent_states=[AgentStateRecord("a", {"n": 1})], update=update)
    return token


def age(raw: sa.Engine, run_id: str, days: float) -> None:
    with raw.begin() as conn:
        conn.execute(
            sa.text("UPDATE graphflow_runs SET updated_at = :t WHERE run_id = :r"),
            {"t": time.time() - days * 86400, "r": run_id},
        )


# -- cancel -------------------------------------------------------------------------------------


def test_cancel_of_a_run_nobody_holds_makes_it_cancelled_at_once_and_fences_its_old_token(
    store: Store,
) -> None:
    token = made(store, "run-1", status="interrupted")
    done = store.cancel_run("run-1")
    assert (done.outcome, done.status, done.owner) == ("cancelled", "cancelled", None)
    run = store.get_run("run-1")
    assert run is not None and run.status == "cancelled" and run.lease_owner is None
    assert run.fencing_token == token + 1 and run.cancel_requested_at is None
    with pytest.raises(LeaseLostError):
        commit_text(store, "run-1", 1, token, 1)


def test_cancel_of_a_run_whose_driver_lease_expired_cancels_it_at_once(store: Store) -> None:
    store._driver.create_run(
        CreateRequest(
            "run-1", graph_fingerprint="f", graph={}, owner="gone", lease_seconds=0.01, host="elsewhere"
        )
    )
    time.sleep(0.05)
    assert store.cancel_run("run-1").outcome == "cancelled"
    run = store.get_run("run-1")
    assert run is not None and (run.status, run.lease_owner, run.fencing_token) == ("cancelled", None, 2)


def test_cancel_of_a_held_run_is_a_request_its_driver_reads_in_its_next_renewal(store: Store) -> None:
    token = start(store)
    assert (
        store._driver.heartbeat("run-1", "worker-1", token, lease_seconds=LEASE).cancel_requested_at is None
    )
    asked = store.cancel_run("run-1")
    assert (asked.outcome, asked.status, asked.owner) == ("requested", "running", "worker-1")
    run = store.get_run("run-1")
    assert run is not None and run.status == "running" and run.fencing_token == token  # not written over
    beat = store._driver.heartbeat("run-1", "worker-1", token, lease_seconds=LEASE)
    assert beat.cancel_requested_at == run.cancel_requested_at and beat.expires_at > time.time()
    assert store._driver.renew_lease("run-1", "worker-1", token, lease_seconds=LEASE) == pytest.approx(
        beat.expires_at, abs=5
    )
    assert store.cancel_run("run-1").outcome == "requested"  # asked twice: the first time is kept
    again = store.get_run("run-1")
    assert again is not None and again.cancel_requested_at == run.cancel_requested_at


def test_a_driver_recording_cancelled_settles_the_request(store: Store) -> None:
    token = start(store)
    store.cancel_run("run-1")
    commit_text(store, "run-1", 0, token, 0, update=RunUpdate(status="cancelled", release_lease=True))
    run = store.get_run("run-1")
    assert run is not None and (run.status, run.cancel_requested_at, run.lease_owner) == (
        "cancelled",
        None,
        None,
    )
    assert store.cancel_run("run-1").outcome == "already cancelled"


def test_a_run_finishing_before_its_driver_saw_the_request_keeps_it_until_the_next_round(
    store: Store,
) -> None:
    token = start(store)
    store.cancel_run("run-1")
    commit_text(store, "run-1", 0, token, 0, update=RunUpdate(status="finished", release_lease=True))
    run = store.get_run("run-1")
    assert run is not None and run.status == "finished"
    assert run.cancel_requested_at is not None and run.ended_before_cancel
    store._driver.acquire_lease("run-1", "next-round", lease_seconds=60)  # another round begins
    run = store.get_run("run-1")
    assert run is not None and run.cancel_requested_at is None and not run.ended_before_cancel


def test_cancel_refuses_an_unknown_run_and_an_ended_one(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="nope"):
        store.cancel_run("nope")
    made(store, "run-1", status="finished")
    with pytest.raises(RunStateError, match=r"run run-1 is finished.*nothing to cancel") as caught:
        store.cancel_run("run-1")
    assert caught.value.status == "finished"
    run = store.get_run("run-1")
    assert run is not None and run.status == "finished"


# -- retry --------------------------------------------------------------------------------------


def test_retry_of_a_cancelled_run_makes_it_claimable_again(store: Store) -> None:
    made(store, "run-1", status="interrupted")
    store.cancel_run("run-1")
    assert store.queue.claim("pool-1", lease_seconds=LEASE) is None  # the pool leaves cancelled runs alone
    done = store.retry_run("run-1")
    assert (done.previous_status, done.status, done.team) == ("cancelled", "interrupted", None)
    claim = store.queue.claim("pool-1", lease_seconds=LEASE)
    assert claim is not None and claim.run_id == "run-1"


def test_retry_of_a_failed_submitted_run_makes_it_claimable_and_keeps_its_count(store: Store) -> None:
    store.queue.submit("run-1", task="go", team="t")
    made(store, "run-1", status="failed")
    store.queue.record_failure("run-1", error="Boom", retry_at=time.time() + 3600)
    assert store.queue.claim("pool-1", lease_seconds=LEASE, teams=["t"]) is None  # failed: left alone
    done = store.retry_run("run-1")
    assert (done.previous_status, done.status, done.team) == ("failed", "interrupted", "t")
    claim = store.queue.claim("pool-1", lease_seconds=LEASE, teams=["t"])
    assert claim is not None and claim.run_id == "run-1" and claim.attempts == 1


def test_retry_refuses_a_held_run_an_ended_one_and_an_unknown_one(store: Store) -> None:
    start(store)
    with pytest.raises(RunLockedError, match="worker-1"):
        store.retry_run("run-1")
    made(store, "run-2", status="stopped")
    with pytest.raises(RunStateError, match="run run-2 is stopped"):
        store.retry_run("run-2")
    with pytest.raises(RunNotFoundError):
        store.retry_run("nope")


# -- delete -------------------------------------------------------------------------------------


def test_delete_removes_every_row_of_the_run_and_its_nested_runs_and_nothing_else(
    store: Store, raw: sa.Engine
) -> None:
    """Nested runs are the runs whose ``parent_run_id`` leads to the run, at any depth; a run whose
    id only looks like a nested run's is not one."""
    store.queue.submit("run-1", task="go", team="t")
    made(store, "run-1", status="finished")
    made(store, "run-1/a/3/inner", status="finished", parent="run-1")  # a nested durable team's run
    deeper = "run-1/a/3/inner/b/2/deeper"  # nested in the nested one
    made(store, deeper, status="finished", parent="run-1/a/3/inner")
    made(store, "child", status="finished", parent="run-1")
    keep = ["run-10", "run-1/notnested", "run-1_x", "other", "run-1/a/4/lookalike"]
    for run_id in keep:
        made(store, run_id, status="finished")
    before = {run_id: rows_of(raw, run_id) for run_id in keep}
    gone = store.delete_run("run-1")
    assert set(gone.run_ids) == {"run-1", "run-1/a/3/inner", "run-1/a/3/inner/b/2/deeper", "child"}
    assert gone.rows == {
        "graphflow_agent_states": 4,
        "graphflow_messages": 4,
        "graphflow_steps": 4,
        "graphflow_input_requests": 0,
        "graphflow_call_records": 0,
        "graphflow_queue": 1,
        "graphflow_runs": 4,
    }
    for run_id in gone.run_ids:
        assert rows_of(raw, run_id) == dict.fromkeys(TABLES, 0)
    assert {run_id: rows_of(raw, run_id) for run_id in keep} == before


def test_delete_ends_on_a_cycle_of_parents_and_removes_the_cycle_once(store: Store) -> None:
    """Imported runs may name each other as parents (or themselves): the tree query still ends."""
    made(store, "self", status="finished", parent="self")
    made(store, "a", status="finished", parent="b")
    made(store, "b", status="finished", parent="a")
    made(store, "c", status="finished", parent="b")
    assert store.delete_run("self").run_ids == ("self",)
    gone = store.delete_run("a")
    assert gone.run_ids == ("a", "b", "c") and gone.rows["graphflow_runs"] == 3
    assert store.list_runs() == []


def test_delete_refuses_a_running_run_unless_forced(store: Store, raw: sa.Engine) -> None:
    token = start(store)
    commit_text(store, "run-1", 0, token, 0)
    before = rows_of(raw, "run-1")
    with pytest.raises(RunStateError, match=r"run run-1 was not deleted: it is running \(held by worker-1"):
        store.delete_run("run-1")
    assert rows_of(raw, "run-1") == before
    made(store, "run-2", status="finished")
    store._driver.create_run(  # a nested run still being driven
        CreateRequest(
            "run-2/a/1/inner",
            graph_fingerprint="fp",
            graph={},
            owner="worker-1",
            lease_seconds=LEASE,
            parent_run_id="run-2",
        )
    )
    with pytest.raises(RunStateError, match="its nested run run-2/a/1/inner is running"):
        store.delete_run("run-2")
    assert store.delete_run("run-1", force=True).run_ids == ("run-1",)
    assert rows_of(raw, "run-1") == dict.fromkeys(TABLES, 0)
    with pytest.raises(RunNotFoundError):  # the driver's next write fails and writes nothing
        commit_text(store, "run-1", 1, token, 1)


def test_delete_dry_run_counts_and_removes_nothing(store: Store, raw: sa.Engine) -> None:
    made(store, "run-1", status="finished")
    before = rows_of(raw, "run-1")
    counted = store.delete_run("run-1", dry_run=True)
    assert counted.dry_run and counted.rows["graphflow_steps"] == 1 and counted.rows["graphflow_runs"] == 1
    assert rows_of(raw, "run-1") == before


def test_delete_of_an_unknown_run_says_so_and_a_submission_alone_is_deleted(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="run nope"):
        store.delete_run("nope")
    store.queue.submit("sub-1", task="go", team=None)
    assert store.delete_run("sub-1").rows["graphflow_queue"] == 1
    assert store.queue.get_submission("sub-1") is None


# -- prune --------------------------------------------------------------------------------------


def test_prune_is_a_dry_run_by_default_then_removes_only_old_runs_of_the_status(
    store: Store, raw: sa.Engine
) -> None:
    made(store, "old-done", status="finished")
    made(store, "old-failed", status="failed")
    made(store, "new-done", status="finished")
    age(raw, "old-done", 40)
    age(raw, "old-failed", 40)
    dry = store.prune(older_than=30 * 86400)
    assert dry.dry_run and dry.run_ids == ("old-done",) and dry.rows["graphflow_runs"] == 1
    assert rows_of(raw, "old-done")["runs"] == 1
    real = store.prune(older_than=30 * 86400, dry_run=False)
    assert (real.run_ids, real.dry_run) == (("old-done",), False)
    assert [r.run_id for r in store.list_runs()] == ["old-failed", "new-done"]
    both = store.prune(older_than=0, status=["finished", "failed"], dry_run=False)
    assert set(both.run_ids) == {"old-failed", "new-done"} and store.list_runs() == []


def test_prune_with_nothing_to_do_removes_nothing(store: Store) -> None:
    made(store, "run-1", status="finished")
    nothing = store.prune(older_than=86400, dry_run=False)
    assert nothing.run_ids == () and set(nothing.rows.values()) == {0}
    assert store.get_run("run-1") is not None


def test_prune_skips_runs_a_live_driver_holds_and_refuses_running_without_force(store: Store) -> None:
    made(store, "run-1", status="interrupted")
    store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)  # being resumed right now
    skipped = store.prune(older_than=0, status="interrupted", dry_run=False)
    assert (skipped.run_ids, skipped.skipped) == ((), ("run-1",))
    with pytest.raises(RunStateError, match=r"running runs.*force"):
        store.prune(older_than=0, status="running")
    forced = store.prune(older_than=0, status=["running", "interrupted"], dry_run=False, force=True)
    assert forced.run_ids == ("run-1",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"older_than": -1}, "older_than must be 0 seconds or more"),
        ({"older_than": float("nan")}, "older_than must be"),
        ({"older_than": 0, "status": "done"}, "unknown status 'done'"),
        ({"older_than": 0, "status": []}, "at least one status"),
    ],
)
def test_prune_refuses_bad_arguments(store: Store, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        store.prune(**kwargs)  # type: ignore[arg-type]


# -- stats --------------------------------------------------------------------------------------


def test_stats_count_runs_per_status_rows_and_bytes_per_table(store: Store) -> None:
    empty = store.stats()
    assert set(empty.runs.values()) == {0} and empty.rows["graphflow_runs"] == 0 and empty.submissions == 0
    made(store, "a", status="finished")
    made(store, "b", status="finished")
    made(store, "c", status="failed")
    store.queue.submit("d", task="go", team=None)
    stats = store.stats()
    assert stats.runs["finished"] == 2 and stats.runs["failed"] == 1 and stats.runs["running"] == 0
    assert stats.submissions == 1
    assert stats.rows == {
        "graphflow_agent_states": 3,
        "graphflow_messages": 3,
        "graphflow_steps": 3,
        "graphflow_input_requests": 0,
        "graphflow_call_records": 0,
        "graphflow_queue": 1,
        "graphflow_runs": 3,
    }
    assert all(isinstance(size, int) and size > 0 for size in stats.bytes.values())
    assert stats.as_dict()["runs"]["finished"] == 2


async def test_delete_of_a_run_waiting_for_a_person_removes_its_input_requests(
    store: Store, raw: sa.Engine
) -> None:
    from autogen_agentchat.agents import UserProxyAgent
    from autogen_agentchat.teams import DiGraphBuilder

    from graphflow_durable import DurableGraphFlow

    a, h = Scripted("A"), UserProxyAgent("H", input_func=lambda prompt: "typed")
    graph = DiGraphBuilder().add_node(a).add_node(h).add_edge(a, h).build()
    team = DurableGraphFlow([a, h], graph, store=store, run_id="asks", human_input="wait")
    await team.run(task="go")
    assert [r.node for r in store.pending_requests("asks")] == ["H"]
    gone = store.delete_run("asks")
    assert gone.rows["graphflow_input_requests"] == 1
    assert rows_of(raw, "asks") == dict.fromkeys(TABLES, 0)
    assert store.pending_requests("asks") == []
