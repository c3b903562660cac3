"""Early takeover ("the holder's process is gone") needs proof: same host, same boot, same PID
namespace, and the pid gone or reused; anything less waits for the lease to expire."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import RunLockedError
from graphflow_durable.store import Store

from .test_store_leases import dead_pid


def _record_identity(url: str, run_id: str, **changes: object) -> None:
    """Overwrite the run's recorded holder identity with ``changes`` (a fake process identity)."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_bytes().rpartition(b")")[2].split()
    identity = {
        "boot": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pidns": str(Path("/proc/self/ns/pid").readlink()),
        "start": int(stat[19]),
    }
    identity.update(changes)
    _set_identity(url, run_id, json.dumps(identity))


def _set_identity(url: str, run_id: str, text: str | None) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE graphflow_runs SET lease_process = :p WHERE run_id = :r"),
                {"p": text, "r": run_id},
            )
    finally:
        engine.dispose()


def _held_by_dead_pid(store: Store) -> int:
    pid = dead_pid()
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="holder", lease_seconds=3600, pid=pid)
    )
    return pid


def test_a_dead_pid_in_another_pid_namespace_with_the_same_host_name_keeps_its_lease(
    store: Store, store_url: str
) -> None:
    _held_by_dead_pid(store)
    _record_identity(store_url, "run-1", pidns="pid:[1]")
    with pytest.raises(RunLockedError, match="holder"):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=60)
    assert store.queue.claim("worker-2", lease_seconds=60) is None


def test_a_dead_pid_of_another_boot_keeps_its_lease(store: Store, store_url: str) -> None:
    _held_by_dead_pid(store)
    _record_identity(store_url, "run-1", boot="00000000-0000-0000-0000-000000000000")
    with pytest.raises(RunLockedError):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=60)
    assert store.queue.claim("worker-2", lease_seconds=60) is None


def test_a_lease_without_a_recorded_identity_waits_for_expiry(store: Store, store_url: str) -> None:
    _held_by_dead_pid(store)
    _set_identity(store_url, "run-1", None)
    with pytest.raises(RunLockedError):
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=60)


def test_a_dead_pid_of_this_boot_and_pid_namespace_is_taken_over_at_once(store: Store) -> None:
    _held_by_dead_pid(store)
    assert store._driver.acquire_lease("run-1", "worker-2", lease_seconds=60) == 2


def test_a_dead_pid_of_this_boot_and_pid_namespace_is_claimed_at_once(store: Store) -> None:
    _held_by_dead_pid(store)
    claim = store.queue.claim("worker-2", lease_seconds=60)
    assert claim is not None and claim.run_id == "run-1" and claim.reason.startswith("holder process")


def test_a_live_pid_reused_by_another_process_counts_as_dead(store: Store, store_url: str) -> None:
    """The recorded holder started at another time than the process now using its pid."""
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="holder", lease_seconds=3600)
    )
    _record_identity(store_url, "run-1", start=1)  # this pid, but a process started at another time
    assert store._driver.acquire_lease("run-1", "worker-2", lease_seconds=60) == 2


_IN_NAMESPACE = textwrap.dedent(
    """
    import sys
    from graphflow_durable.errors import RunLockedError
    from graphflow_durable.store import Store

    with Store(sys.argv[1]) as store:
        try:
            store._driver.acquire_lease("run-1", "intruder", lease_seconds=60)
        except RunLockedError:
            print("locked")
        else:
            print("taken")
        print("claimed" if store.queue.claim("intruder", lease_seconds=60) else "nothing")
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_worker_in_a_second_pid_namespace_does_not_take_a_live_lease_early(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A real second PID namespace on the same host name: this live process's pid does not exist
    there (or is another process), yet the lease holds."""
    with Store(sqlite_url) as store:
        store._driver.create_run(
            CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="holder", lease_seconds=3600)
        )
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid does not work here: {probe.stderr.decode(errors='replace').strip()}")
    script = tmp_path / "intruder.py"
    script.write_text(_IN_NAMESPACE)
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["locked", "nothing"]
    with Store(sqlite_url) as store:
        run = store.get_run("run-1")
        assert run is not None and (run.lease_owner, run.lease_host) == ("holder", socket.gethostname())
