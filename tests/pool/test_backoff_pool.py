"""A retry's back-off in a pool of real worker processes: the worker whose run backs off releases
it (it does not hold the run, and stops at once when asked), and a second worker claims it once due
and finishes it, with the transcript of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphflow_durable.store import Store

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from agents import Scripted, chain, close_stores, durable, stored_transcript  # noqa: E402

pytestmark = [pytest.mark.slow]

BACKOFF = 3.0


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def start_worker(url: str, tmp: Path, n: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "GFD_EXEC_LOG": str(tmp / "exec.log"),
        "GFD_BACKOFF": str(BACKOFF),
    }
    args = [
        sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", url,
        "--team", "t=backoffteam:team", "--lease-seconds", "30", "--poll-interval", "0.05",
        "--grace-seconds", "60",
    ]  # fmt: skip
    with open(tmp / f"worker-{n}.err", "wb") as err:
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env)


def wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


async def test_a_worker_releases_a_run_for_its_back_off_and_a_second_worker_finishes_it(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url) as store:
        store.queue.submit("job", task="go", team="t")
        first = start_worker(store_url, tmp_path, 0)
        second = None
        try:

            def released() -> bool:
                run = store.get_run("job")
                kinds = [s.kind for s in store.load("job").steps] if run is not None else []
                return run is not None and "attempt_failed" in kinds and run.lease_owner is None

            wait(released)
            (failed,) = [s for s in store.load("job").steps if s.kind == "attempt_failed"]
            retry_at = failed.data["retry_at"]
            run = store.get_run("job")
            assert run is not None and run.status == "interrupted" and time.time() < retry_at
            queued = store.queue.get_submission("job")
            assert queued is not None and queued.not_before == retry_at and queued.attempts == 0
            # The first worker holds nothing: asked to stop, it drains no run and exits at once.
            first.send_signal(signal.SIGTERM)
            assert first.wait(timeout=20) == 0
            assert time.time() < retry_at  # it did not wait for the back-off
            second = start_worker(store_url, tmp_path, 1)
            wait(lambda: store.get_run("job").status == "finished")  # type: ignore[union-attr]
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=30)
        log = store.load("job")
        redispatch = next(
            s for s in log.steps if s.kind == "resume" and "B" in s.data.get("redispatched", [])
        )
        assert redispatch.created_at >= retry_at
    turns = [line.split() for line in (tmp_path / "exec.log").read_text().splitlines()]
    assert [attempt for _, attempt in turns] == ["1", "2"]
    assert turns[0][0] == str(first.pid) and turns[1][0] == str(second.pid)  # type: ignore[union-attr]
    agents = [Scripted(n) for n in "ABC"]
    await durable(agents, chain(*agents), store_url, "reference").run(task="go")
    done = durable([Scripted(n) for n in "ABC"], chain(*agents), store_url, "job")
    assert stored_transcript(done) == stored_transcript(
        durable(agents, chain(*agents), store_url, "reference")
    )
    close_stores()
