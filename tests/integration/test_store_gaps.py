"""A row deleted from a run's log (a step, a message) or a run row whose head was moved back is found:
a resume refuses the run with :class:`StoreCorruptError` naming the gap before any agent runs, and
``runs verify`` lists it (exit code 4), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, fail_once
from graphflow_durable._storage.reading import message_gaps, step_gaps
from graphflow_durable.cli.runs import EXIT_DAMAGED, EXIT_OK
from graphflow_durable.errors import StoreCorruptError
from graphflow_durable.store import Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


_NODES = "ABCDE"


async def _failed_run(url: str) -> None:
    """A chain A -> B -> C -> D -> E whose E failed: A..D's turns are committed."""
    agents = [Scripted(n, before=fail_once() if n == "E" else None) for n in _NODES]
    with pytest.raises(RuntimeError, match="E crashed on purpose"):
        await durable(agents, chain(*agents), url, "run").run(task="go")


def _sql(url: str, statement: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _head(url: str) -> tuple[int, int]:
    [(head, count)] = _sql(url, "SELECT head_seq, message_count FROM graphflow_runs WHERE run_id = 'run'")
    return int(head), int(count)


def _step_of(url: str, node: str) -> int:
    """The step that committed ``node``'s answer."""
    [(seq,)] = _sql(url, "SELECT seq FROM graphflow_steps WHERE kind = 'complete' AND node = :n", n=node)
    return int(seq)


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", *args, "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _refused(url: str, gap: str) -> StoreCorruptError:
    """Resume: StoreCorruptError naming ``gap``, nothing run; ``runs verify`` reports the same gap."""
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in _NODES]
    with pytest.raises(StoreCorruptError) as caught:
        await durable(agents, chain(*agents), url, "run").run()
    assert calls == [], "no agent may run on a log with a hole"
    error = caught.value
    assert error.run_id == "run" and "\n" not in str(error)
    assert gap in str(error) and "runs verify run" in str(error)

    with Store(url) as store:
        found = store.verify(["run"])
    assert not found.ok and any(gap in d.describe() for d in found.damaged), found.damaged
    done = _cli(url, "verify")
    assert done.returncode == EXIT_DAMAGED, done.stderr
    assert "Traceback" not in done.stderr
    assert any(gap in line for line in done.stdout.splitlines()), done.stdout
    as_json = [json.loads(line) for line in _cli(url, "verify", "--json").stdout.splitlines()]
    assert all(d["run_id"] == "run" and d["problem"] for d in as_json), as_json
    return error


async def test_an_intact_run_verifies_clean_and_resumes(store_url: str) -> None:
    await _failed_run(store_url)
    with Store(store_url) as store:
        assert store.verify().ok
    done = _cli(store_url, "verify")
    assert (done.returncode, done.stdout) == (EXIT_OK, ""), done.stderr
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in _NODES]
    await durable(agents, chain(*agents), store_url, "run").run()
    assert calls == ["E"]


async def test_a_deleted_step_row_is_refused_on_resume_and_found_by_verify(store_url: str) -> None:
    await _failed_run(store_url)
    head, _ = _head(store_url)
    gone = _step_of(store_url, "B")
    _sql(store_url, "DELETE FROM graphflow_steps WHERE run_id = 'run' AND seq = :s", s=gone)
    error = await _refused(store_url, f"run run: step {gone} is missing (steps 1..{head} expected)")
    assert (error.table, error.step) == ("graphflow_steps", gone)


async def test_a_deleted_head_step_row_is_refused_on_resume_and_found_by_verify(store_url: str) -> None:
    await _failed_run(store_url)
    head, _ = _head(store_url)
    _sql(store_url, "DELETE FROM graphflow_steps WHERE run_id = 'run' AND seq = :s", s=head)
    await _refused(store_url, f"run run: step {head} is missing (steps 1..{head} expected)")


async def test_a_deleted_message_row_is_refused_on_resume_and_found_by_verify(store_url: str) -> None:
    await _failed_run(store_url)
    _, count = _head(store_url)
    [(seq,)] = _sql(
        store_url, "SELECT seq FROM graphflow_messages WHERE step_seq = :s", s=_step_of(store_url, "B")
    )
    _sql(store_url, "DELETE FROM graphflow_messages WHERE run_id = 'run' AND seq = :s", s=seq)
    error = await _refused(store_url, f"run run: message {seq} is missing (messages 0..{count - 1} expected)")
    assert (error.table, error.seq) == ("graphflow_messages", seq)


async def test_a_deleted_last_message_row_is_refused_on_resume_and_found_by_verify(store_url: str) -> None:
    await _failed_run(store_url)
    _, count = _head(store_url)
    _sql(store_url, "DELETE FROM graphflow_messages WHERE run_id = 'run' AND seq = :s", s=count - 1)
    await _refused(store_url, f"run run: message {count - 1} is missing (messages 0..{count - 1} expected)")


async def test_a_head_moved_back_on_the_run_row_is_refused_on_resume_and_found_by_verify(
    store_url: str,
) -> None:
    await _failed_run(store_url)
    head, _ = _head(store_url)
    _sql(store_url, "UPDATE graphflow_runs SET head_seq = :h WHERE run_id = 'run'", h=head - 2)
    error = await _refused(
        store_url, f"run run: steps {head - 1}..{head} are stored beyond the run's head step {head - 2}"
    )
    assert (error.table, error.step) == ("graphflow_steps", head - 1)


async def test_a_message_count_moved_back_on_the_run_row_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    _, count = _head(store_url)
    _sql(store_url, "UPDATE graphflow_runs SET message_count = :c WHERE run_id = 'run'", c=count - 1)
    await _refused(
        store_url, f"run run: message {count - 1} is stored beyond the run's message count {count - 1}"
    )


def test_each_gap_is_named_once_with_its_range() -> None:
    steps = [d.describe() for d in step_gaps("r", 6, [1, 2, 5, 8, 9])]
    assert steps == [
        "run r: steps 3..4 are missing (steps 1..6 expected)",
        "run r: step 6 is missing (steps 1..6 expected)",
        "run r: steps 8..9 are stored beyond the run's head step 6 (its head_seq was moved back)",
    ]
    found = message_gaps("r", 6, [(0, 1), (2, 3), (3, 3), (7, 4)])
    assert [(d.describe(), d.step, d.seq) for d in found] == [
        ("run r: message 1 is missing (messages 0..5 expected)", 3, 1),
        ("run r: messages 4..5 are missing (messages 0..5 expected)", 3, 4),
        (
            "run r: message 7 is stored beyond the run's message count 6 (its message_count was moved back)",
            4,
            7,
        ),
    ]
    assert message_gaps("r", None, [(0, 1), (2, 2)])[0].describe() == (
        "run r: message 1 is missing (messages 0..2 expected)"
    )
    assert step_gaps("r", 0, []) == [] and message_gaps("r", 0, []) == []
