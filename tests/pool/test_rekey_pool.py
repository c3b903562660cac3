"""Key rotation while a worker PROCESS drives runs: ``runs rekey --to k2`` re-seals the rows of runs
being committed to, and every run still finishes with its thread whole, every row under the new
key. And ``runs rekey`` SIGKILLed half-way leaves every row openable (old key or new), and a rerun
finishes the job."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from poolteam import EXPECTED_COMPLETIONS, team  # noqa: E402

from processes import Processes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.crash]

K1, K2 = os.urandom(32), os.urandom(32)
KEYS = ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in (("k1", K1), ("k2", K2)))


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
        "GRAPHFLOW_DURABLE_KEYS": KEYS,
        "GFD_EXEC_LOG": str(tmp / "exec.log"),
        **extra,
    }


def _cli(url: str, tmp: Path, *args: str, **extra: str) -> list[str]:
    return [sys.executable, "-m", "graphflow_durable.cli.runs", *args, "--store", url]


def completions(store: Store, run_id: str) -> Counter[str]:
    return Counter(s.node for s in store.load(run_id).steps if s.kind == "complete" and s.node)


def only_k2(url: str, runs: list[str]) -> None:
    """Every row opens under k2 alone; every run is whole (its log read as a resume reads it)."""
    with Store(url, codec=AESGCMCodec({"k2": K2})) as store:
        audit = store.audit_sealing(open_values=True)
        assert audit.unopened == [] and audit.plain == {}
        assert set(audit.keys) == {"k2"}
        assert store.verify().damaged == ()
        for run_id in runs:
            log = store.load(run_id)
            assert [m.seq for m in log.messages] == list(range(len(log.messages)))


def test_a_rekey_during_runs_a_worker_drives_loses_and_reorders_nothing(
    store_url: str, tmp_path: Path
) -> None:
    runs = [f"live{i}" for i in range(4)]
    with Store(store_url, codec=AESGCMCodec({"k1": K1})) as store:  # the old key seals the tasks
        for run_id in runs:
            store.queue.submit(run_id, task=f"the secret task of {run_id}", team="t")
    # The workers were rolled to k2 (still holding k1): new rows are sealed with k2 while the rekey
    # moves the old ones, the runs' rows included, as their commits land.
    env = _env(tmp_path, GRAPHFLOW_DURABLE_ACTIVE_KEY="k2", GFD_AGENT_DELAY="0.03")
    args = [
        "worker",
        "--team",
        "t=poolteam:team",
        "--concurrency",
        "4",
        "--poll-interval",
        "0.02",
        "--until-idle",
    ]
    with Processes() as procs:
        with open(tmp_path / "worker.out", "wb") as out, open(tmp_path / "worker.err", "wb") as err:
            worker = procs.add(
                subprocess.Popen(_cli(store_url, tmp_path, *args), env=env, stdout=out, stderr=err)
            )
        with Store(store_url, codec=AESGCMCodec({"k1": K1, "k2": K2}, active="k2")) as store:
            deadline = time.monotonic() + 60
            while not all((r := store.get_run(run_id)) is not None and r.head_seq >= 3 for run_id in runs):
                assert worker.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            resealed, sweeps = 0, 0
            while worker.poll() is None:  # rekey again and again while the runs commit
                done = store.rekey(to="k2", batch=5)
                resealed, sweeps = resealed + done.total, sweeps + 1
            assert worker.wait(60) == 0, (tmp_path / "worker.err").read_text()
            store.rekey(to="k2")  # the rows of the last commits, if the worker was the faster
            for run_id in runs:
                run = store.get_run(run_id)
                assert run is not None and run.status == "finished"
                assert completions(store, run_id) == EXPECTED_COMPLETIONS
            assert resealed > 0 and sweeps > 1
    only_k2(store_url, runs)


def test_a_rekey_killed_half_way_leaves_every_row_openable_and_a_rerun_finishes(
    store_url: str, tmp_path: Path
) -> None:
    os.environ["GFD_AGENT_DELAY"] = "0"
    runs = [f"r{i}" for i in range(6)]
    with Store(store_url, codec=AESGCMCodec({"k1": K1})) as store:
        for run_id in runs:
            store.queue.submit(run_id, task=f"the secret task of {run_id}", team="t")
        asyncio.run(Worker(store, {"t": team}, poll_interval=0.01, concurrency=3).run_until_idle())
        total = store.audit_sealing().sealed_total
        before = {run_id: [m.body for m in store.transcript(run_id)] for run_id in runs}
    env = _env(tmp_path, GRAPHFLOW_DURABLE_ACTIVE_KEY="k1")
    with Processes() as procs, Store(store_url, codec=AESGCMCodec({"k1": K1, "k2": K2})) as store:
        rekey = procs.add(
            subprocess.Popen(
                _cli(store_url, tmp_path, "runs", "rekey", "--to", "k2", "--batch", "3"),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 60
        while store.audit_sealing().keys.get("k2", 0) < total // 3:
            assert rekey.poll() is None and time.monotonic() < deadline, (
                "the rekey ended before it was killed"
            )
            time.sleep(0.005)
        rekey.send_signal(signal.SIGKILL)
        assert rekey.wait() == -signal.SIGKILL
        audit = store.audit_sealing(open_values=True)  # every row opens: under k1 or k2
        assert audit.unopened == [] and audit.plain == {} and audit.opened == total
        assert 0 < audit.keys["k2"] < total and audit.keys["k1"] > 0
        assert store.verify().damaged == ()
    rerun = subprocess.run(
        _cli(store_url, tmp_path, "runs", "rekey", "--to", "k2", "--json"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["left"] == 0
    only_k2(store_url, runs)
    with Store(store_url, codec=AESGCMCodec({"k2": K2})) as store:
        assert {run_id: [m.body for m in store.transcript(run_id)] for run_id in runs} == before
