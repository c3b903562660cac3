"""Leases and fencing tokens: one driver per run, takeover after expiry or a dead process."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.errors import LeaseLostError, RunLockedError, RunNotFoundError
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunUpdate, Step, Store

from .test_store import LEASE, commit_text, counts, start


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_owner_gets_run_locked_naming_the_holder_and_its_expiry(store: Store) -> None:
    start(store, owner="worker-1")
    with pytest.raises(
        RunLockedError, match=r"run run-1 is being driven by worker-1 \(pid \d+ on .+\) until 20"
    ):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)
    run = store.get_run("run-1")
    assert run is not None and (run.lease_owner, run.fencing_token) == ("worker-1", 1)


def test_an_expired_lease_is_taken_with_the_next_token(store: Store) -> None:
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=0.01)
    )
    time.sleep(0.05)
    assert store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE, host="h2", pid=4242) == 2
    run = store.get_run("run-1")
    assert run is not None
    assert (run.lease_owner, run.lease_host, run.lease_pid, run.fencing_token) == ("worker-2", "h2", 4242, 2)
    assert run.lease_expires_at is not None and run.lease_expires_at > time.time() + LEASE - 5


def test_a_takeover_is_logged_once_at_info_by_the_store_logger(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=0.01)
    )
    time.sleep(0.05)
    with caplog.at_level(logging.INFO, logger="graphflow_durable.store"):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)
        store._driver.acquire_lease(
            "run-1", "worker-2", lease_seconds=LEASE
        )  # the same owner: not a takeover
    took = [r for r in caplog.records if "took the lease" in r.getMessage()]
    assert [(r.name, r.levelno) for r in took] == [("graphflow_durable.store", logging.INFO)]
    assert "run-1: worker-2 took the lease from worker-1" in took[0].getMessage()


def test_the_lease_of_a_dead_process_on_this_host_is_taken_at_once(store: Store) -> None:
    pid = dead_pid()
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="crashed", lease_seconds=3600, pid=pid)
    )
    assert store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE) == 2


def test_the_lease_of_a_dead_pid_on_another_host_is_kept_until_it_expires(store: Store) -> None:
    pid = dead_pid()
    other = socket.gethostname() + "-elsewhere"
    store._driver.create_run(
        CreateRequest(
            "run-1", graph_fingerprint="f", graph={}, owner="remote", lease_seconds=3600, host=other, pid=pid
        )
    )
    with pytest.raises(RunLockedError, match="remote"):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)


def test_the_lease_of_a_live_process_on_this_host_is_kept(store: Store) -> None:
    start(store, owner="worker-1")  # pid = this (live) process
    with pytest.raises(RunLockedError):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)


def test_a_commit_with_a_stale_token_raises_lease_lost_and_writes_nothing(
    store: Store, store_url: str
) -> None:
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=0.01)
    )
    commit_text(store, "run-1", 0, 1, 0)
    time.sleep(0.05)
    new_token = store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)
    raw = sa.create_engine(store_url)
    try:
        before = counts(raw)
        with pytest.raises(LeaseLostError, match=r"token is 1 but the run's token is 2, held by 'worker-2'"):
            store._driver.commit(
                CommitRequest(
                    "run-1",
                    expected_head=1,
                    fencing_token=1,
                    step=Step("complete", "a", {}),
                    messages=[MessageRecord(1, {}, True)],
                    agent_states=[AgentStateRecord("a", {})],
                    update=RunUpdate(status="finished"),
                )
            )
        assert counts(raw) == before
    finally:
        raw.dispose()
    run = store.get_run("run-1")
    assert run is not None and (run.head_seq, run.status) == (1, "running")
    assert commit_text(store, "run-1", 1, new_token, 1) == 2


def test_reacquiring_by_the_same_owner_gives_a_new_token_and_fences_the_old_one(store: Store) -> None:
    old = start(store, owner="worker-1")
    new = store._driver.acquire_lease("run-1", "worker-1", lease_seconds=LEASE)
    assert new == old + 1
    with pytest.raises(LeaseLostError):
        commit_text(store, "run-1", 0, old, 0)
    assert commit_text(store, "run-1", 0, new, 0) == 1


def test_renew_extends_the_lease_and_a_stale_token_cannot_renew(store: Store) -> None:
    token = start(store, owner="worker-1")
    expires = store._driver.renew_lease("run-1", "worker-1", token, lease_seconds=3600)
    run = store.get_run("run-1")
    assert run is not None and run.lease_expires_at == pytest.approx(expires) and expires > time.time() + 3000
    with pytest.raises(
        LeaseLostError, match="token 1 is current but the lease is held by 'worker-1', not 'impostor'"
    ):
        store._driver.renew_lease("run-1", "impostor", token, lease_seconds=LEASE)
    with pytest.raises(LeaseLostError, match="token is 7 but the run's token is 1"):
        store._driver.renew_lease("run-1", "worker-1", 7, lease_seconds=LEASE)
    with pytest.raises(RunNotFoundError):
        store._driver.renew_lease("nope", "worker-1", token, lease_seconds=LEASE)


def test_an_expired_lease_nobody_took_is_renewed_unless_the_run_was_submitted_to_a_queue(
    store: Store,
) -> None:
    """A driver back from a stall longer than its lease keeps a run nobody took; a submitted run's
    expired lease is lost, since its queue and partition counted the run free meanwhile."""
    for run_id in ("plain", "queued"):
        if run_id == "queued":
            store.queue.submit(run_id, task="t", team=None, partition="acme")
        store._driver.create_run(
            CreateRequest(run_id, graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=0.05)
        )
    time.sleep(0.2)
    tokens = {run_id: store.get_run(run_id).fencing_token for run_id in ("plain", "queued")}  # type: ignore[union-attr]
    assert (
        store._driver.renew_lease("plain", "worker-1", tokens["plain"], lease_seconds=LEASE) > time.time() + 5
    )
    with pytest.raises(LeaseLostError, match=r"the lease expired at .* before it was renewed"):
        store._driver.renew_lease("queued", "worker-1", tokens["queued"], lease_seconds=LEASE)


def test_release_frees_the_run_and_is_silent_when_the_lease_was_taken(store: Store) -> None:
    token = start(store, owner="worker-1")
    assert store._driver.release_lease("run-1", token) is True
    run = store.get_run("run-1")
    assert run is not None and (run.lease_owner, run.lease_expires_at, run.fencing_token) == (None, None, 1)
    assert store._driver.release_lease("run-1", token) is False
    taken = store._driver.acquire_lease("run-1", "worker-2", lease_seconds=LEASE)
    assert taken == 2
    assert store._driver.release_lease("run-1", token) is False  # stale: worker-2 keeps it
    run = store.get_run("run-1")
    assert run is not None and run.lease_owner == "worker-2"
    assert store._driver.release_lease("nope", 1) is False


def test_a_dead_but_unreaped_process_on_this_host_counts_as_dead() -> None:
    import subprocess
    import sys
    import time

    from graphflow_durable._storage.lease import pid_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while pid_alive(child.pid) and time.monotonic() < deadline:  # exited, not yet waited for
            time.sleep(0.02)
        assert not pid_alive(child.pid)
        assert child.poll() is not None  # it was a zombie until now: reaping it only now
    finally:
        child.wait()
