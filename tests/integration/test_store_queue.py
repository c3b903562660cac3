"""The worker-pool queue: submit is idempotent, claim is atomic and never hands out finished runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.errors import LeaseLostError, NotSerializableError, RunExistsError, UsageError
from graphflow_durable.store import RunUpdate, Step, Store

LEASE = 60.0


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def make_run(store: Store, run_id: str, *, owner: str = "driver", lease: float = LEASE, **kw: object) -> int:
    return store._driver.create_run(
        CreateRequest(run_id, graph_fingerprint="fp", graph={}, owner=owner, lease_seconds=lease, **kw)
    ).fencing_token  # type: ignore[arg-type]


def finish(store: Store, run_id: str, token: int) -> None:
    run = store.get_run(run_id)
    assert run is not None
    store._driver.commit(
        CommitRequest(
            run_id,
            expected_head=run.head_seq,
            fencing_token=token,
            step=Step("complete", None, {}),
            update=RunUpdate(status="finished"),
        )
    )
    store._driver.release_lease(run_id, token)


def interrupt(store: Store, run_id: str, token: int) -> None:
    run = store.get_run(run_id)
    assert run is not None
    store._driver.commit(
        CommitRequest(
            run_id,
            expected_head=run.head_seq,
            fencing_token=token,
            step=Step("interrupt", None, {}),
            update=RunUpdate(status="interrupted"),
        )
    )
    store._driver.release_lease(run_id, token)


def test_submit_is_idempotent_per_run_id_and_a_different_task_is_refused_as_a_taken_run_id(
    store: Store,
) -> None:
    first = store.queue.submit("r1", task="write a poem", team="poets")
    again = store.queue.submit("r1", task="write a poem", team="poets")
    assert first == again and first.status == "pending" and first.task == "write a poem"
    with pytest.raises(
        RunExistsError, match=r"run r1 was already submitted .*write a poem.*new run_id"
    ) as taken:
        store.queue.submit("r1", task="write an essay", team="poets")
    assert isinstance(taken.value, UsageError) and (taken.value.run_id, taken.value.team) == ("r1", "poets")
    with pytest.raises(RunExistsError, match=r"run r1 was already submitted with team 'poets'"):
        store.queue.submit("r1", task="write a poem", team="essayists")
    assert [s.run_id for s in store.queue.list_submissions()] == ["r1"]


def test_submit_refuses_a_run_that_exists_without_a_submission_and_a_task_that_is_not_json(
    store: Store,
) -> None:
    make_run(store, "direct")
    with pytest.raises(RunExistsError, match=r"run direct already exists .* not submitted"):
        store.queue.submit("direct", task="t", team=None)
    with pytest.raises(NotSerializableError, match="task of run r2"):
        store.queue.submit("r2", task=object(), team=None)


def test_a_submission_is_claimed_once_and_only_by_a_worker_of_its_team(store: Store) -> None:
    store.queue.submit("r1", task="t1", team="a")
    assert store.queue.claim("w-b", lease_seconds=LEASE, teams=["b"]) is None
    claim = store.queue.claim("w-a", lease_seconds=LEASE, teams=["a"])
    assert claim is not None
    assert (claim.run_id, claim.kind, claim.team, claim.task, claim.reason) == (
        "r1",
        "submission",
        "a",
        "t1",
        "submitted",
    )
    assert store.queue.claim("w-a2", lease_seconds=LEASE, teams=["a"]) is None
    sub = store.queue.get_submission("r1")
    assert sub is not None and (sub.status, sub.claimed_by) == ("claimed", "w-a")


def test_once_its_run_exists_a_submission_is_governed_by_the_runs_lease(store: Store) -> None:
    store.queue.submit("r1", task="t1", team="a")
    claim = store.queue.claim("w1", lease_seconds=0.05, teams=["a"])
    assert claim is not None
    token = make_run(store, "r1", owner="w1")
    time.sleep(0.1)  # the submission's claim expired, but the run exists and is leased
    assert store.queue.claim("w2", lease_seconds=LEASE, teams=["a"]) is None
    interrupt(store, "r1", token)
    again = store.queue.claim("w2", lease_seconds=LEASE, teams=["a"])
    assert again is not None and (again.kind, again.task, again.status) == ("run", "t1", "interrupted")


def test_finished_runs_are_never_claimed(store: Store) -> None:
    finish(store, "done", make_run(store, "done"))
    store.queue.submit("sub-done", task="t", team=None)
    token = make_run(store, "sub-done")
    finish(store, "sub-done", token)
    assert store.queue.claim("w", lease_seconds=LEASE) is None


def test_interrupted_and_failed_runs_are_claimed_with_a_new_fencing_token(store: Store) -> None:
    interrupt(store, "r1", make_run(store, "r1"))
    claim = store.queue.claim("w", lease_seconds=LEASE)
    assert claim is not None and (claim.run_id, claim.kind, claim.fencing_token) == ("r1", "run", 2)
    run = store.get_run("r1")
    assert run is not None and (run.lease_owner, run.fencing_token) == ("w", 2)


def test_a_live_lease_is_not_claimable_but_an_expired_one_is_and_fences_the_old_driver(store: Store) -> None:
    make_run(store, "live")
    old = make_run(store, "stale", lease=0.05)
    time.sleep(0.1)
    claim = store.queue.claim("w2", lease_seconds=LEASE)
    assert claim is not None and claim.run_id == "stale" and claim.reason == "expired"
    assert store.queue.claim("w3", lease_seconds=LEASE) is None  # "live" stays with its driver
    with pytest.raises(LeaseLostError):
        store._driver.commit(
            CommitRequest("stale", expected_head=0, fencing_token=old, step=Step("complete", "a", {}))
        )


def test_the_run_of_a_dead_process_on_this_host_is_claimable_at_once(store: Store) -> None:
    make_run(store, "orphan", lease=3600, pid=dead_pid())
    make_run(store, "remote", lease=3600, pid=dead_pid(), host=socket.gethostname() + "-elsewhere")
    started = time.perf_counter()
    claim = store.queue.claim("w", lease_seconds=LEASE)
    assert time.perf_counter() - started < 1.0
    assert claim is not None and claim.run_id == "orphan" and "is gone" in claim.reason
    assert store.queue.claim("w2", lease_seconds=LEASE) is None  # another host's dead pid: wait for expiry


def test_a_worker_claims_its_own_expired_lease_with_a_new_token_unless_it_still_drives_the_run(
    store: Store,
) -> None:
    make_run(store, "live", owner="w")
    old = make_run(store, "mine", owner="w", lease=0.01)
    time.sleep(0.05)
    assert store.queue.claim("w", lease_seconds=LEASE, skip={"mine"}) is None  # its driver lives on
    claim = store.queue.claim("w", lease_seconds=LEASE)
    assert claim is not None and (claim.run_id, claim.reason) == ("mine", "expired")
    assert claim.fencing_token > old
    with pytest.raises(LeaseLostError):  # the old driver of the same owner is fenced off
        store._driver.commit(
            CommitRequest("mine", expected_head=0, fencing_token=old, step=Step("complete", "a", {}))
        )
    assert store.queue.claim("w", lease_seconds=LEASE) is None  # its live lease stays its own


def test_a_failure_backs_the_run_off_until_its_retry_time(store: Store) -> None:
    interrupt(store, "r1", make_run(store, "r1"))
    assert store.queue.record_failure("r1", error="boom", retry_at=time.time() + 0.3) == 1
    assert store.queue.claim("w", lease_seconds=LEASE) is None
    time.sleep(0.35)
    claim = store.queue.claim("w", lease_seconds=LEASE)
    assert claim is not None and claim.attempts == 1
    sub = store.queue.get_submission("r1")
    assert sub is not None and sub.last_error == "boom"
    assert store.queue.record_failure("r1", error="again", retry_at=0) == 2


def test_a_released_submission_claim_is_claimable_again(store: Store) -> None:
    store.queue.submit("r1", task="t", team=None)
    claim = store.queue.claim("w1", lease_seconds=LEASE)
    assert claim is not None and store.queue.release_claim(claim)
    again = store.queue.claim("w2", lease_seconds=LEASE)
    assert again is not None and again.run_id == "r1" and again.fencing_token == claim.fencing_token + 1
    assert not store.queue.release_claim(claim)  # a stale claim releases nothing


def test_concurrent_claimers_never_get_the_same_item(store_url: str) -> None:
    runs, threads_n = 24, 6
    with Store(store_url) as setup:
        for i in range(runs // 2):
            interrupt(setup, f"run-{i}", make_run(setup, f"run-{i}"))
        for i in range(runs // 2, runs):
            setup.queue.submit(f"run-{i}", task=f"t{i}", team="t")
    got: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n)

    def claimer(n: int) -> None:
        try:
            with Store(store_url) as store:
                # Bounded: a claimer that failed to open its store breaks the barrier for the
                # others, and the test reports that error instead of hanging.
                barrier.wait(timeout=60)
                while True:
                    claim = store.queue.claim(f"w{n}", lease_seconds=LEASE)
                    if claim is None:
                        return
                    with lock:
                        got.append(claim.run_id)
        except BaseException as exc:
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Counter(got) == Counter(f"run-{i}" for i in range(runs))
