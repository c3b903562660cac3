"""The code of the README and docs/ and the examples run as documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import graphflow_durable

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(markdown: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown.read_text(), flags=re.S)


#: The documents whose python blocks are whole scripts; each runs twice against one store.
EXECUTED_DOCUMENTS = (
    "README.md",
    "docs/lifecycle.md",
    "docs/human-in-the-loop.md",
    "docs/operations.md",
    "docs/retries.md",
    "docs/recorded-calls.md",
    "docs/rate-limits.md",
)


def test_readme_and_docs_python_examples_run_and_resume_from_the_same_store(tmp_path: Path) -> None:
    for document in EXECUTED_DOCUMENTS:
        blocks = python_blocks(ROOT / document)
        assert blocks, f"{document} has no python example"
        for index, code in enumerate(blocks):
            script = tmp_path / f"{Path(document).stem}_{index}.py"
            script.write_text(code)
            for attempt in (1, 2):  # the second run finds the stored run
                done = subprocess.run(
                    [sys.executable, str(script)],
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert done.returncode == 0, f"{document} block {index}, run {attempt}:\n{done.stderr}"


#: Runs a script (argv[1]) that is SIGKILLed just after its first live tool call is recorded.
_KILLED_AFTER_A_TOOL_RECORD = """
import os, runpy, signal, sys
import importlib
turncalls = importlib.import_module("graphflow_durable._turncalls")

write = turncalls.TurnCalls.write

async def write_then_die(self, kind, *args, result, usage):
    await write(self, kind, *args, result=result, usage=usage)
    if kind == "tool" and result is not None:
        os.kill(os.getpid(), signal.SIGKILL)

turncalls.TurnCalls.write = write_then_die
runpy.run_path(sys.argv[1], run_name="__main__")
"""


def test_the_recorded_calls_page_example_resumed_in_a_new_process_gives_the_uninterrupted_transcript(
    tmp_path: Path,
) -> None:
    """The page's first example, killed after its refund is recorded and run again in a new
    process, ends with the transcript of an uninterrupted run (its model answers by the request)."""
    script = tmp_path / "example.py"
    script.write_text(python_blocks(ROOT / "docs" / "recorded-calls.md")[0])
    killer = tmp_path / "killed.py"
    killer.write_text(_KILLED_AFTER_A_TOOL_RECORD)

    def run(*argv: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        cwd.mkdir(exist_ok=True)
        return subprocess.run(
            [sys.executable, *map(str, argv)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def transcript(cwd: Path) -> list[tuple[str, Any]]:
        with graphflow_durable.Store(f"sqlite:///{cwd / 'calls.db'}") as store:
            return [(m.body["source"], m.body["content"]) for m in store.load("refund-a17").messages]

    assert run(script, cwd=tmp_path / "ref").returncode == 0
    killed = run(killer, script, cwd=tmp_path / "crash")
    assert killed.returncode == -9, killed.stderr
    resumed = run(script, cwd=tmp_path / "crash")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["3", "2", "25"], "the model call and the refund were replayed"
    assert transcript(tmp_path / "crash") == transcript(tmp_path / "ref")


def test_crash_demo_resumes_at_summarize_in_a_fresh_process_without_rerunning_completed_nodes(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "crash_demo.py"), "--db", str(tmp_path / "demo.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "worker 1 exited with -9" in out
    second = out.split("== worker 2")[1].split("== timeline")[0]
    assert "summarize: started" in second and "report: done" in second
    assert "research" not in second and "validate" not in second
    assert "completed nodes that ran twice: none" in out


def test_the_console_demo_serves_its_waiting_run_in_the_inbox_and_stops_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "console_demo.py"), "--smoke", "--store", f"sqlite:///{db}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "WORKER_POOL_DELAY": "0.1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^the console: http://127\.0\.0\.1:\d+/", done.stdout, flags=re.M), done.stdout
    assert done.stdout.rstrip().endswith("smoke: the inbox lists the waiting run")
    with graphflow_durable.Store(f"sqlite:///{db}") as store:
        refund = store.get_run("refund-1234")
        assert refund is not None and refund.status == "waiting"
        assert refund.lease_owner is None, "the worker let the run go when it stopped"


def test_public_api_all_is_sorted_and_complete() -> None:
    names = graphflow_durable.__all__
    assert list(names) == sorted(names)
    for name in names:
        assert hasattr(graphflow_durable, name), name
    public = {
        n
        for n in vars(graphflow_durable)
        if not n.startswith("_") and not isinstance(getattr(graphflow_durable, n), type(sys))
    }
    public -= {"annotations"}
    assert public <= set(names), f"exported but not in __all__: {sorted(public - set(names))}"


def test_human_in_the_loop_example_parks_exits_is_answered_and_finishes_in_three_processes(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "human_in_the_loop.py"), "--db", str(tmp_path / "hitl.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, second, third = done.stdout.split("== process")[1:]
    assert "waiting for input: approver asks" in first and "status: waiting" in first
    assert "answered; the run is interrupted" in second
    assert "[draft]" not in third and "[publish] runs (heard: 'approved')" in third
    assert "status: finished" in third


def test_recorded_calls_example_resumes_a_killed_turn_paying_only_for_the_calls_not_yet_answered(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "recorded_calls.py"), "--db", str(tmp_path / "calls.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split("== the clerk's calls")[0].split("== worker")[1:3]
    assert first.count("model called") == 2 and "lookup_order: done" in first
    assert "worker 1 exited with -9" in first
    assert second.count("model called") == 1 and "lookup_order" not in second
    assert "issue_refund: done" in second
    assert "model calls made: worker 1: 2, worker 2: 1 (worker 2 replayed 2 from the store" in done.stdout
    assert "lookup_order ran 1 time(s)" in done.stdout and "issue_refund ran 1 time(s)" in done.stdout


def test_observe_example_follows_a_worker_driven_run_and_prints_one_trace_tree() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "observe.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    followed, tree = done.stdout.split("== trace ")
    seqs = [line.split("]")[0] for line in followed.splitlines() if line.startswith("[")]
    assert seqs == ["[0", "[1", "[2", "[3", "[4"]
    assert "== round over: Digraph execution is complete" in followed
    lines = tree.splitlines()
    assert lines[0].endswith(": 1 trace(s)") and lines[1] == "submit"
    assert lines[2].startswith("  invoke_workflow report  status=finished resumed=False")
    agents = sorted(line.split("  ")[2] for line in lines[3:])
    assert agents == [
        "invoke_agent critique",
        "invoke_agent plan",
        "invoke_agent research",
        "invoke_agent write",
    ]
    assert all(" attempt=1" in line and " step=" in line for line in lines[3:])


@pytest.mark.parametrize(
    "options", [[], ["--gfd-always-resume", "--gfd-crash-sample=2"]], ids=["plain", "switches"]
)
def test_the_users_team_test_example_passes_under_pytest(tmp_path: Path, options: list[str]) -> None:
    """``pytest examples/test_my_team.py`` as a user runs it, with what docs/crash-kit.md lists
    (pytest and pytest-asyncio: pytest-timeout, which this repository's tests use, not loaded): the
    crash matrix and the ordinary test pass, and with the plugin's switches too."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:timeout",
            "examples/test_my_team.py",
            f"--basetemp={tmp_path / 'pytest'}",
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_a_users_copy_of_the_team_test_example_passes_outside_the_repository(tmp_path: Path) -> None:
    """The example copied into a project of its own (no config of this repository), run with pytest
    and pytest-asyncio only: it passes."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "test_my_team.py", project / "test_my_team.py")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout


def test_every_heading_of_the_docs_is_a_plain_title_once_per_page() -> None:
    """A heading holds no link, no unbalanced quote, backtick or bracket, and no page has one twice
    (two headings alike: a section pasted in twice, or the tail of a merge left behind)."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced, seen = False, set()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("#"):
                continue
            where = f"{page.name}:{number}: {line}"
            assert "](" not in line, where
            assert line.count('"') % 2 == 0 and line.count("`") % 2 == 0, where
            assert line.count("(") == line.count(")") and line.count("[") == line.count("]"), where
            assert line not in seen, where
            seen.add(line)


def test_the_encrypted_example_keeps_no_plaintext_in_the_database_and_refuses_a_reader_without_the_key(
    tmp_path: Path,
) -> None:
    db = tmp_path / "sealed.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHFLOW_DURABLE_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "encrypted.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "[reply] Dear Jane, your refund of 42.00 EUR" in out, "the key holder reads the text"
    assert "a stored message body: gfd1:k1:" in out
    assert "plaintext of the task and messages in the file: none" in out
    assert re.search(r"its transcript is refused: .*'k1'", out), out
    # The file the example left: none of its texts, in any table, in any form.
    data = db.read_bytes()
    for text in ("Jane Roe", "IBAN", "jane.roe@example.com", "card ending 4242", "42.00 EUR"):
        assert text.encode() not in data, text
    assert "k1=" not in out, "the key material is never printed"
