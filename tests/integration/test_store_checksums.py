"""A row changed in the database (a flipped byte, a row moved) is refused on
resume, naming the run, table, step and row, before any agent runs; ``runs verify`` lists every
damaged row. And ``runs list`` shows a run whose driver died as such."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, fail_once
from graphflow_durable._storage.driver import CommitRequest, CreateRequest
from graphflow_durable.cli.runs import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE
from graphflow_durable.errors import StoreCorruptError
from graphflow_durable.store import Step, Store


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def _failed_run(url: str, run_id: str = "run") -> None:
    """A chain A -> B -> C whose B failed: A's turn (message, state, step) is committed."""
    agents = [Scripted(n, before=fail_once() if n == "B" else None) for n in "ABC"]
    with pytest.raises(RuntimeError, match="B crashed on purpose"):
        await durable(agents, chain(*agents), url, run_id).run(task="go")


async def _resume(url: str, run_id: str = "run") -> list[str]:
    """Resume the run with a new team; the agents that ran."""
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "ABC"]
    await durable(agents, chain(*agents), url, run_id).run()
    return calls


def _sql(url: str, statement: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _flip(text: str, after: str) -> str:
    """``text`` with the case of the first letter after ``after`` flipped: one byte changed."""
    start = text.index(after) + len(after)
    at = next(i for i in range(start, len(text)) if text[i].isascii() and text[i].isalpha())
    return text[:at] + text[at].swapcase() + text[at + 1 :]


def _a_message(url: str) -> tuple[int, int, str]:
    """(seq, step, body) of A's message."""
    rows = _sql(url, "SELECT seq, step_seq, body FROM graphflow_messages WHERE run_id = 'run' ORDER BY seq")
    return next((seq, step, body) for seq, step, body in rows if json.loads(body).get("source") == "A")


def _counts(url: str) -> tuple[int, ...]:
    head = _sql(url, "SELECT head_seq, message_count FROM graphflow_runs WHERE run_id = 'run'")[0]
    tables = ("graphflow_steps", "graphflow_messages", "graphflow_agent_states")
    return (*head, *(_sql(url, f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables))


async def _refused(url: str) -> StoreCorruptError:
    """Resume, expecting StoreCorruptError with nothing run and nothing written; the error."""
    before = _counts(url)
    calls: list[str] = []
    agents = [Scripted(n, calls=calls) for n in "ABC"]
    with pytest.raises(StoreCorruptError) as caught:
        await durable(agents, chain(*agents), url, "run").run()
    assert calls == [], "no agent may run from a damaged log"
    assert _counts(url) == before, "nothing may be written"
    error = caught.value
    assert error.run_id == "run" and "\n" not in str(error)
    assert "runs verify run" in str(error) and "backup" in str(error)
    return error


async def test_a_flipped_byte_in_a_committed_message_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    seq, step, body = _a_message(store_url)
    _sql(
        store_url, "UPDATE graphflow_messages SET body = :b WHERE seq = :s", b=_flip(body, '"content"'), s=seq
    )
    error = await _refused(store_url)
    assert (error.table, error.step, error.seq) == ("graphflow_messages", step, seq)
    assert f"run run: message {seq} (step {step}) in graphflow_messages does not match its checksum" in str(
        error
    )


async def test_a_flipped_byte_in_an_agent_state_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    # A's latest row: a splice of its state's text ({"turn":0} -> {"turn":1}), put "1"
    step, body = _sql(
        store_url, "SELECT step_seq, body FROM graphflow_agent_states WHERE node = 'A' ORDER BY step_seq"
    )[-1]
    assert '"put":["1"]' in body
    _sql(
        store_url,
        "UPDATE graphflow_agent_states SET body = :b WHERE node = 'A' AND step_seq = :s",
        b=body.replace('"put":["1"]', '"put":["3"]'),
        s=step,
    )
    error = await _refused(store_url)
    assert (error.table, error.step, error.node) == ("graphflow_agent_states", step, "A")
    assert f"the state of node 'A' saved at step {step}" in str(error)


async def test_a_flipped_byte_in_the_head_steps_scheduler_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    [(head,)] = _sql(store_url, "SELECT head_seq FROM graphflow_runs")
    [(scheduler,)] = _sql(store_url, "SELECT scheduler FROM graphflow_steps WHERE seq = :s", s=head)
    _sql(
        store_url,
        "UPDATE graphflow_steps SET scheduler = :t WHERE seq = :s",
        t=_flip(scheduler, '"'),
        s=head,
    )
    error = await _refused(store_url)
    assert (error.table, error.step) == ("graphflow_steps", head)
    assert f"step {head} (its scheduler state) in graphflow_steps" in str(error)


async def test_a_changed_step_that_is_not_the_head_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    _, step, _ = _a_message(store_url)
    _sql(store_url, "UPDATE graphflow_steps SET node = 'B' WHERE seq = :s", s=step)  # A's completion, as B's
    error = await _refused(store_url)
    assert (error.table, error.step) == ("graphflow_steps", step)


async def test_a_message_moved_to_another_seq_is_refused_on_resume(store_url: str) -> None:
    await _failed_run(store_url)
    seq, _, _ = _a_message(store_url)
    _sql(store_url, "UPDATE graphflow_messages SET seq = seq + 100 WHERE seq = :s", s=seq)
    error = await _refused(store_url)
    assert (error.table, error.seq) == ("graphflow_messages", seq + 100)


async def test_rows_without_a_checksum_are_not_checked_and_the_run_resumes(store_url: str) -> None:
    """A row written before schema version 6 has a NULL checksum: counted as unchecked."""
    await _failed_run(store_url)
    for table in ("graphflow_steps", "graphflow_messages", "graphflow_agent_states"):
        _sql(store_url, f"UPDATE {table} SET checksum = NULL")
    with Store(store_url) as store:
        found = store.verify()
        assert found.ok and found.checked == 0 and found.unchecked == sum(_counts(store_url)[2:])
    assert await _resume(store_url) == ["B", "C"]


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", *args, "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_runs_verify_lists_exactly_the_damaged_rows_one_line_each(store_url: str) -> None:
    await _failed_run(store_url)
    await _failed_run(store_url, "other")
    with Store(store_url) as store:
        clean = store.verify()
    assert clean.ok and clean.runs == ("run", "other") and clean.checked > 0 and clean.unchecked == 0
    done = _cli(store_url, "verify")
    assert (done.returncode, done.stdout) == (EXIT_OK, "")
    assert "0 damaged" in done.stderr and "Traceback" not in done.stderr

    # damage in run "run" only: two messages swap bodies (each moved to the other's seq), and A's state
    rows = _sql(store_url, "SELECT seq, body FROM graphflow_messages WHERE run_id = 'run' ORDER BY seq")
    (s0, b0), (s1, b1) = rows[0], rows[1]
    steps = dict(_sql(store_url, "SELECT seq, step_seq FROM graphflow_messages WHERE run_id = 'run'"))
    for seq, body in ((s0, b1), (s1, b0)):
        _sql(
            store_url,
            "UPDATE graphflow_messages SET body = :b WHERE run_id = 'run' AND seq = :s",
            b=body,
            s=seq,
        )
    [(state_step,)] = _sql(
        store_url, "SELECT MAX(step_seq) FROM graphflow_agent_states WHERE run_id = 'run' AND node = 'A'"
    )
    _sql(
        store_url,
        "UPDATE graphflow_agent_states SET body = body || ' ' WHERE run_id = 'run' AND node = 'A' "
        "AND step_seq = :s",
        s=state_step,
    )

    done = _cli(store_url, "verify")
    assert done.returncode == EXIT_DAMAGED, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.splitlines() == [
        f"run run: message {s0} (step {steps[s0]}) in graphflow_messages does not match its checksum",
        f"run run: message {s1} (step {steps[s1]}) in graphflow_messages does not match its checksum",
        f"run run: the state of node 'A' saved at step {state_step} in graphflow_agent_states does not "
        "match its checksum",
    ]
    as_json = [json.loads(line) for line in _cli(store_url, "verify", "run", "--json").stdout.splitlines()]
    assert [(d["table"], d["seq"], d["node"]) for d in as_json] == [
        ("graphflow_messages", s0, None),
        ("graphflow_messages", s1, None),
        ("graphflow_agent_states", None, "A"),
    ]
    other = _cli(store_url, "verify", "other")
    assert (other.returncode, other.stdout) == (EXIT_OK, "")
    missing = _cli(store_url, "verify", "nope")
    assert missing.returncode == EXIT_USAGE and missing.stdout == ""
    assert len(missing.stderr.splitlines()) == 1 and "run nope does not exist" in missing.stderr


def test_a_scheduler_that_is_not_the_heads_is_found_by_verify_only(store_url: str) -> None:
    """A resume reads only the head's scheduler; verify reads every step's."""
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("r", graph_fingerprint="f", graph={}, owner="w", lease_seconds=60)
        )
        for head in range(3):
            store._driver.commit(
                CommitRequest(
                    "r",
                    expected_head=head,
                    fencing_token=1,
                    step=Step(kind="complete", node="A", scheduler={"n": head}, data={}),
                )
            )
        _sql(store_url, "UPDATE graphflow_steps SET scheduler = :t WHERE seq = 2", t='{"n":7}')
        store.load("r")  # the head (step 3) is intact
        [damage] = store.verify(["r"]).damaged
        assert (damage.table, damage.step, damage.column) == ("graphflow_steps", 2, "scheduler")
        _sql(store_url, "UPDATE graphflow_steps SET scheduler = :t WHERE seq = 3", t='{"n":7}')
        with pytest.raises(StoreCorruptError, match=r"step 3 \(its scheduler state\) in graphflow_steps"):
            store._driver.head_scheduler("r")


# -- runs list: a run whose driver is gone ------------------------------------------------------

_HOLDER = """
import sys, time
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.store import Step, Store
store = Store(sys.argv[1])
store._driver.create_run(CreateRequest("dead", graph_fingerprint="f", graph={}, owner="doomed", lease_seconds=3600))
print("ready", flush=True)
time.sleep(600)
"""


def test_runs_list_shows_a_run_whose_driver_was_killed_as_owner_gone(store_url: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), store_url], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("alive", graph_fingerprint="f", graph={}, owner="me", lease_seconds=3600)
        )
        store._driver.create_run(
            CreateRequest("late", graph_fingerprint="f", graph={}, owner="slow", lease_seconds=3600)
        )
    _sql(store_url, "UPDATE graphflow_runs SET lease_expires_at = 1000 WHERE run_id = 'late'")

    listed = _cli(store_url, "list", "--json")
    assert listed.returncode == EXIT_OK, listed.stderr
    rows = {row["run_id"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert {k: rows["dead"][k] for k in ("status", "lease_owner", "lease_state", "lease_pid")} == {
        "status": "running",
        "lease_owner": "doomed",
        "lease_state": "owner gone",
        "lease_pid": holder.pid,
    }
    assert rows["alive"]["lease_state"] == "held"  # this test's own process still runs
    assert rows["late"]["lease_state"] == "expired"

    table = {line.split()[0]: line for line in _cli(store_url, "list").stdout.splitlines()[1:]}
    assert "running (owner gone)" in table["dead"] and f"pid {holder.pid}" in table["dead"]
    assert "running (lease expired)" in table["late"]
    assert "running (" not in table["alive"]
