"""``graphflow-durable runs history | transcript | export | import | fork`` on SQLite and
PostgreSQL: data on stdout, one-line errors on stderr, the documented exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from autogen_agentchat.conditions import MaxMessageTermination

from agents import Gate, close_stores, durable, loop_agents, loop_graph, stored_transcript
from graphflow_durable.cli.runs import EXIT_CONFLICT, EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from graphflow_durable.flow import DurableGraphFlow
from graphflow_durable.store import Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _team(url: str | Store, run_id: str, hooks: dict[str, Gate] | None = None) -> DurableGraphFlow:
    agents = loop_agents([], hooks)
    return durable(
        agents, loop_graph(agents), url, run_id, MaxMessageTermination(60), interrupt_grace_seconds=0.1
    )


async def _recorded(url: str) -> DurableGraphFlow:
    team = _team(url, "source")
    await team.run(task="go")
    return team


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


async def test_runs_history_prints_every_step_as_a_table_or_json_lines(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    team = await _recorded(store_url)
    assert main(["runs", "history", "--store", store_url, "source"]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["STEP", "ROUND", "KIND", "NODE", "TRY", "TIME", "MESSAGES", "NEXT"]
    assert len(out) == 1 + team.run_info().head_seq
    assert out[2].split()[:3] == ["2", "1", "start"] and out[2].split()[-1] == "S"
    assert main(["runs", "history", "--store", store_url, "source", "--json", "--node", "J"]) == EXIT_OK
    rows = _json_lines(capsys.readouterr().out)
    assert [r["node"] for r in rows] == ["J", "J", "J"] and [r["attempt"] for r in rows] == [1, 1, 1]
    assert rows == [s.as_dict() for s in team.history(node="J")]


async def test_runs_transcript_prints_the_thread_filtered_by_node_and_round(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    team = await _recorded(store_url)
    assert main(["runs", "transcript", "--store", store_url, "source"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"[{i}] {source}: {content}" for i, (source, content) in enumerate(stored_transcript(team))
    ]
    assert main(["runs", "transcript", "--store", store_url, "source", "--node", "E", "--json"]) == EXIT_OK
    (row,) = _json_lines(capsys.readouterr().out)
    assert row["message"]["source"] == "E" and row["published"] is True  # type: ignore[index]
    assert main(["runs", "transcript", "--store", store_url, "source", "--round", "2"]) == EXIT_OK
    assert capsys.readouterr().out == ""


async def test_runs_fork_starts_a_new_run_that_resumes_to_the_source_transcript(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = await _recorded(store_url)
    assert (
        main(["runs", "fork", "--store", store_url, "source", "--at", "5", "--run-id", "f5", "--json"])
        == EXIT_OK
    )
    assert _json_lines(capsys.readouterr().out) == [
        {"run_id": "f5", "status": "interrupted", "head": 5, "messages": 4, "parent_run_id": "source"}
    ]
    assert main(["runs", "fork", "--store", store_url, "source", "--at", "3"]) == EXIT_OK
    said = capsys.readouterr().out
    assert (
        said.startswith("forked run source at step 3 as run source-fork-") and ": interrupted, head 3" in said
    )
    fork = _team(store_url, "f5")
    await fork.run()
    assert stored_transcript(fork) == stored_transcript(source)


async def test_runs_fork_refuses_unknown_runs_steps_out_of_range_taken_ids_and_a_live_head(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = (await _recorded(store_url)).run_info().head_seq
    assert main(["runs", "fork", "--store", store_url, "nope", "--at", "1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        err
        == "graphflow-durable: run nope does not exist, nothing was changed; 'graphflow-durable runs list' lists the runs\n"
    )
    assert main(["runs", "fork", "--store", store_url, "source", "--at", str(head + 1)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        f"run source has steps 1 to {head}; step {head + 1} is out of range" in err and err.count("\n") == 1
    )
    assert main(["runs", "fork", "--store", store_url, "source", "--at", "x"]) == EXIT_USAGE
    assert "invalid int value: 'x'" in capsys.readouterr().err
    assert main(["runs", "fork", "--store", store_url, "source"]) == EXIT_USAGE
    assert "--at" in capsys.readouterr().err
    assert (
        main(["runs", "fork", "--store", store_url, "source", "--at", "2", "--run-id", "source"])
        == EXIT_CONFLICT
    )
    assert "run source already exists" in capsys.readouterr().err
    for command in ("history", "transcript", "export"):
        assert main(["runs", command, "--store", store_url, "nope"]) == EXIT_USAGE
        assert capsys.readouterr().err.count("\n") == 1
    gate = Gate()
    live = _team(store_url, "live", {"J": gate})
    task = asyncio.ensure_future(live.run(task="go"))
    try:
        await gate.reached(task)
        at = str(live.run_info().head_seq)
        assert main(["runs", "fork", "--store", store_url, "live", "--at", at]) == EXIT_CONFLICT
        assert f"step {at} is its head" in capsys.readouterr().err
    finally:
        gate.open()
        await task
    with Store(store_url) as store:
        assert [r.run_id for r in store.list_runs()] == ["source", "live"], "nothing was written"


@pytest.mark.postgres
@pytest.mark.parametrize("source, target", [("sqlite", "postgres"), ("postgres", "sqlite")])
async def test_runs_export_then_import_moves_an_interrupted_run_to_the_other_backend_where_it_finishes(
    source: str,
    target: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    urls = {
        "sqlite": request.getfixturevalue("sqlite_url"),
        "postgres": request.getfixturevalue("postgres_database"),
    }
    reference = _team(urls[source], "reference")
    await reference.run(task="go")
    gate = Gate(turn=2)
    team = _team(urls[source], "moving", {"R": gate})
    task = asyncio.ensure_future(team.run(task="go"))
    await gate.reached(task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    exported = tmp_path / "moving.json"
    assert main(["runs", "export", "--store", urls[source], "moving", "--output", str(exported)]) == EXIT_OK
    assert capsys.readouterr().out == ""
    assert main(["runs", "export", "--store", urls[source], "moving"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == json.loads(exported.read_text())
    unwritable = tmp_path / "no such directory" / "x.json"
    assert (
        main(["runs", "export", "--store", urls[source], "moving", "--output", str(unwritable)]) == EXIT_ERROR
    )
    assert "cannot write it (No such file or directory)" in capsys.readouterr().err
    assert main(["runs", "import", "--store", urls[target], str(exported), "--json"]) == EXIT_OK
    (row,) = _json_lines(capsys.readouterr().out)
    assert row["run_id"] == "moving" and row["status"] == "interrupted"
    assert main(["runs", "import", "--store", urls[target], str(exported)]) == EXIT_CONFLICT
    assert "run moving already exists" in capsys.readouterr().err
    there = _team(urls[target], "moving")
    await there.run()
    assert there.run_info().status == "finished"
    assert stored_transcript(there) == stored_transcript(reference)


def test_runs_import_refuses_a_missing_file_text_that_is_not_json_and_a_document_that_is_not_an_export(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"
    assert main(["runs", "import", "--store", sqlite_url, str(missing)]) == EXIT_USAGE
    assert f"FILE {missing}: cannot read it (No such file or directory)" in capsys.readouterr().err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert main(["runs", "import", "--store", sqlite_url, str(garbage)]) == EXIT_USAGE
    assert "not JSON" in capsys.readouterr().err
    garbage.write_text('{"run": 1}')
    assert main(["runs", "import", "--store", sqlite_url, str(garbage)]) == EXIT_USAGE
    assert "not a graphflow-durable run export" in capsys.readouterr().err
    assert (
        main(["runs", "export", "--store", sqlite_url, "x", "--output", str(tmp_path / "x.json")])
        == EXIT_USAGE
    )
    assert "run x does not exist" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    assert main(["runs", "history", "--store", sqlite_url, " bad"]) == EXIT_USAGE
    assert "leading or trailing white space" in capsys.readouterr().err
    with Store(sqlite_url) as store:
        assert store.list_runs() == []


async def test_runs_export_piped_into_runs_import_from_stdin_in_real_processes(
    sqlite_url: str, tmp_path: Path
) -> None:
    await _recorded(sqlite_url)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    cli = [sys.executable, "-m", "graphflow_durable.cli.runs"]
    exported = subprocess.run(
        [*cli, "runs", "export", "--store", sqlite_url, "source"], capture_output=True, check=True, timeout=60
    )
    imported = subprocess.run(
        [*cli, "runs", "import", "--store", other, "-", "--run-id", "copy"],
        input=exported.stdout,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert imported.returncode == EXIT_OK, imported.stderr
    assert imported.stdout.decode().startswith("imported run copy: finished, head ")
    failed = subprocess.run(
        [*cli, "runs", "import", "--store", other, "-"],
        input=b"[]",
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert failed.returncode == EXIT_USAGE and b"Traceback" not in failed.stderr
    assert failed.stderr.decode().count("\n") == 1
    with Store(other) as copy, Store(sqlite_url) as original:
        # the same messages; their checksums differ, as a checksum covers the run id
        bodies = [
            [{k: v for k, v in m.items() if k != "checksum"} for m in store.export_run(run)["messages"]]
            for store, run in ((copy, "copy"), (original, "source"))
        ]
        assert bodies[0] == bodies[1]


def test_runs_import_refuses_json_nested_deeper_than_the_limit_on_one_line_and_writes_nothing(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(sqlite_url):
        pass  # an empty store, to show that nothing is written into it
    deep = tmp_path / "deep.json"
    deep.write_text('{"run": ' + "[" * 200_000 + "]" * 200_000 + "}", encoding="utf-8")
    assert main(["runs", "import", "--store", sqlite_url, str(deep)]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"graphflow-durable: FILE {deep}: JSON nested more than 500 levels deep (the limit); "
        "not a run export file\n"
    )
    with Store(sqlite_url) as store:
        assert store.list_runs() == []
