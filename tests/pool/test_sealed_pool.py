"""A pool of worker PROCESSES on a sealed store: the workers given ``GRAPHFLOW_DURABLE_KEYS`` drive
every submitted run to its end through a SIGKILL of one of them, every content row stays sealed,
and a worker started without the keys leaves the sealed runs alone: it writes no plain row into
them, says which key it lacks, and fails no run."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable._storage.sealing import SEALED, is_sealed
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.store import Store

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from poolteam import EXPECTED_COMPLETIONS  # noqa: E402
from test_worker_pool import fresh_pg, reference, tracebacks, transcript  # noqa: E402, F401

pytestmark = [pytest.mark.slow, pytest.mark.crash]

KEY = os.urandom(32)
SECRET = "Jane Roe, IBAN DE89 3704"


def codec() -> AESGCMCodec:
    return AESGCMCodec({"k1": KEY}, active="k1")


class Workers:
    """``graphflow-durable worker`` processes serving ``t=poolteam:team``, with or without the key."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *, keys: bool, lease: float = 1.5) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "GFD_AGENT_DELAY": "0.05",
            "GFD_HOLD": str(self.tmp / "hold"),
        }
        env.pop("GRAPHFLOW_DURABLE_KEYS", None)
        env.pop("GRAPHFLOW_DURABLE_ACTIVE_KEY", None)
        if keys:
            env["GRAPHFLOW_DURABLE_KEYS"] = "k1=" + base64.b64encode(KEY).decode()
        args = [
            sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", self.url,
            "--team", "t=poolteam:team", "--concurrency", "2", "--lease-seconds", str(lease),
            "--poll-interval", "0.05", "--grace-seconds", "10",
        ]  # fmt: skip
        name = f"worker-{n}{'' if keys else '-keyless'}"
        with open(self.tmp / f"{name}.out", "wb") as out, open(self.tmp / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)
        self.procs.append(proc)
        return proc

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
        return codes

    def stderr(self, keyless: bool) -> str:
        pattern = "worker-*-keyless.err" if keyless else "worker-[0-9].err"
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob(pattern)))


def plain_content(url: str) -> list[str]:
    """Every content cell of the store that is not sealed (``table.column run``), and every cell of
    any table that shows a secret of the tasks."""
    found = []
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            for table, (_form, columns) in SEALED.items():
                for row in conn.execute(sa.select(meta.tables[table])).mappings():
                    found += [
                        f"{table}.{c} {row['run_id']}"
                        for c in columns
                        if row[c] is not None and not is_sealed(row[c])
                    ]
            for table in meta.sorted_tables:
                for row in conn.execute(sa.select(table)):
                    found += [
                        f"{table.name}: {cell!r:.80}"
                        for cell in row
                        if SECRET in str(cell) or " saw " in str(cell)
                    ]
    finally:
        engine.dispose()
    return found


def sealed_pool(url: str, tmp: Path, runs: int = 6) -> dict[str, object]:
    tasks = {f"run-{i:02d}": f"task {i}: refund {SECRET} 0044 0532 0130 0{i}" for i in range(runs)}
    expected = reference(tmp, tasks)
    with Store(url, codec=codec()) as store:
        for run_id, task in tasks.items():
            store.queue.submit(run_id, task=task, team="t")
    hold = tmp / "hold"
    hold.touch()  # no run ends before the kill
    workers = Workers(url, tmp)
    keyless = workers.start(keys=False)
    try:
        time.sleep(3.0)  # the keyless worker alone, with every run claimable
        with Store(url, codec=codec()) as store:
            untouched = {r.run_id: r.status for r in store.list_runs()}
            before = {s.run_id: (s.attempts, s.last_error) for s in store.queue.list_submissions()}
        assert plain_content(url) == [], "the keyless worker wrote a plain row"
        for _ in range(3):
            workers.start(keys=True)
        deadline = time.monotonic() + 60
        keyed = workers.procs[1:]
        while time.monotonic() < deadline:
            busy = holders_sealed(url)
            victims = [p for p in keyed if p.pid in busy]
            if victims:
                victims[0].send_signal(signal.SIGKILL)
                victims[0].wait()
                break
            time.sleep(0.1)
        else:
            raise AssertionError("no keyed worker took a run")
        hold.unlink()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with Store(url, codec=codec()) as store:
                if len(store.list_runs("finished")) == runs:
                    break
            time.sleep(0.3)
        alive_keyless = keyless.poll() is None
        codes = workers.stop()
    finally:
        for proc in workers.procs:
            if proc.poll() is None:
                proc.kill()
    with Store(url, codec=codec()) as store:
        statuses = {r.run_id: r.status for r in store.list_runs()}
        assert statuses == dict.fromkeys(tasks, "finished"), (statuses, workers.stderr(True)[-3000:])
        for run_id in tasks:
            done = Counter(s.node for s in store.load(run_id).steps if s.kind == "complete")
            assert done == EXPECTED_COMPLETIONS, (run_id, done)
            assert transcript(store, run_id) == expected[run_id], run_id
    assert plain_content(url) == []
    assert tracebacks(workers.stderr(False)) == []
    return {
        "keyless_log": workers.stderr(True),
        "keyless_alive": alive_keyless,
        "untouched": untouched,
        "before": before,
        "codes": codes,
    }


def holders_sealed(url: str) -> set[int]:
    with Store(url, codec=codec()) as store:
        now = time.time()
        return {
            r.lease_pid
            for r in store.list_runs("running")
            if r.lease_pid is not None and (r.lease_expires_at or 0) > now
        }


def check_keyless(found: dict[str, object]) -> None:
    log = str(found["keyless_log"])
    print(
        f"\nkeyless worker: alive {found['keyless_alive']}; queue before the keyed workers {found['before']}"
    )
    print("\n".join(log.splitlines()[:6]))
    assert "sealed" in log and "GRAPHFLOW_DURABLE_KEYS" in log, log[-3000:]  # it says what it lacks
    assert "no key for sealed work while claiming" in log and "database problem" not in log, log[-3000:]
    assert "gfd1:" not in log and SECRET not in log
    assert tracebacks(log) == [], log[-3000:]
    assert found["keyless_alive"], "the keyless worker died: " + log[-3000:]
    before = found["before"]  # it claimed nothing: no attempt counted, no error recorded
    assert isinstance(before, dict) and set(before.values()) == {(0, None)}, before
    untouched = found["untouched"]
    assert isinstance(untouched, dict) and "failed" not in untouched.values(), untouched


def test_a_sqlite_pool_with_keys_finishes_every_run_sealed_and_a_keyless_worker_leaves_them_alone(
    tmp_path: Path,
) -> None:
    found = sealed_pool(f"sqlite:///{tmp_path / 'pool.db'}", tmp_path)
    check_keyless(found)


@pytest.mark.postgres
def test_a_postgres_pool_with_keys_finishes_every_run_sealed_and_a_keyless_worker_leaves_them_alone(
    fresh_pg: str,  # noqa: F811 -- the fixture imported from test_worker_pool
    tmp_path: Path,
) -> None:
    found = sealed_pool(fresh_pg, tmp_path)
    check_keyless(found)


@pytest.fixture(autouse=True)
def _no_keys_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    yield
