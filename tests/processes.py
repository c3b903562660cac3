"""Test worker scripts run as real processes (for SIGKILL and resume tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["last_json", "run_script"]


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
