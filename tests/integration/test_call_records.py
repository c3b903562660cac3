"""Recorded model and tool calls in the store (``store.calls``): numbered per run, read per turn,
discarded from a divergence on, fenced by the driver's lease token, checksummed, summed."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

from graphflow_durable.errors import LeaseLostError, RunNotFoundError, StoreCorruptError, UsageError
from graphflow_durable.store import CallRecord, CallSummary, Store

from .test_store import LEASE, start

KEY = "run-1/A/1"


def call(
    ident: str = "0",
    *,
    kind: str = "model",
    turn_key: str = KEY,
    outcome: str = "live",
    attempt: int = 1,
    tokens: tuple[int, int] | None = (10, 5),
    run_id: str = "run-1",
    **kw: Any,
) -> CallRecord:
    """A call record of node A's turn at step 1 (``kw`` overrides any other field)."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "turn_key": turn_key,
        "node": "A",
        "step": 1,
        "attempt": attempt,
        "kind": kind,
        "name": "gpt-test" if kind == "model" else "lookup",
        "ident": ident,
        "fingerprint": f"fp-{kind}-{ident}",
        "outcome": outcome,
        "result": None if outcome == "replayed" else f'{{"content": "answer {ident}"}}',
        "prompt_tokens": None if tokens is None else tokens[0],
        "completion_tokens": None if tokens is None else tokens[1],
        "created_at": time.time(),
        **kw,
    }
    return CallRecord(**fields)


def count_rows(store_url: str) -> int:
    raw = sa.create_engine(store_url)
    try:
        with raw.connect() as conn:
            return int(conn.execute(sa.text("SELECT COUNT(*) FROM graphflow_call_records")).scalar_one())
    finally:
        raw.dispose()


def test_record_numbers_a_runs_records_1_2_3_in_write_order(store: Store) -> None:
    token = start(store)
    made = [
        store.calls.record(call("0"), fencing_token=token),
        store.calls.record(call("call-1", kind="tool"), fencing_token=token),
        store.calls.record(call("1"), fencing_token=token),
    ]
    assert [r.seq for r in made] == [1, 2, 3]
    assert store.calls.list("run-1") == made
    start(store, "run-2")
    assert store.calls.record(call(run_id="run-2"), fencing_token=None).seq == 1  # per run


def test_for_turn_returns_the_turns_live_records_not_discarded_in_seq_order(store: Store) -> None:
    token = start(store)
    first = store.calls.record(call("0"), fencing_token=token)
    store.calls.record(call("0", turn_key="run-1/B/2", node="B"), fencing_token=token)  # another turn
    tool = store.calls.record(call("call-1", kind="tool", tokens=None), fencing_token=token)
    store.calls.record(call("0", outcome="replayed", attempt=2), fencing_token=token)
    second = store.calls.record(call("1"), fencing_token=token)
    assert store.calls.for_turn("run-1", KEY) == [first, tool, second]
    assert store.calls.for_turn("run-1", "run-1/C/9") == []


def test_discard_from_voids_the_turns_live_records_from_that_seq_on_and_keeps_them(store: Store) -> None:
    token = start(store)
    kept = store.calls.record(call("0"), fencing_token=token)
    other = store.calls.record(call("0", turn_key="run-1/B/2", node="B"), fencing_token=token)
    replayed = store.calls.record(call("0", outcome="replayed", attempt=2), fencing_token=token)
    tool = store.calls.record(call("call-1", kind="tool"), fencing_token=token)
    model = store.calls.record(call("1"), fencing_token=token)
    assert store.calls.discard_from("run-1", KEY, other.seq, fencing_token=token) == 2
    assert store.calls.for_turn("run-1", KEY) == [kept]
    rows = store.calls.list("run-1")
    assert [r.seq for r in rows if r.discarded] == [tool.seq, model.seq]
    assert [r for r in rows if not r.discarded] == [kept, other, replayed]
    assert store.calls.for_turn("run-1", "run-1/B/2") == [other]  # another turn is untouched
    assert store.calls.discard_from("run-1", KEY, 1, fencing_token=token) == 1  # only `kept` was left


def test_a_stale_fencing_token_records_and_discards_nothing(store: Store, store_url: str) -> None:
    old = start(store)
    store.calls.record(call("0"), fencing_token=old)
    new = store._driver.acquire_lease("run-1", "worker-1", lease_seconds=LEASE)  # the old token is fenced
    assert new != old
    with pytest.raises(LeaseLostError, match=f"token is {old} but the run's token is {new}"):
        store.calls.record(call("1"), fencing_token=old)
    with pytest.raises(LeaseLostError):
        store.calls.discard_from("run-1", KEY, 1, fencing_token=old)
    assert count_rows(store_url) == 1
    assert [r.discarded for r in store.calls.list("run-1")] == [False]
    assert store.calls.record(call("1"), fencing_token=new).seq == 2


def test_a_driver_of_a_deleted_and_recreated_run_records_and_discards_nothing(
    store: Store, store_url: str
) -> None:
    old = start(store)
    store.calls.record(call("0"), fencing_token=old)
    store.delete_run("run-1", force=True)
    new = start(store)  # the same run id again: its token is new, never one the old run had
    assert new != old
    with pytest.raises(LeaseLostError):
        store.calls.record(call("1"), fencing_token=old)
    with pytest.raises(LeaseLostError):
        store.calls.discard_from("run-1", KEY, 1, fencing_token=old)
    assert count_rows(store_url) == 0  # the deleted run's record went with it; the stale one never landed
    assert store.calls.record(call("1"), fencing_token=new).seq == 1


def test_a_record_for_an_unknown_run_is_refused(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="run nope does not exist"):
        store.calls.record(call(run_id="nope"), fencing_token=None)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kind": "shell"}, "kind must be one of model, tool, not 'shell'"),
        ({"outcome": "cached"}, "outcome must be one of live, replayed"),
        ({"name": "a\x00b"}, "the name is refused: holds a NUL character"),
        ({"ident": "\udc80"}, "the call ordinal or id is refused"),
        ({"prompt_tokens": -1}, "prompt tokens must be an integer from 0 to 2147483647, not -1"),
        ({"completion_tokens": 2**31}, "completion tokens must be an integer from 0 to 2147483647"),
        ({"attempt": "2"}, "attempt must be an integer from 0"),
        ({"created_at": float("nan")}, "created_at must be epoch seconds, not nan"),
        ({"outcome": "replayed"}, "a replayed one none"),
        ({"result": None}, "a live record holds its result"),
    ],
)
def test_a_record_the_store_cannot_hold_is_refused_naming_the_field(
    store: Store, store_url: str, change: dict[str, Any], words: str
) -> None:
    token = start(store)
    with pytest.raises(UsageError, match=words) as raised:
        store.calls.record(replace(call("0"), **change), fencing_token=token)
    assert "nothing was recorded" in str(raised.value)
    assert count_rows(store_url) == 0


def test_summary_counts_live_and_replayed_calls_and_the_tokens_replays_saved(store: Store) -> None:
    token = start(store)
    assert store.calls.summary("run-1") == CallSummary(0, 0, 0)
    store.calls.record(call("0", tokens=(100, 20)), fencing_token=token)
    store.calls.record(call("call-1", kind="tool", tokens=None), fencing_token=token)
    store.calls.record(call("0", outcome="replayed", attempt=2, tokens=(100, 20)), fencing_token=token)
    store.calls.record(
        call("call-1", kind="tool", outcome="replayed", attempt=2, tokens=None), fencing_token=token
    )
    store.calls.record(call("1", tokens=(7, 3)), fencing_token=token)
    store.calls.discard_from("run-1", KEY, 5, fencing_token=token)  # a discarded call was still paid
    summary = store.calls.summary("run-1")
    assert summary == CallSummary(calls_live=3, calls_replayed=2, tokens_saved=120)
    assert summary.as_dict() == {"calls_live": 3, "calls_replayed": 2, "tokens_saved": 120}


def test_a_record_changed_outside_the_store_is_refused_when_read(store: Store, store_url: str) -> None:
    token = start(store)
    store.calls.record(call("0"), fencing_token=token)
    store.calls.record(call("1"), fencing_token=token)
    store.calls.discard_from("run-1", KEY, 2, fencing_token=token)
    raw = sa.create_engine(store_url)
    try:
        with raw.begin() as conn:  # a discarded record flipped back to live would be replayed
            conn.execute(sa.text("UPDATE graphflow_call_records SET discarded = true WHERE seq = 1"))
            conn.execute(sa.text("UPDATE graphflow_call_records SET discarded = false WHERE seq = 2"))
    finally:
        raw.dispose()
    with pytest.raises(
        StoreCorruptError, match=r"call record 1 \(node 'A', step 1\) in graphflow_call_records"
    ):
        store.calls.for_turn("run-1", KEY)
    with pytest.raises(StoreCorruptError, match="call record 1"):
        store.calls.list("run-1")


@pytest.mark.parametrize("damage", ["discarded = true", "outcome = 'replayed', result = NULL"])
def test_a_turns_records_are_checked_before_any_is_filtered_out(
    store: Store, store_url: str, damage: str
) -> None:
    """A live record flipped to discarded or replayed outside the store is refused when the turn is
    read (or discarded from), not skipped as if it had never been made."""
    token = start(store)
    store.calls.record(call("0"), fencing_token=token)
    store.calls.record(call("call-0", kind="tool"), fencing_token=token)
    raw = sa.create_engine(store_url)
    try:
        with raw.begin() as conn:
            conn.execute(sa.text(f"UPDATE graphflow_call_records SET {damage} WHERE seq = 2"))
    finally:
        raw.dispose()
    with pytest.raises(StoreCorruptError, match="call record 2"):
        store.calls.for_turn("run-1", KEY)
    with pytest.raises(StoreCorruptError, match="call record 2"):
        store.calls.turn("run-1", KEY)
    with pytest.raises(StoreCorruptError, match="call record 2"):
        store.calls.discard_from("run-1", KEY, 1, fencing_token=token)
