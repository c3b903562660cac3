"""Rate limits shared by real processes: turns taken by several processes at once are never closer
than the limit's interval; a provider's 429 in one process pauses the others; and a pool of 4
worker processes driving 200 runs whose agent calls a scripted model keeps every window's calls
within the limit while using at least 90 % of it.

The proof at the issue's 120 requests a minute would take minutes: the pool test runs at 600 a
minute (calls are spaced, never bunched, so the property scales): in any 60 s at most 600 calls,
in any 10 s at most 100, and throughput at least 90 % of 10 a second."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphflow_durable.store import Store
from processes import reap

HERE = Path(__file__).parent
CALLER = HERE / "ratelimit_caller.py"

pytestmark = [pytest.mark.slow]


#: The processes the tests started (ended and reaped after each test).
STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    """Every process a test started is ended and its pipes closed, also when the test failed."""
    yield
    reap(STARTED)


def start_caller(url: str, *args: str, **env: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(CALLER), url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    STARTED.append(proc)
    return proc


def output(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return dict(json.loads(out.splitlines()[-1]))


def test_processes_taking_turns_of_one_key_at_once_never_get_turns_closer_than_the_interval(
    store_url: str,
) -> None:
    Store(store_url).close()  # created before the processes race to create it
    spacing = 0.005
    procs = [start_caller(store_url, "reserve", "60", str(spacing)) for _ in range(4)]
    starts = sorted(s for p in procs for s in output(p)["starts"])  # type: ignore[attr-defined]
    assert len(starts) == 240
    assert min(b - a for a, b in itertools.pairwise(starts)) >= spacing - 1e-6


def test_a_429_with_retry_after_in_one_process_pauses_another_processs_calls(store_url: str) -> None:
    with Store(store_url) as store:
        first = start_caller(store_url, "call", "1", GFD_FIRST_429="1")
        deadline = time.monotonic() + 60
        while store.limits.paused_until("paused") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        until = store.limits.paused_until("paused")
        assert until > time.time(), "the 429 paused the key for 2 s"
        other = start_caller(store_url, "call", "3")
        a, b = output(first), output(other)
    failed_at = float(a["failed_at"])  # type: ignore[arg-type]
    assert until == pytest.approx(failed_at + 2, abs=0.5)
    times = [*a["times"], *b["times"]]  # type: ignore[misc]
    assert len(times) == 4
    assert all(t >= until - 0.01 for t in times), "no call of any process started during the pause"


def test_four_workers_200_runs_never_exceed_the_limit_in_any_window_and_use_90_percent(
    store_url: str, tmp_path: Path
) -> None:
    rpm, runs = 600, 200
    log = tmp_path / "calls.log"
    with Store(store_url) as store:
        for i in range(runs):
            store.queue.submit(f"case-{i:03d}", task=f"support case {i}", team="t")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "GFD_EXEC_LOG": str(log),
        "GFD_RATE_RPM": str(rpm),
        "GFD_429_RUN": "case-100",
    }
    args = [
        sys.executable, "-m", "graphflow_durable.cli.runs", "worker", "--store", store_url,
        "--team", "t=ratelimitteam:team", "--concurrency", "10", "--lease-seconds", "10",
        "--poll-interval", "0.05", "--until-idle",
    ]  # fmt: skip
    workers = []
    for n in range(4):
        with open(tmp_path / f"w{n}.err", "wb") as err:
            workers.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env))
    for w in workers:
        assert w.wait(timeout=300) == 0, (tmp_path / "w0.err").read_text()
    with Store(store_url) as store:
        statuses = {store.get_run(f"case-{i:03d}").status for i in range(runs)}  # type: ignore[union-attr]
    assert statuses == {"finished"}
    lines = [line.split() for line in log.read_text().splitlines()]
    calls = sorted(float(t) for kind, _, t in lines if kind == "call")
    pids = {pid for kind, pid, _ in lines if kind == "call"}
    (paused_at,) = [float(t) for kind, _, t in lines if kind == "429"]
    assert len(calls) == runs and len(pids) >= 2
    # Never over the limit: any 60 s window at most rpm calls; any 10 s window at most rpm / 6.
    for window, most in ((60.0, rpm), (10.0, rpm // 6)):
        worst = max(sum(1 for t in calls[i:] if t < start + window) for i, start in enumerate(calls))
        assert worst <= most, f"{worst} calls in {window:g} s"
    # The 429 paused every process: no call in the 2 s after it (a call already taking its turn
    # as the pause was written may start within a few hundred ms).
    assert [t for t in calls if paused_at + 0.3 < t < paused_at + 2.0] == []
    assert any(t >= paused_at + 2.0 for t in calls)
    # Throughput: the calls' span, the pause left out, at 90 % of the limit or better.
    span = calls[-1] - calls[0] - 2.0
    rate = (len(calls) - 1) / span * 60
    print(f"throughput {rate:.1f} calls a minute against a limit of {rpm}; span {span:.1f} s")
    assert rate >= 0.9 * rpm
    assert rate <= rpm
