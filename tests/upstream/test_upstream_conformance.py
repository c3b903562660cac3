"""AutoGen's own GraphFlow tests pass with DurableGraphFlow swapped in (see conformance.py)."""

from __future__ import annotations

import os

import pytest

from .conformance import VERSION_ENV, UpstreamUnavailable, run_conformance


@pytest.mark.upstream
@pytest.mark.slow
def test_upstream_graphflow_tests_that_pass_on_graphflow_pass_on_durable_graphflow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        report = run_conformance(os.environ.get(VERSION_ENV) or None)
    except UpstreamUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc}\n(CI=true: the upstream conformance step must run on CI)", pytrace=False)
        pytest.skip(f"upstream tests unavailable (no network or package index?): {exc}")
    summary = report.summary()
    if not report.ok:
        pytest.fail(f"{summary.splitlines()[-1]}\n{summary}", pytrace=False)
    with capsys.disabled():  # the counts belong in the test command's output on success too
        print(f"\n{summary}")
