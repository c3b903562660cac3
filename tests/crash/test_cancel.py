"""Cancel from another process: the driving process (a real subprocess) stops within its lease
period, the run is ``cancelled``, the pool leaves it alone, and a later ``run()`` in a new process
resumes it to the uninterrupted transcript."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable import Store
from graphflow_durable.cli.runs import main
from processes import reap

WORKER = Path(__file__).with_name("cancel_worker.py")
LEASE = 2.0  # seconds: the driver renews (and so learns of a cancel) every LEASE / 3
TURN = 0.25  # seconds each agent turn takes

pytestmark = [pytest.mark.crash]


#: The processes the tests started (ended and reaped after each test).
STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """Every process a test started is ended and its pipes closed, also when the test failed."""
    yield
    reap(STARTED)


def start(
    url: str, run_id: str, times: Path, lease: float = LEASE, turn: float = TURN
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), url, run_id, str(lease), str(turn)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GFD_TURN_TIMES": str(times)},
    )
    STARTED.append(proc)
    return proc


def outcome(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return dict(json.loads(out.splitlines()[-1]))


def turn_starts(times: Path) -> list[float]:
    return [float(line.split()[0]) for line in times.read_text().splitlines()] if times.exists() else []


def test_cancel_from_another_process_stops_the_driver_within_its_lease_and_run_resumes_it_to_the_uninterrupted_transcript(
    store_url: str, tmp_path: Path
) -> None:
    reference = outcome(start(store_url, "ref", tmp_path / "ref.times"))
    assert reference["status"] == "finished"

    times = tmp_path / "run.times"
    driver = start(store_url, "run", times)
    deadline = time.monotonic() + 60
    while len(turn_starts(times)) < 3:  # the run is under way in the other process
        assert time.monotonic() < deadline and driver.poll() is None, "the driver never got going"
        time.sleep(0.02)
    with Store(store_url) as store:
        asked_at = time.time()
        asked = store.cancel_run("run")
        assert (asked.outcome, asked.status) == ("requested", "running")
        while (run := store.get_run("run")) is not None and run.status != "cancelled":
            assert time.time() < asked_at + 30, f"still {run.status}"
            time.sleep(0.02)
        cancelled_after = time.time() - asked_at
    stopped = outcome(driver)

    assert stopped["status"] == "cancelled"
    # Within the lease period: no agent turn began later than one lease after the request, and the
    # run was recorded cancelled within it (plus the turn that was running when the driver saw it).
    assert max(turn_starts(times)) < asked_at + LEASE
    assert cancelled_after < LEASE + TURN, f"cancelled {cancelled_after:.2f} s after the request"
    done = len(stopped["transcript"])
    print(
        f"cancelled {cancelled_after:.2f} s after the request, at message {done} of {len(reference['transcript'])}"
    )
    assert 0 < done < len(reference["transcript"])
    assert stopped["transcript"] == reference["transcript"][:done]

    with Store(store_url) as store:
        assert store.queue.claim("pool-1", lease_seconds=LEASE) is None  # the pool leaves it alone
        run = store.get_run("run")
        assert run is not None and run.cancel_requested_at is None and run.lease_owner is None

    resumed = outcome(start(store_url, "run", tmp_path / "resume.times"))
    assert resumed["status"] == "finished"
    assert resumed["transcript"] == reference["transcript"]
    assert resumed["result"] == reference["result"]


LONG_LEASE = 30.0  # seconds: renewed every 10 s, longer than the whole run takes


def test_a_cancel_from_another_process_stops_the_driver_before_its_next_dispatch_not_at_its_next_renewal(
    store_url: str, tmp_path: Path
) -> None:
    times = tmp_path / "run.times"
    driver = start(store_url, "run", times, lease=LONG_LEASE)
    deadline = time.monotonic() + 60
    while len(turn_starts(times)) < 2:
        assert time.monotonic() < deadline and driver.poll() is None, "the driver never got going"
        time.sleep(0.02)
    with Store(store_url) as store:
        asked_at = time.time()
        asked = store.cancel_run("run")
        assert (asked.outcome, asked.status) == ("requested", "running")
    stopped = outcome(driver)
    assert stopped["status"] == "cancelled"
    # The turn running when the cancel came answers; its commit reads the request, and nothing is
    # dispatched after it (no turn starts later than that turn's end), long before a renewal.
    started = turn_starts(times)
    assert max(started) < asked_at + TURN, [round(t - asked_at, 2) for t in started]
    with Store(store_url) as store:
        run = store.get_run("run")
        assert run is not None and (run.status, run.cancel_requested_at) == ("cancelled", None)


def test_a_cancel_from_another_process_after_the_last_dispatch_is_reported_not_wiped(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "ref.times"
    outcome(start(store_url, "ref", reference, turn=0.0))
    turns = len(turn_starts(reference))

    times = tmp_path / "run.times"
    driver = start(store_url, "run", times, lease=LONG_LEASE, turn=1.0)
    deadline = time.monotonic() + 60
    while len(turn_starts(times)) < turns:  # the last turn is dispatched and running
        assert time.monotonic() < deadline and driver.poll() is None, "the driver never got there"
        time.sleep(0.02)
    capsys.readouterr()
    assert main(["runs", "cancel", "run", "--store", store_url]) == 0  # as an operator would
    assert "unless its last turn is already dispatched" in capsys.readouterr().out
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["status"] == "finished"
    assert "finished before the cancel requested at" in err  # the driver's warning

    assert main(["runs", "show", "run", "--store", store_url]) == 0
    assert "finished before the cancel took effect" in capsys.readouterr().out
    assert main(["runs", "cancel", "run", "--store", store_url]) != 0  # nothing left to cancel ...
    assert "before the cancel requested at" in capsys.readouterr().err  # ... and it says why
    with Store(store_url) as store:
        run = store.get_run("run")
        assert run is not None and run.status == "finished" and run.ended_before_cancel
