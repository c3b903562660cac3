"""The pytest plugin (entry point ``pytest11``): a user's graph proved crash-safe in their own tests.

Installed with the package, it does nothing unless used:

- the fixture ``durable_crash_matrix``: an async callable with the arguments of
  :func:`graphflow_durable.testing.crash_matrix`; it runs the matrix and asserts its report, so a
  divergence fails the test (an ``AssertionError`` naming the crash point, the node and the
  difference);
- the marker ``graphflow_crash_matrix``: put on every test that uses the fixture (``-m "not
  graphflow_crash_matrix"`` leaves them out); given ``sample=N`` (or ``points=``, ``mode=``) it sets
  that argument for the test's matrices when the call does not;
- ``--gfd-crash-sample=N``: every matrix of the run tries N crash points (evenly spaced, first and
  last included) instead of all of them, for CI time (``$GRAPHFLOW_DURABLE_CRASH_SAMPLE``);
- ``--gfd-always-resume``: every ``DurableGraphFlow`` run of the test session is torn down after
  each answer's commit and resumed from the store (``$GRAPHFLOW_DURABLE_ALWAYS_RESUME=1``), so a
  whole existing suite shows any state that is not durable as a failing test.

The switches are environment variables so that they reach the subprocesses a test starts. The
module imports nothing of AutoGen: ``graphflow_durable.testing`` is imported when the fixture is
called.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pytest

if TYPE_CHECKING:
    from autogen_agentchat.messages import BaseChatMessage

    from graphflow_durable.flow import DurableGraphFlow
    from graphflow_durable.store import Store

__all__ = ["ALWAYS_RESUME_ENV", "CRASH_SAMPLE_ENV", "MARKER", "durable_crash_matrix"]

#: What ``--gfd-crash-sample=N`` sets: the sample of every matrix that is given none.
CRASH_SAMPLE_ENV = "GRAPHFLOW_DURABLE_CRASH_SAMPLE"
#: What ``--gfd-always-resume`` sets to ``1`` (read by the runtime at each run; a literal here, so
#: that the plugin imports nothing of the runtime at pytest's start).
ALWAYS_RESUME_ENV = "GRAPHFLOW_DURABLE_ALWAYS_RESUME"
#: The marker of the tests that run crash matrices.
MARKER = "graphflow_crash_matrix"
#: The marker's arguments, each an argument of crash_matrix the test's calls do not give.
_MARKER_OPTIONS = ("sample", "points", "mode")

_saved_env = pytest.StashKey[dict[str, str | None]]()


class CrashReport(Protocol):
    """What the fixture needs of :class:`graphflow_durable.testing.CrashReport`."""

    points: int

    def assert_ok(self) -> None: ...


CrashMatrix = Callable[..., Awaitable[CrashReport]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphflow-durable", "graphflow-durable crash testing")
    group.addoption(
        "--gfd-crash-sample",
        type=int,
        default=None,
        metavar="N",
        help="each crash matrix tries N of its crash points (evenly spaced, first and last included)",
    )
    group.addoption(
        "--gfd-always-resume",
        action="store_true",
        default=False,
        help="tear every DurableGraphFlow run down after each commit and resume it from the store",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(sample=None, points=None, mode=None): the test runs crash matrices "
        "(durable_crash_matrix); the arguments are defaults for its matrices",
    )
    sample = config.getoption("--gfd-crash-sample")
    always = config.getoption("--gfd-always-resume")
    if sample is not None and sample < 1:
        raise pytest.UsageError(f"--gfd-crash-sample must be 1 or more, not {sample}")
    wanted: dict[str, str] = {}
    if sample is not None:
        wanted[CRASH_SAMPLE_ENV] = str(sample)
    if always:
        wanted[ALWAYS_RESUME_ENV] = "1"
    # Put back at the end: a pytest run inside a process (pytester, an IDE) leaves nothing behind.
    config.stash[_saved_env] = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in config.stash.get(_saved_env, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "durable_crash_matrix" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            MARKER
        ):
            item.add_marker(MARKER)


@pytest.fixture
def durable_crash_matrix(request: pytest.FixtureRequest) -> CrashMatrix:
    """An async callable with :func:`~graphflow_durable.testing.crash_matrix`'s arguments: it runs the
    matrix, asserts its report (a divergence fails the test with the first failure's crash point,
    node and difference) and returns the report. Await it in an async test (pytest-asyncio, anyio)::

        async def test_my_team_survives_any_crash(durable_crash_matrix, tmp_path):
            await durable_crash_matrix(make_team, "plan a trip", store=f"sqlite:///{tmp_path}/runs.db")
    """
    marker = request.node.get_closest_marker(MARKER)
    defaults = {k: v for k, v in (marker.kwargs if marker else {}).items() if k in _MARKER_OPTIONS}

    async def run(
        make_team: Callable[..., DurableGraphFlow] | str,
        task: str | BaseChatMessage | Sequence[BaseChatMessage],
        *,
        store: Store | str,
        points: Literal["every-commit", "mid-turn", "both"] | None = None,
        mode: Literal["inprocess", "subprocess"] | None = None,
        sample: int | None = None,
        answers: Mapping[str, str | Callable[[str], str]] | None = None,
    ) -> CrashReport:
        # Imported here, when a test calls it: no AutoGen at pytest's start.
        testing = importlib.import_module("graphflow_durable.testing")
        given: dict[str, Any] = {"points": points, "mode": mode, "sample": sample}
        options = {k: v if v is not None else defaults.get(k) for k, v in given.items()}
        options = {k: v for k, v in options.items() if v is not None}
        if answers is not None:
            options["answers"] = answers
        report: CrashReport = await testing.crash_matrix(make_team, task, store=store, **options)
        report.assert_ok()
        return report

    return run
