"""The conformance step's verdict: regressions, allow-listed ones, stale entries, a swap that failed."""

from __future__ import annotations

from .conformance import Outcome, Report, RunResult, compare

PASS = Outcome("passed", "")
FAIL = Outcome("failed", "AssertionError: assert 3 == 1")


def _report(plain: dict[str, Outcome], durable: dict[str, Outcome], allowed: dict[str, str]) -> Report:
    plain_run = RunResult("plain", plain, [], 0, 1.0)
    durable_run = RunResult("durable", durable, [], 1, 1.0, {"durable_instances": 3, "store_files": 2})
    report = Report("0.7.5", ["tests/t.py"], "python", plain_run, durable_run)
    compare(plain_run, durable_run, allowed, report)
    return report


def test_a_test_passing_on_plain_and_failing_on_durable_is_a_regression_with_its_reason() -> None:
    report = _report({"a": PASS, "b": PASS}, {"a": PASS, "b": FAIL}, {})
    assert report.regressions == [("b", "failed: AssertionError: assert 3 == 1")]
    assert not report.ok
    assert "regressions (1):" in report.summary()
    assert report.summary().endswith("RESULT: FAIL (1 regressions not in tests/upstream/allowlist.py)")


def test_an_allow_listed_regression_passes_and_a_fixed_one_is_stale() -> None:
    allowed = {"b": "deliberate: README, behaviour that differs", "a": "was broken once"}
    report = _report({"a": PASS, "b": PASS}, {"a": PASS, "b": FAIL}, allowed)
    assert report.regressions == []
    assert [t for t, _ in report.allowed] == ["b"]
    assert report.stale == [("a", "passes with DurableGraphFlow now")]
    assert not report.ok


def test_allow_list_entries_for_unknown_or_plain_failing_tests_are_stale() -> None:
    report = _report({"a": PASS, "c": FAIL}, {"a": PASS, "c": FAIL}, {"c": "x", "gone": "y"})
    assert [t for t, _ in report.stale] == ["c", "gone"]


def test_a_test_missing_from_the_durable_run_is_a_regression() -> None:
    report = _report({"a": PASS}, {}, {})
    assert report.regressions == [("a", "not run in the durable run")]
    assert any("did not complete" in p for p in report.problems)


def test_no_durable_team_built_means_the_swap_failed() -> None:
    report = _report({"a": PASS}, {"a": PASS}, {})
    report.durable.swap_counts = {"durable_instances": 0}
    report.problems.clear()
    compare(report.plain, report.durable, {}, report)
    assert report.problems == [
        "the swap did not take effect: no DurableGraphFlow was built in the durable run"
    ]


def test_all_passing_with_an_empty_allow_list_is_ok() -> None:
    report = _report({"a": PASS, "b": PASS}, {"a": PASS, "b": PASS}, {})
    assert report.ok
    assert report.summary().endswith("RESULT: OK")


def test_durable_teams_built_without_any_test_store_means_the_store_isolation_failed() -> None:
    report = _report({"a": PASS}, {"a": PASS}, {})
    report.durable.swap_counts = {"durable_instances": 3, "store_files": 0}
    report.problems.clear()
    compare(report.plain, report.durable, {}, report)
    assert len(report.problems) == 1 and "no test store file was created" in report.problems[0]
    assert not report.ok
