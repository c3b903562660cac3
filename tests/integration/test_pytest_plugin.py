"""The pytest plugin as a user's pytest run meets it: options, marker, and the fixture's verdict.

Each test runs pytest in a subprocess on a small project written to a temporary folder; the plugin
comes in through its ``pytest11`` entry point (the package is installed). The fixture's verdict is
checked against a stand-in ``graphflow_durable.testing`` (the project's conftest) where the test is
about the plugin only; the last test builds a fresh virtualenv with nothing but the package, pytest
and pytest-asyncio, and runs a user's test of a good and a broken team with the real crash kit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pytest(project: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHFLOW_DURABLE_")}
    return subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\n")
    return tmp_path


ENV_TEST = """
    import os

    def test_env():
        print("SAMPLE", os.environ.get("GRAPHFLOW_DURABLE_CRASH_SAMPLE"))
        print("ALWAYS", os.environ.get("GRAPHFLOW_DURABLE_ALWAYS_RESUME"))
"""


def test_the_options_set_the_switches_and_nothing_is_set_without_them(tmp_path: Path) -> None:
    project = _project(tmp_path, {"test_env.py": ENV_TEST})
    plain = _pytest(project, "-s")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "SAMPLE None" in plain.stdout and "ALWAYS None" in plain.stdout
    given = _pytest(project, "-s", "--gfd-crash-sample=3", "--gfd-always-resume")
    assert given.returncode == 0, given.stdout + given.stderr
    assert "SAMPLE 3" in given.stdout and "ALWAYS 1" in given.stdout


def test_a_crash_sample_below_one_is_a_usage_error(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path, {"test_env.py": ENV_TEST}), "--gfd-crash-sample=0")
    assert done.returncode == 4  # pytest's usage error
    assert "--gfd-crash-sample must be 1 or more, not 0" in done.stderr


#: A stand-in crash kit: the report fails when the team's name says "broken"; it records the
#: arguments it was called with.
STAND_IN = """
    import sys, types
    from dataclasses import dataclass, field

    @dataclass
    class CrashReport:
        points: int
        failures: list = field(default_factory=list)

        def assert_ok(self):
            if self.failures:
                raise AssertionError(f"crash point {self.failures[0]} (node B): transcript differs")

    CALLS = []

    async def crash_matrix(make_team, task, *, store, points="every-commit", mode="inprocess", sample=None):
        CALLS.append({"points": points, "mode": mode, "sample": sample})
        return CrashReport(points=5, failures=[2] if "broken" in make_team else [])

    module = types.ModuleType("graphflow_durable.testing")
    module.CrashReport, module.crash_matrix, module.CALLS = CrashReport, crash_matrix, CALLS
    sys.modules["graphflow_durable.testing"] = module
"""

FIXTURE_TESTS = """
    import sys
    import pytest

    @pytest.mark.asyncio
    async def test_good(durable_crash_matrix):
        report = await durable_crash_matrix("team:good", "go", store="sqlite:///x.db")
        assert report.points == 5

    @pytest.mark.asyncio
    async def test_broken(durable_crash_matrix):
        await durable_crash_matrix("team:broken", "go", store="sqlite:///x.db")

    @pytest.mark.asyncio
    @pytest.mark.graphflow_crash_matrix(sample=2, mode="subprocess")
    async def test_marker_defaults(durable_crash_matrix):
        await durable_crash_matrix("team:good", "go", store="sqlite:///x.db", mode="inprocess")
        calls = sys.modules["graphflow_durable.testing"].CALLS
        assert calls[-1] == {"points": "every-commit", "mode": "inprocess", "sample": 2}
"""


def test_the_fixture_fails_a_test_whose_matrix_diverges_and_passes_the_others(tmp_path: Path) -> None:
    project = _project(tmp_path, {"conftest.py": STAND_IN, "test_team.py": FIXTURE_TESTS})
    done = _pytest(project, "-rA")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert out.splitlines()[-1].startswith("1 failed, 2 passed in")  # failed, not errored
    assert "FAILED test_team.py::test_broken - AssertionError: crash point 2 (node B)" in out
    # Every test that uses the fixture carries the marker: -m deselects them.
    deselected = _pytest(project, "-m", "not graphflow_crash_matrix")
    assert "3 deselected" in deselected.stdout, deselected.stdout


#: A user's test, written as the README tells: one good team, one whose agent's saved state drops a
#: field. Only the package, pytest and pytest-asyncio are installed where it runs.
USER_TEST = """
    from collections.abc import Sequence

    import pytest
    from autogen_agentchat.agents import BaseChatAgent
    from autogen_agentchat.base import Response
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.messages import TextMessage
    from autogen_agentchat.teams import DiGraphBuilder

    from graphflow_durable import DurableGraphFlow


    class Counter(BaseChatAgent):
        def __init__(self, name, *, forgets=False):
            super().__init__(name, "counts its turns")
            self.turn, self.forgets = 0, forgets

        @property
        def produced_message_types(self):
            return (TextMessage,)

        async def on_messages(self, messages, cancellation_token):
            self.turn += 1
            word = "again" if self.name == "B" and self.turn < 3 else "done"
            return Response(chat_message=TextMessage(content=f"{self.name}#{self.turn} {word}", source=self.name))

        async def on_reset(self, cancellation_token):
            self.turn = 0

        async def save_state(self):
            return {} if self.forgets else {"turn": self.turn}

        async def load_state(self, state):
            self.turn = state.get("turn", 0)


    def team(run_id, *, store, forgets=False):
        a, b, c = Counter("A"), Counter("B", forgets=forgets), Counter("C")
        g = DiGraphBuilder()
        for agent in (a, b, c):
            g.add_node(agent)
        g.add_edge(a, b)
        g.add_edge(b, a, condition="again")
        g.add_edge(b, c, condition="done")
        g.set_entry_point(a)
        return DurableGraphFlow([a, b, c], g.build(), termination_condition=MaxMessageTermination(20),
                                store=store, run_id=run_id)


    def broken_team(run_id, *, store):
        return team(run_id, store=store, forgets=True)


    @pytest.mark.asyncio
    async def test_TEAM_survives_any_crash(durable_crash_matrix, tmp_path):
        await durable_crash_matrix(TEAM, "go", store=f"sqlite:///{tmp_path}/runs.db")
"""


@pytest.mark.slow
def test_in_a_fresh_virtualenv_the_fixture_passes_a_good_team_and_fails_a_broken_one(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # The machine's package index and cache (pip's configuration), no network beyond them.
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", str(ROOT), "pytest", "pytest-asyncio"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    project = tmp_path / "user"
    project.mkdir()
    _project(
        project,
        {
            "test_good.py": USER_TEST.replace("TEAM", "team"),
            "test_broken.py": USER_TEST.replace("TEAM", "broken_team"),
        },
    )
    good = _pytest(project, "test_good.py", "--gfd-crash-sample=3", python=python)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "1 passed" in good.stdout
    broken = _pytest(project, "test_broken.py", python=python)
    assert broken.returncode == 1, broken.stdout + broken.stderr  # failed, not errored (that is 1 too)
    assert "1 failed" in broken.stdout and "error" not in broken.stdout.splitlines()[-1]
    assert "AssertionError: crash point" in broken.stdout
