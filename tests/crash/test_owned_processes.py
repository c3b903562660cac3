"""tests/processes.py's :class:`Processes`: a test's subprocesses never outlive it, whatever ends it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import Processes

pytestmark = [pytest.mark.crash]

# Ignores SIGTERM (as a worker draining its runs may, for its grace period), then creates its file.
STUBBORN = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"
)


def start(up: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, str(up)])
    deadline = time.monotonic() + 30
    while not up.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def test_processes_that_ignore_sigterm_are_killed_and_reaped_when_the_test_fails_midway(
    tmp_path: Path,
) -> None:
    with pytest.raises(AssertionError, match="the test failed"), Processes() as owned:
        procs = [owned.add(start(tmp_path / f"up-{n}")) for n in range(2)]
        assert owned.stop(timeout=0.5) == [None, None]  # SIGTERM ignored: still running
        raise AssertionError("the test failed")
    assert [proc.returncode for proc in procs] == [-9, -9]  # SIGKILLed and waited: nothing leaks


def test_stop_reports_the_exit_codes_of_processes_that_ended() -> None:
    with Processes() as owned:
        done = owned.add(subprocess.Popen([sys.executable, "-c", "pass"]))
        done.wait()
        sleeper = owned.add(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        assert owned.stop(timeout=30) == [0, -15]
    assert sleeper.returncode == -15
