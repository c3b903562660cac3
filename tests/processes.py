"""Test worker scripts run as real processes (for SIGKILL and resume tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["Processes", "last_json", "reap", "run_script"]


def run_script(
    script: Path, *args: str, exec_log: Path, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with this interpreter and ``args``; its agent turns are logged to ``exec_log``
    ($GFD_EXEC_LOG); ``env`` adds environment variables. Never raises on the exit code."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "GFD_EXEC_LOG": str(exec_log), **env},
        timeout=timeout,
        check=False,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON object a script that exited 0 printed last."""
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[-1]))


class Processes:
    """The subprocesses a test starts (``add``), owned so that none outlives it: on leaving the
    ``with`` block, by any path (a failed assertion, a timeout), each one still running is killed
    (SIGKILL) and every one is waited for, so no Popen leaks into a later test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def stop(self, timeout: float) -> list[int | None]:
        """SIGTERM every one still running and wait for them all, ``timeout`` seconds in all; return
        their exit codes in the order added (``None``: still running then; :meth:`kill` ends it)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.0)))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill(self) -> None:
        """SIGKILL every one still running and wait for all of them (reaped: no zombie, no warning)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()


def reap(started: list[subprocess.Popen[str]]) -> None:
    """End every process in ``started`` and close its pipes (after a test, a failed one too)."""
    while started:
        proc = started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
