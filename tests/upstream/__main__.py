"""``python -m tests.upstream [--version X] [--file tests/test_...py ...]``: the conformance step.

``python -m tests.upstream --floor``: the floor pass (``scripts/test.sh`` runs it): when the oldest
autogen-agentchat the package declares (pyproject's ``>=``) is not the installed one, the
conformance step at that version, then :data:`FLOOR_TESTS` (our resume tests, SQLite) in its
scratch venv; nothing when the floor is the installed version.

Exit status: 0 conformant, 1 regressions / stale allow-list entries / the step failed, 2 the
upstream sdist (or a scratch venv's packages) could not be fetched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from .conformance import (
    REPO,
    UPSTREAM_TEST_FILES,
    VERSION_ENV,
    UpstreamUnavailable,
    floor_version,
    installed_version,
    run_conformance,
    scratch_python,
)

#: Our tests the floor pass runs at the floor version (besides AutoGen's own): resume and crash.
FLOOR_TESTS = (
    "tests/integration/test_flow_resume.py",
    "tests/integration/test_issue_7043.py",
    "tests/integration/test_repair_resume.py",
    "tests/integration/test_always_resume.py",
)


def floor_pass() -> int:
    """Conformance and :data:`FLOOR_TESTS` at the declared floor, unless it is the installed version."""
    floor, installed = floor_version(), installed_version()
    if floor == installed:
        print(f"floor pass: the floor {floor} is the installed autogen-agentchat; the main pass covers it")
        return 0
    try:
        report = run_conformance(floor)
    except UpstreamUnavailable as exc:
        print(f"floor pass: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    cmd = [str(scratch_python(floor)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not postgres"]
    print(f"floor pass: our resume tests on autogen-agentchat {floor}", flush=True)
    tests = subprocess.run([*cmd, *FLOOR_TESTS], cwd=REPO, env=env, check=False, timeout=1800)
    return 0 if report.ok and tests.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream", description=__doc__)
    parser.add_argument(
        "--version",
        default=os.environ.get(VERSION_ENV) or None,
        help=f"autogen-agentchat version whose tests to run (default: ${VERSION_ENV}, else the installed"
        f" {installed_version()}); another version runs in a scratch venv under .cache/upstream/",
    )
    parser.add_argument(
        "--file",
        action="append",
        dest="files",
        help=f"upstream test file inside the sdist, repeatable (default: {', '.join(UPSTREAM_TEST_FILES)})",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="the floor pass: conformance and our resume tests at pyproject's autogen-agentchat floor",
    )
    args = parser.parse_args(argv)
    if args.floor:
        return floor_pass()
    t0 = time.monotonic()
    try:
        report = run_conformance(args.version, args.files or UPSTREAM_TEST_FILES)
    except UpstreamUnavailable as exc:
        print(f"upstream conformance: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    print(f"({time.monotonic() - t0:.1f} s in all)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
