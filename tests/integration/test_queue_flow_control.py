"""Flow control of the worker pool: named queues with settings in the database, priorities,
partitions, delayed starts, and the caps the claim enforces (on both backends)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa

from graphflow_durable._storage import flowcontrol
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.cli.runs import EXIT_CONFLICT, EXIT_OK, EXIT_USAGE, main
from graphflow_durable.errors import RunExistsError, StoreError, UsageError
from graphflow_durable.store import Claim, Store

from .test_store_queue import interrupt

LEASE = 60.0


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def start(store: Store, owner: str) -> str | None:
    """Claim one item as ``owner`` and, for a submission, create its run under ``owner``'s lease (as
    a worker's team does); the run id, or ``None``."""
    claim = store.queue.claim(owner, lease_seconds=LEASE)
    if claim is None:
        return None
    if claim.kind == "submission":
        store._driver.create_run(
            CreateRequest(claim.run_id, graph_fingerprint="fp", graph={}, owner=owner, lease_seconds=LEASE)
        )
    return claim.run_id


def test_configure_checks_every_setting_before_writing_and_a_bad_one_changes_nothing(store: Store) -> None:
    done = store.queue.configure("support", concurrency=20, partition_concurrency=1, rate="100/60s")
    assert done.to_json() == {
        "queue": "support",
        "concurrency": 20,
        "worker_concurrency": None,
        "partition_concurrency": 1,
        "rate": "100/60s",
    }
    bad: list[dict[str, object]] = [
        {"concurrency": 0},
        {"concurrency": -3},
        {"worker_concurrency": True},
        {"partition_concurrency": 1.5},
        {"concurrency": "3"},
        {"rate": "100"},
        {"rate": "0/60s"},
        {"rate": "10/0s"},
        {"rate": "10/60x"},
        {"rate": "ten/1m"},
    ]
    for values in bad:
        with pytest.raises(UsageError):
            store.queue.configure("support", **{"worker_concurrency": 5, **values})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="queue must be a non-empty name"):
        store.queue.configure(" support", concurrency=5)
    assert store.queue.settings()["support"] == done
    assert store.queue.configure("q", rate="5/1m").rate_limit() == (5, 60.0)
    assert store.queue.configure("q", rate="1000 / h").rate == "1000/h"
    assert store.queue.configure("q", worker_concurrency=2).rate_limit() == (1000, 3600.0)  # kept


def test_clear_removes_one_setting_and_an_unknown_setting_is_a_usage_error(store: Store) -> None:
    store.queue.configure("q", concurrency=2, rate="10/1s")
    assert store.queue.clear("q", "rate").to_json()["rate"] is None
    assert store.queue.settings()["q"].concurrency == 2
    with pytest.raises(UsageError, match="no queue setting 'speed'"):
        store.queue.clear("q", "speed")


def test_submit_is_idempotent_over_task_team_queue_priority_and_partition(store: Store) -> None:
    first = store.queue.submit("r1", task="t", team="a", queue="q", priority=3, partition="acme")
    assert (first.queue, first.priority, first.partition) == ("q", 3, "acme")
    assert store.queue.submit("r1", task="t", team="a", queue="q", priority=3, partition="acme") == first
    for other in ({"queue": "q2"}, {"priority": 4}, {"partition": "bolt"}, {"partition": None}):
        placed: dict[str, object] = {"queue": "q", "priority": 3, "partition": "acme", **other}
        with pytest.raises(RunExistsError, match="run r1 was already submitted"):
            store.queue.submit("r1", task="t", team="a", **placed)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="priority must be a whole number"):
        store.queue.submit("r2", task="t", team="a", priority=1.5)  # type: ignore[arg-type]


def test_a_queue_concurrency_cap_counts_driven_runs_across_workers(store: Store) -> None:
    store.queue.configure("q", concurrency=2)
    for i in range(4):
        store.queue.submit(f"r{i}", task="t", team=None, queue="q")
    assert start(store, "w1") == "r0"
    assert start(store, "w2") == "r1"
    assert store.queue.claim("w3", lease_seconds=LEASE) is None
    assert "concurrency cap (2 of 2 driven)" in str(store.queue.why_not_started("r2"))
    run = store.get_run("r0")
    assert run is not None
    interrupt(store, "r0", run.fencing_token)  # released: driven no more (and claimable again)
    assert start(store, "w3") in ("r0", "r2")
    assert store.queue.claim("w4", lease_seconds=LEASE) is None


def test_runs_waiting_for_a_person_or_backing_off_do_not_count_against_the_cap(store: Store) -> None:
    store.queue.configure("q", concurrency=1)
    store.queue.submit("a", task="t", team=None, queue="q")
    store.queue.submit("b", task="t", team=None, queue="q")
    assert start(store, "w1") == "a"
    run = store.get_run("a")
    assert run is not None
    interrupt(store, "a", run.fencing_token)
    store.queue.record_failure("a", error="boom", retry_at=time.time() + 60)  # backing off
    assert start(store, "w2") == "b"


def test_worker_concurrency_caps_one_worker_and_leaves_the_others_free(store: Store) -> None:
    store.queue.configure("q", worker_concurrency=1)
    for i in range(3):
        store.queue.submit(f"r{i}", task="t", team=None, queue="q")
    assert start(store, "w1") == "r0"
    assert store.queue.claim("w1", lease_seconds=LEASE) is None
    assert start(store, "w2") == "r1"


def test_one_run_per_partition_while_other_partitions_go_on(store: Store) -> None:
    store.queue.submit("acme-1", task="t", team=None, partition="acme")
    store.queue.submit("acme-2", task="t", team=None, partition="acme")
    store.queue.submit("bolt-1", task="t", team=None, partition="bolt")
    store.queue.submit("plain", task="t", team=None)
    assert [start(store, f"w{i}") for i in range(4)] == ["acme-1", "bolt-1", "plain", None]
    assert store.queue.why_not_started("acme-2") == "partition acme of queue default is busy (1 of 1 driven)"
    store.queue.configure("default", partition_concurrency=2)
    assert start(store, "w9") == "acme-2"


def test_lower_priority_first_then_oldest_runs_and_submissions_alike(store: Store) -> None:
    store.queue.submit("late", task="t", team=None, priority=5)
    store.queue.submit("urgent", task="t", team=None, priority=-1)
    store.queue.submit("normal-1", task="t", team=None)
    store.queue.submit("normal-2", task="t", team=None)
    order = [start(store, "w") for _ in range(4)]
    assert order == ["urgent", "normal-1", "normal-2", "late"]
    for run_id in ("late", "normal-2"):  # interrupted runs come back in priority order too
        run = store.get_run(run_id)
        assert run is not None
        interrupt(store, run_id, run.fencing_token)
    store.queue.submit("new", task="t", team=None, priority=1)
    assert [start(store, "x") for _ in range(3)] == ["normal-2", "new", "late"]


def test_a_delayed_start_is_not_claimed_before_its_time(store: Store) -> None:
    store.queue.submit("later", task="t", team=None, not_before=time.time() + 0.8)
    assert store.queue.claim("w", lease_seconds=LEASE) is None
    assert str(store.queue.why_not_started("later")).startswith("not due until ")
    time.sleep(0.9)
    assert start(store, "w") == "later"


def test_a_capped_queue_never_blocks_the_claimable_runs_of_other_queues_behind_it(store: Store) -> None:
    store.queue.configure("bulk", concurrency=1)
    for i in range(50):
        store.queue.submit(f"bulk-{i}", task="t", team=None, queue="bulk")
    for i in range(3):
        store.queue.submit(f"acme-{i}", task="t", team=None, partition="acme")
    store.queue.submit("other", task="t", team=None, queue="other")
    got = [start(store, f"w{i}") for i in range(4)]
    assert got == ["bulk-0", "acme-0", "other", None]


def test_a_rate_limits_the_starts_per_period(store: Store) -> None:
    store.queue.configure("q", rate="2/1s")
    for i in range(4):
        store.queue.submit(f"r{i}", task="t", team=None, queue="q")
    assert [start(store, "w") for _ in range(3)] == ["r0", "r1", None]
    assert "at its rate" in str(store.queue.why_not_started("r2"))
    time.sleep(1.1)
    assert start(store, "w") == "r2"


def test_a_worker_claims_only_from_its_queues(store: Store) -> None:
    store.queue.submit("a", task="t", team=None, queue="qa")
    store.queue.submit("b", task="t", team=None, queue="qb")
    claim = store.queue.claim("w", lease_seconds=LEASE, queues=["qb"])
    assert claim is not None and claim.run_id == "b" and claim.queue == "qb"
    assert store.queue.claim("w", lease_seconds=LEASE, queues=["qb"]) is None


def test_a_dead_holders_claim_stops_counting_at_once_on_its_host(store: Store) -> None:
    store.queue.configure("q", concurrency=1)
    store.queue.submit("a", task="t", team=None, queue="q")
    store.queue.submit("b", task="t", team=None, queue="q")
    taken = store.queue.claim("gone", lease_seconds=LEASE, host=socket.gethostname(), pid=dead_pid())
    assert taken is not None and taken.run_id == "a"
    again = store.queue.claim("alive", lease_seconds=LEASE)
    assert again is not None  # the dead claim does not hold the queue's one slot


def test_a_retried_run_keeps_its_queue_priority_and_partition(store: Store) -> None:
    store.queue.submit("r", task="t", team=None, queue="q", priority=2, partition="acme")
    assert start(store, "w") == "r"
    run = store.get_run("r")
    assert run is not None
    interrupt(store, "r", run.fencing_token)
    store.retry_run("r")
    sub = store.queue.get_submission("r")
    assert sub is not None and (sub.queue, sub.priority, sub.partition) == ("q", 2, "acme")
    claim = store.queue.claim("w2", lease_seconds=LEASE)
    assert claim is not None and (claim.queue, claim.priority, claim.partition) == ("q", 2, "acme")


def test_queue_stats_count_queued_claimable_active_waiting_and_scheduled(store: Store) -> None:
    store.queue.configure("q", concurrency=1)
    store.queue.configure("empty", rate="1/1s")
    for i in range(3):
        store.queue.submit(f"r{i}", task="t", team=None, queue="q")
    store.queue.submit("soon", task="t", team=None, queue="q", not_before=time.time() + 60)
    assert start(store, "w") == "r0"
    stats = {row["queue"]: row for row in store.queue.stats()}
    q = stats["q"]
    assert (q["queued"], q["claimable"], q["active"], q["waiting"], q["scheduled"]) == (3, 0, 1, 0, 1)
    assert q["oldest_queued_age"] >= 0 and q["concurrency"] == 1
    assert (stats["empty"]["queued"], stats["empty"]["rate"]) == (0, "1/1s")


def cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, list[str]]:
    code = main([*args, "--store", url])
    return code, capsys.readouterr().out.splitlines()


def test_the_queues_commands_set_list_and_clear_and_refuse_bad_values_with_exit_2(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(capsys, store_url, "queues", "set", "support", "--concurrency", "20", "--rate", "500/1m")
    assert code == EXIT_OK and out == ["queue support: concurrency 20, rate 500/1m"]
    assert cli(capsys, store_url, "queues", "set", "support", "--concurrency", "0")[0] == EXIT_USAGE
    assert cli(capsys, store_url, "queues", "set", "support", "--rate", "5/fortnight")[0] == EXIT_USAGE
    code, out = cli(capsys, store_url, "submit", "c1", "help me", "--queue", "support", "--partition", "acme")
    assert code == EXIT_OK
    code, _ = cli(capsys, store_url, "submit", "c1", "help me", "--queue", "support", "--priority", "1")
    assert code == EXIT_CONFLICT
    at = "2099-01-01T09:00:00Z"
    code, out = cli(capsys, store_url, "submit", "c2", "later", "--queue", "support", "--at", at, "--json")
    assert code == EXIT_OK and json.loads(out[0])["not_before"] == 4070941200.0
    code, out = cli(capsys, store_url, "queues", "list", "--json")
    (row,) = [json.loads(line) for line in out]
    assert {k: row[k] for k in ("queue", "concurrency", "worker_concurrency", "partition_concurrency")} == {
        "queue": "support",
        "concurrency": 20,
        "worker_concurrency": None,
        "partition_concurrency": None,
    }
    assert (row["rate"], row["queued"], row["active"], row["waiting"], row["claimable"]) == (
        "500/1m",
        2,
        0,
        0,
        1,
    )
    code, out = cli(capsys, store_url, "runs", "show", "c2", "--json")
    assert json.loads(out[0])["not_starting"] == "not due until 2099-01-01T09:00:00Z"
    code, out = cli(capsys, store_url, "runs", "list", "--queue", "support", "--json")
    assert sorted(json.loads(line)["run_id"] for line in out) == ["c1", "c2"]
    assert cli(capsys, store_url, "runs", "list", "--queue", "other", "--json")[1] == []
    code, out = cli(capsys, store_url, "queues", "clear", "support", "rate", "--json")
    assert code == EXIT_OK and json.loads(out[0])["rate"] is None
    assert cli(capsys, store_url, "queues", "clear", "support", "speed")[0] == EXIT_USAGE


def test_a_claim_reports_a_throttled_queue_only_when_runs_wait_behind_its_cap(store: Store) -> None:
    store.queue.configure("q", concurrency=1)
    store.queue.submit("a", task="t", team=None, queue="q")
    assert start(store, "w1") == "a"
    seen: list[tuple[str, str]] = []
    assert (
        store.queue.claim("w2", lease_seconds=LEASE, throttled=lambda q, why: seen.append((q, why))) is None
    )
    assert seen == []  # at its cap, but nothing waits behind it
    store.queue.submit("b", task="t", team=None, queue="q")
    assert (
        store.queue.claim("w2", lease_seconds=LEASE, throttled=lambda q, why: seen.append((q, why))) is None
    )
    assert seen == [("q", "queue q is at its concurrency cap (1 of 1 driven)")]


def test_a_claim_is_not_held_up_by_a_stopped_claimer_and_holds_its_slot_for_a_whole_lease(
    store_url: str,
) -> None:
    """Another claimer stopped inside its claim (here: a connection holding the queue's lock on
    PostgreSQL, the write lock on SQLite) for longer than the lease: on PostgreSQL a claim does not
    wait for it (it leaves the queue to its next claim); on SQLite it waits, and its claim then
    expires a lease after it was made, not after it began (an already expired claim would count
    against no cap, and a second run of the partition would start)."""
    with Store(store_url) as store:
        store.queue.submit("a", task="t", team=None, partition="acme")
        store.queue.submit("b", task="t", team=None, partition="acme")
        blocker = sa.create_engine(store_url, poolclass=sa.NullPool)
        postgres = blocker.dialect.name == "postgresql"
        with blocker.connect() as conn:
            if postgres:
                conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), hashtext(:name))"),
                    {"space": flowcontrol._LOCK_SPACE, "name": "default"},
                )
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            got: list[tuple[object, float]] = []

            def claim() -> None:
                started = time.monotonic()
                got.append((store.queue.claim("w", lease_seconds=1.0), time.monotonic() - started))

            claimer = threading.Thread(target=claim)
            claimer.start()
            time.sleep(1.5)  # longer than the lease
            conn.rollback()
        claimer.join(30)
        blocker.dispose()
        ((found, waited),) = got
        if postgres:
            assert found is None and waited < 1.2
            found = store.queue.claim("w", lease_seconds=1.0)
        assert isinstance(found, Claim) and found.run_id == "a"
        assert found.expires_at > time.time() + 0.5
        assert store.queue.claim("w", lease_seconds=1.0) is None  # acme is busy: "a" holds it


def test_a_run_created_from_its_claimed_submission_during_a_claims_count_still_counts(
    store_url: str,
) -> None:
    """Another worker claims the queue's one slot after a claim first counted it free, and creates
    the run of the submission it claimed (its claim stops counting, its run's lease starts) while
    that claim counts again under the queue's lock: the count sees that run as a run or as a claim,
    never as neither (a second run of a queue capped at one would start). SQLite serialises the
    two workers (the other waits for the claim's write lock): one of them gets the slot."""
    with Store(store_url) as store, Store(store_url) as other:
        store.queue.configure("q", concurrency=1)
        store.queue.submit("a", task="t", team=None, queue="q")
        store.queue.submit("b", task="t", team=None, queue="q")
        postgres = store.dialect == "postgresql"
        wait = 10.0 if postgres else 0.2  # SQLite: the other worker waits for the claim's write lock
        claim_now, create_now, claimed, created = (threading.Event() for _ in range(4))
        got: list[Claim | None] = []

        def other_worker() -> None:  # as a worker and its team: claim, then create the run
            claim_now.wait(30)
            got.append(other.queue.claim("w1", lease_seconds=LEASE))
            claimed.set()
            create_now.wait(30)
            if got[0] is not None and got[0].kind == "submission":
                run = CreateRequest(
                    got[0].run_id, graph_fingerprint="fp", graph={}, owner="w1", lease_seconds=LEASE
                )
                other._driver.create_run(run)
            created.set()

        claimer = threading.get_ident()
        locked: list[bool] = []

        def interleave(conn: object, cursor: object, statement: str, *args: object) -> None:
            if threading.get_ident() != claimer:
                return
            if "pg_try_advisory_xact_lock" in statement:
                locked.append(True)
            elif "FOR UPDATE" in statement and not claim_now.is_set():
                claim_now.set()  # after this claim's first count, before it picks a candidate
                claimed.wait(wait)
            elif locked and "claim_expires_at >=" in statement and not create_now.is_set():
                create_now.set()  # the count under the lock (its runs counted first, if apart)
                created.wait(wait)

        helper = threading.Thread(target=other_worker)
        helper.start()
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", interleave)
        try:
            second = store.queue.claim("w2", lease_seconds=LEASE)
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", interleave)
            claim_now.set()
            create_now.set()
            helper.join(30)
        if postgres:  # the interleaving happened: the other worker's claim and run inside this claim
            assert locked and created.is_set() and got[0] is not None and got[0].run_id == "a"
        holders = [c.run_id for c in (got[0], second) if c is not None]
        assert len(holders) == 1, f"both workers claimed a run of a queue capped at one: {holders}"
        assert "concurrency cap (1 of 1 driven)" in str(store.queue.why_not_started("b"))


def test_a_database_error_while_reporting_throttled_queues_is_a_store_error(store: Store) -> None:
    """The throttled report after a claim that found nothing reads the database too: its failure (a
    server restarting) is a StoreError, which a worker takes as a database problem and pauses its
    claims for, not an unexpected error that ends the worker."""
    store.queue.configure("q", concurrency=1)
    for run_id in ("a", "b"):
        store.queue.submit(run_id, task="t", team=None, queue="q")
    assert start(store, "w1") == "a"
    driver_error = store._e.engine.dialect.loaded_dbapi.OperationalError

    def fail(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.startswith("SELECT graphflow_runs.run_id"):  # a run waiting behind a cap
            raise driver_error("server closed the connection unexpectedly")

    seen: list[str] = []
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", fail)
    try:
        with pytest.raises(StoreError, match="throttled"):
            store.queue.claim("w2", lease_seconds=LEASE, throttled=lambda name, why: seen.append(name))
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", fail)
    assert seen == []
    assert store.queue.claim("w2", lease_seconds=LEASE, throttled=lambda name, why: seen.append(name)) is None
    assert seen == ["q"]
