"""What the command line writes when its output cannot take it: a reader that closes the pipe early
(the command still exits with its own code), and a terminal whose encoding cannot show the text
(non-Latin-1 text is written as backslash escapes, never a crash half-way through a table)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.cli.runs import EXIT_DAMAGED, EXIT_OK
from graphflow_durable.store import MessageRecord, RunUpdate, Step, Store

RUNS = [sys.executable, "-m", "graphflow_durable.cli.runs", "runs"]
LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
#: Text no Latin-1 (nor ASCII) terminal can show.
FOREIGN = "Grüße € 東京"


def _finished_run(store: Store, run_id: str, contents: list[str]) -> None:
    token = store._driver.create_run(
        CreateRequest(run_id, graph_fingerprint="fp", graph={}, owner="w", lease_seconds=60)
    ).fencing_token
    store._driver.commit(
        CommitRequest(
            run_id,
            expected_head=0,
            fencing_token=token,
            step=Step(kind="complete", node="a", scheduler={}),
            messages=[
                MessageRecord(
                    seq=seq, body={"type": "TextMessage", "source": "a", "content": text}, published=True
                )
                for seq, text in enumerate(contents)
            ],
            update=RunUpdate(status="finished", release_lease=True),
        )
    )


def test_runs_verify_keeps_exit_4_when_its_reader_closes_the_pipe_after_the_first_line(
    store_url: str,
) -> None:
    with Store(store_url) as store:
        _finished_run(store, "run", [f"message {i}" for i in range(2000)])
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:  # every message row damaged: ~150 KB of report, more than a pipe holds
            conn.execute(sa.text("UPDATE graphflow_messages SET body = body || ' '"))
    finally:
        engine.dispose()
    first, err, code = _first_line_then_close([*RUNS, "verify", "--store", store_url])
    assert code == EXIT_DAMAGED, err
    assert first.startswith("run run: message ") and "does not match its checksum" in first
    assert "2000 damaged" in err and "Traceback" not in err and "Exception ignored" not in err


def _first_line_then_close(argv: list[str]) -> tuple[str, str, int]:
    """Run ``argv``, read the first line of its stdout and close the pipe, as ``| head -1`` does:
    that line, its stderr and its exit code."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as reader:
        assert reader.stdout is not None and reader.stderr is not None
        first = reader.stdout.readline()
        reader.stdout.close()
        err = reader.stderr.read()
        return first, err, reader.wait(timeout=120)


@pytest.mark.parametrize(
    "env",
    [{"PYTHONIOENCODING": "latin-1"}, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}],
    ids=["latin-1", "ascii"],
)
def test_runs_list_transcript_and_prune_write_text_the_terminal_cannot_show_as_escapes(
    sqlite_url: str, env: dict[str, str]
) -> None:
    with Store(sqlite_url) as store:
        _finished_run(store, "run-€", [FOREIGN])
        _finished_run(store, "plain", ["hello", FOREIGN])
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LC_ALL", "LANG")}
    for args, shown in (
        (["list"], "run-\\u20ac"),
        (["transcript", "plain"], "[1] a: Gr\\xfc\\xdfe \\u20ac \\u6771\\u4eac"),
        (["prune", "--older-than", "0s", "--dry-run"], "(run-\\u20ac, plain)"),
    ):
        done = subprocess.run(
            [*RUNS, *args, "--store", sqlite_url],
            env={**environ, **env},
            capture_output=True,
            timeout=60,
            check=False,
        )
        out, err = done.stdout.decode("ascii", "replace"), done.stderr.decode("ascii", "replace")
        assert (done.returncode, err) == (EXIT_OK, ""), args
        if env.get("PYTHONIOENCODING") == "latin-1":
            shown = shown.replace("\\xfc\\xdf", "\ufffd\ufffd")  # ü and ß are Latin-1: written as such
        assert shown in out, (args, out)
    with Store(sqlite_url) as store:
        assert {run.run_id for run in store.list_runs()} == {"run-€", "plain"}  # dry run: nothing pruned


def test_graphflow_repair_writes_a_file_name_the_terminal_cannot_show_as_escapes(tmp_path: Path) -> None:
    state = tmp_path / "état-€.json"
    shutil.copy(LEGACY / "sequential_zombie.json", state)
    done = subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.repair", str(state)],
        env={**os.environ, "PYTHONIOENCODING": "latin-1"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stderr == b""  # problems found, reported in full
    assert done.stdout.decode("latin-1").startswith(f"{tmp_path}/état-\\u20ac.json: 1 problem found")
