"""``python -m tests.upstream [--version X] [--file tests/test_...py ...]``: the conformance step.

Exit status: 0 conformant, 1 regressions / stale allow-list entries / the step failed, 2 the
upstream sdist (or a scratch venv's packages) could not be fetched.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .conformance import (
    UPSTREAM_TEST_FILES,
    VERSION_ENV,
    UpstreamUnavailable,
    installed_version,
    run_conformance,
)


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
    args = parser.parse_args(argv)
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
