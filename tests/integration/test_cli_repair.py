"""graphflow-repair, run in-process through main(argv) and once as ``python -m`` in a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.cli.repair import main
from graphflow_durable.integrity import validate_state

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_legacy as ml  # noqa: E402

LEGACY = FIXTURES / "legacy"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Copies of the zombie fixture and its graph, plus a few broken inputs."""
    out = {
        "state": tmp_path / "state.json",
        "graph": tmp_path / "graph.json",
        "empty": tmp_path / "empty.json",
        "notjson": tmp_path / "notjson.json",
        "shape": tmp_path / "shape.json",
    }
    shutil.copy(LEGACY / "sequential_zombie.json", out["state"])
    shutil.copy(LEGACY / "sequential_zombie.graph.json", out["graph"])
    out["empty"].write_text("", encoding="utf-8")
    out["notjson"].write_text("{nope", encoding="utf-8")
    out["shape"].write_text('{"messages": []}', encoding="utf-8")
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_check_mode_reports_the_zombie_and_exits_1_writing_nothing(files, capsys) -> None:
    before = snapshot(files["state"].parent)
    code, out, err = run(capsys, files["state"], "--graph", files["graph"])
    assert code == 1
    assert "GFD201-zombie-ready-empty" in out
    assert "/agent_states/GraphManager/ready" in out
    assert err == ""
    assert snapshot(files["state"].parent) == before


def test_check_mode_without_a_graph_still_finds_the_zombie_and_lists_skipped_checks(files, capsys) -> None:
    code, out, _ = run(capsys, files["state"])
    assert code == 1
    assert "GFD201-zombie-ready-empty" in out
    assert "skipped" in out


def test_check_mode_exits_0_for_a_valid_state_and_json_mode_prints_the_report(files, capsys) -> None:
    shutil.copy(LEGACY / "finished.json", files["state"])
    shutil.copy(LEGACY / "finished.graph.json", files["graph"])
    code, out, _ = run(capsys, files["state"], "--graph", files["graph"])
    assert code == 0
    assert "valid" in out
    code, out, _ = run(capsys, files["state"], "--graph", files["graph"], "--json")
    report = json.loads(out)
    assert code == 0
    assert report["ok"] is True
    assert {f["code"] for f in report["findings"]} == {"GFD006-legacy-format", "GFD211-finished-restarts"}


def test_output_writes_the_repaired_state_and_leaves_the_input_alone(files, capsys, tmp_path) -> None:
    original = files["state"].read_bytes()
    out_file = tmp_path / "fixed.json"
    code, out, err = run(capsys, files["state"], "--graph", files["graph"], "-o", out_file)
    assert code == 0
    assert files["state"].read_bytes() == original
    repaired = json.loads(out_file.read_text(encoding="utf-8"))
    sched = repaired["agent_states"]["GraphManager"]["graphflow_durable"]["scheduler"]
    assert sched["in_flight"] == ["B"]
    assert f"wrote {out_file}" in err
    assert "repair changed" in out
    code, out, _ = run(capsys, out_file, "--graph", files["graph"])
    assert code == 0
    assert validate_state(repaired, ml.SCENARIOS["sequential_zombie"].graph()).findings == ()


def test_output_dash_writes_the_state_to_stdout_and_the_report_to_stderr(files, capsys) -> None:
    code, out, err = run(capsys, files["state"], "--graph", files["graph"], "-o", "-")
    assert code == 0
    assert json.loads(out)["agent_states"]["GraphManager"]["ready"] == ["B"]
    assert "GFD201" in err


def test_in_place_keeps_a_backup_and_refuses_to_overwrite_one(files, capsys) -> None:
    original = files["state"].read_bytes()
    code, _, err = run(capsys, files["state"], "--graph", files["graph"], "--in-place")
    assert code == 0
    backup = files["state"].with_name("state.json.bak")
    assert backup.read_bytes() == original
    assert json.loads(files["state"].read_text(encoding="utf-8"))["agent_states"]["GraphManager"][
        "ready"
    ] == ["B"]
    assert "backup" in err
    # already repaired: nothing to do, nothing written
    repaired = files["state"].read_bytes()
    code, _, err = run(capsys, files["state"], "--graph", files["graph"], "--in-place")
    assert code == 0
    assert "nothing written" in err
    assert files["state"].read_bytes() == repaired
    # a fresh broken file with a stale backup next to it: refused, nothing touched
    files["state"].write_bytes(original)
    code, _, err = run(capsys, files["state"], "--graph", files["graph"], "--in-place")
    assert code == 2
    assert "backup already exists" in err
    assert files["state"].read_bytes() == original
    assert backup.read_bytes() == original
    assert not list(files["state"].parent.glob(".*.tmp"))


def test_dry_run_shows_the_scheduler_diff_and_writes_nothing(files, capsys, tmp_path) -> None:
    before = snapshot(files["state"].parent)
    code, out, err = run(
        capsys, files["state"], "--graph", files["graph"], "--dry-run", "-o", tmp_path / "x.json"
    )
    assert code == 0
    assert "repair would change" in out
    assert '/agent_states/GraphManager/ready\n    - []\n    + ["B"]' in out
    assert "scheduler/in_flight" in out
    assert "nothing written" in err
    assert snapshot(files["state"].parent) == before
    code, out, _ = run(capsys, files["state"], "--graph", files["graph"], "--dry-run", "--json")
    payload = json.loads(out)
    assert payload["written"] is None
    assert {"pointer": "/agent_states/GraphManager/ready", "before": "[]", "after": '["B"]'} in payload[
        "changes"
    ]


def test_graph_from_a_graphflow_component_dump(files, capsys, tmp_path) -> None:
    dump = tmp_path / "team.json"
    dump.write_text(
        ml.SCENARIOS["sequential_zombie"].team().dump_component().model_dump_json(), encoding="utf-8"
    )
    code, out, _ = run(capsys, files["state"], "--graph", dump, "--dry-run")
    assert code == 0
    assert "scheduler/in_flight" in out


def test_graph_from_an_importable_team_or_factory(files, capsys, tmp_path, monkeypatch) -> None:
    (tmp_path / "myteams.py").write_text(
        "import make_legacy\n"
        "def build():\n    return make_legacy.SCENARIOS['sequential_zombie'].team()\n"
        "TEAM = build()\n"
        "GRAPH = TEAM._graph\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "myteams", raising=False)
    for attr in ("build", "TEAM", "GRAPH"):
        code, _, err = run(capsys, files["state"], "--team", f"myteams:{attr}", "--dry-run")
        assert code == 0, err
    code, _, err = run(capsys, files["state"], "--team", "myteams:nothing")
    assert code == 2
    assert "no attribute" in err
    code, _, err = run(capsys, files["state"], "--team", "no_such_module_x:y")
    assert code == 2
    assert "cannot import" in err


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing", "no such file"),
        ("directory", "is a directory"),
        ("empty", "the file is empty"),
        ("notjson", "not JSON"),
        ("shape", "wrong shape"),
    ],
)
def test_bad_input_is_a_one_line_error_exit_2_and_nothing_is_written(
    files, capsys, tmp_path, target, message
) -> None:
    path = {"missing": tmp_path / "missing.json", "directory": tmp_path}.get(target) or files[target]
    before = snapshot(tmp_path)
    for extra in ([], ["--graph", str(files["graph"]), "-o", str(tmp_path / "out.json")]):
        code, out, err = run(capsys, path, *extra)
        assert code == 2
        assert out == ""
        assert err.count("\n") == 1
        assert message in err
        assert str(path) in err
        assert "Traceback" not in err
    assert snapshot(tmp_path) == before


def test_a_state_from_a_different_graph_is_a_one_line_error(files, capsys) -> None:
    other = LEGACY / "fanout_join.graph.json"
    for extra in ([], ["--dry-run"]):
        code, _, err = run(capsys, files["state"], "--graph", other, *extra)
        assert code == 2
        assert "GFD010-different-graph" in err or "different graph" in err
        assert err.count("\n") == 1


def test_an_unrepairable_thread_exits_3_and_writes_nothing(files, capsys, tmp_path) -> None:
    state: dict[str, Any] = json.loads(files["state"].read_text(encoding="utf-8"))
    thread = state["agent_states"]["GraphManager"]["message_thread"]
    thread.append(dict(thread[1], source="C"))  # C answers before B ever did
    files["state"].write_text(json.dumps(state), encoding="utf-8")
    code, out, err = run(capsys, files["state"], "--graph", files["graph"], "-o", tmp_path / "out.json")
    assert code == 3
    assert "not repairable" in err
    assert "message 2 from 'C'" in err
    assert not (tmp_path / "out.json").exists()
    code, out, _ = run(capsys, files["state"], "--graph", files["graph"])
    assert code == 1
    assert "GFD209-thread-unexplained" in out


def test_usage_errors_exit_2(files, capsys) -> None:
    assert run(capsys)[0] == 2
    code, _, err = run(capsys, files["state"], "-o", "x.json")
    assert code == 2
    assert "needs the graph" in err
    code, _, _ = run(capsys, files["state"], "--graph", files["graph"], "-o", "x.json", "--in-place")
    assert code == 2
    code, _, err = run(capsys, files["state"], "--graph", files["notjson"])
    assert code == 2
    assert "notjson.json" in err


def test_help_documents_the_exit_codes(capsys) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for line in ("0  valid", "1  problems found", "2  usage error", "3  not repairable"):
        assert line in out


def test_python_dash_m_runs_the_cli_in_a_subprocess(files, tmp_path) -> None:
    out_file = tmp_path / "fixed.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphflow_durable.cli.repair",
            str(files["state"]),
            "--graph",
            str(files["graph"]),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert "GFD201-zombie-ready-empty" in done.stdout
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphflow_durable.cli.repair",
            str(files["state"]),
            "--graph",
            str(files["graph"]),
            "-o",
            str(out_file),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out_file.read_text(encoding="utf-8"))["agent_states"]["GraphManager"]["ready"] == ["B"]


def test_a_closed_stdout_drops_the_rest_of_the_output_and_keeps_the_commands_exit_code(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader closing stdout is not the command's success: the problems found still exit 1."""

    class ClosedPipe:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main([str(files["state"]), "--graph", str(files["graph"])]) == 1  # problems found
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("depth", [200_000, 600])
def test_json_nested_deeper_than_the_limit_is_refused_on_one_line_naming_the_file_and_the_limit(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    """200 KB of nesting is beyond the JSON parser; 600 levels parse but would exhaust repair's stack."""
    state = json.loads(files["state"].read_text(encoding="utf-8"))
    state["agent_states"]["A"]["deep"] = "@"
    text = json.dumps(state).replace('"@"', "[" * depth + "]" * depth)
    files["state"].write_text(text, encoding="utf-8")
    before = snapshot(files["state"].parent)
    for argv in ([files["state"]], [files["state"], "--graph", files["graph"], "--in-place"]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, "")
        assert err == (
            f"graphflow-repair: {files['state']}: JSON nested more than 200 levels deep (the limit); "
            "not a team state file\n"
        )
    assert snapshot(files["state"].parent) == before
