"""``graphflow-durable runs history RUN --calls``, and the recorded calls in ``runs show`` and
``runs stats`` (text and ``--json``), on SQLite and PostgreSQL: one row per call record, the sums
``calls_live``, ``calls_replayed``, ``tokens_saved``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agents import Scripted, chain, close_stores, durable
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE
from graphflow_durable.store import CallRecord, Store

from .test_cli_manage import cli, one_line_error


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def record(store: Store, node: str, step: int, attempt: int, kind: str, ident: str, **kw: Any) -> CallRecord:
    """Record a call of run ``r``'s turn of ``node`` dispatched at ``step`` (``kw``: other fields)."""
    fields: dict[str, Any] = {
        "run_id": "r",
        "turn_key": f"r/{node}/{step}",
        "node": node,
        "step": step,
        "attempt": attempt,
        "kind": kind,
        "name": "gpt-test" if kind == "model" else "send_mail",
        "ident": ident,
        "fingerprint": f"fp-{ident}",
        "outcome": "live",
        "result": '{"content": "ok"}',
        "prompt_tokens": None,
        "completion_tokens": None,
        "created_at": time.time(),
        **kw,
    }
    if fields["outcome"] == "replayed":
        fields["result"] = None
    return store.calls.record(CallRecord(**fields), fencing_token=None)


@pytest.fixture
async def recorded(store_url: str) -> Store:
    """Run ``r`` (A -> B, finished; A dispatched at step 2, B at step 3) with five call records: A's
    turn made a model call, a tool call and a second model call a divergence later voided; B's
    turn made a model call on attempt 1 that attempt 2 replayed."""
    a, b = Scripted("A"), Scripted("B")
    team = durable([a, b], chain(a, b), store_url, "r")
    await team.run(task="go")
    store: Store = team.store
    record(store, "A", 2, 1, "model", "0", prompt_tokens=100, completion_tokens=20)
    record(store, "A", 2, 1, "tool", "call_7")
    record(store, "A", 2, 1, "model", "1", prompt_tokens=90, completion_tokens=9)
    store.calls.discard_from("r", "r/A/2", 3, fencing_token=None)
    record(store, "B", 3, 1, "model", "0", prompt_tokens=50, completion_tokens=10)
    record(store, "B", 3, 2, "model", "0", outcome="replayed", prompt_tokens=50, completion_tokens=10)
    return store


async def test_history_calls_lists_one_row_per_record_and_marks_a_discarded_one(
    recorded: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, store_url, "history", "r", "--calls")
    assert (code, err) == (EXIT_OK, [])
    assert out[0].split() == [
        "SEQ",
        "STEP",
        "NODE",
        "TRY",
        "KIND",
        "NAME",
        "IDENT",
        "OUTCOME",
        "PROMPT",
        "COMPL",
        "TIME",
    ]
    rows = [line.split() for line in out[1:]]
    assert [row[:10] for row in rows] == [
        ["1", "2", "A", "1", "model", "gpt-test", "0", "live", "100", "20"],
        ["2", "2", "A", "1", "tool", "send_mail", "call_7", "live", "-", "-"],
        ["3", "2", "A", "1", "model", "gpt-test", "1", "live", "90", "9"],
        ["4", "3", "B", "1", "model", "gpt-test", "0", "live", "50", "10"],
        ["5", "3", "B", "2", "model", "gpt-test", "0", "replayed", "50", "10"],
    ]
    assert [row[11:] for row in rows] == [[], [], ["discarded"], [], []]
    assert all(row[10].startswith("20") and row[10].endswith("+00:00") for row in rows)  # ISO time


async def test_history_calls_json_writes_each_record_without_its_result(
    recorded: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, store_url, "history", "r", "--calls", "--json")
    lines = [json.loads(line) for line in out]
    assert code == EXIT_OK and len(lines) == 5
    assert lines[2] == {
        "run_id": "r",
        "seq": 3,
        "turn_key": "r/A/2",
        "node": "A",
        "step": 2,
        "attempt": 1,
        "kind": "model",
        "name": "gpt-test",
        "ident": "1",
        "ordinal": 1,
        "call_id": None,
        "fingerprint": "fp-1",
        "outcome": "live",
        "discarded": True,
        "prompt_tokens": 90,
        "completion_tokens": 9,
        "time": lines[2]["time"],
    }
    assert isinstance(lines[2]["time"], float)
    assert (lines[1]["ordinal"], lines[1]["call_id"]) == (None, "call_7")
    assert [(line["kind"], line["ident"], line["outcome"]) for line in lines] == [
        ("model", "0", "live"),
        ("tool", "call_7", "live"),
        ("model", "1", "live"),
        ("model", "0", "live"),
        ("model", "0", "replayed"),
    ]


async def test_history_calls_filters_by_node_and_round(
    recorded: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = cli(capsys, store_url, "history", "r", "--calls", "--node", "B", "--json")
    assert [json.loads(line)["seq"] for line in out] == [4, 5]
    _, out, _ = cli(capsys, store_url, "history", "r", "--calls", "--round", "1", "--json")
    assert len(out) == 5
    _, out, _ = cli(capsys, store_url, "history", "r", "--calls", "--round", "2", "--json")
    assert out == []


async def test_history_calls_of_a_run_without_records_prints_the_header_only_and_refuses_an_unknown_run(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a = Scripted("A")
    await durable([a], chain(a), store_url, "plain").run(task="go")
    code, out, _ = cli(capsys, store_url, "history", "plain", "--calls")
    assert code == EXIT_OK and len(out) == 1 and out[0].startswith(" SEQ STEP")
    code, out, err = cli(capsys, store_url, "history", "nope", "--calls")
    assert (code, out) == (EXIT_USAGE, [])
    one_line_error(err, "run nope does not exist", "runs list")


async def test_show_reports_calls_made_and_replayed_and_the_tokens_saved(
    recorded: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, store_url, "show", "r")
    shown = dict((line[:11].strip(), line[12:]) for line in out)
    assert code == EXIT_OK and shown["calls"] == "4 made, 1 replayed (60 tokens saved)"
    code, out, _ = cli(capsys, store_url, "show", "r", "--json")
    found = json.loads(out[0])
    assert (found["calls_live"], found["calls_replayed"], found["tokens_saved"]) == (4, 1, 60)


async def test_stats_reports_the_stores_calls_made_and_replayed_and_the_tokens_saved(
    recorded: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record(recorded, "A", 2, 2, "model", "0", outcome="replayed", prompt_tokens=100, completion_tokens=20)
    code, out, _ = cli(capsys, store_url, "stats")
    assert code == EXIT_OK and out[-1] == "recorded calls: 4 made, 2 replayed (180 tokens saved)"
    assert "graphflow_call_records" in " ".join(out)
    code, out, _ = cli(capsys, store_url, "stats", "--json")
    found = json.loads(out[0])
    assert (found["calls_live"], found["calls_replayed"], found["tokens_saved"]) == (4, 2, 180)
    assert found["rows"]["graphflow_call_records"] == 6
