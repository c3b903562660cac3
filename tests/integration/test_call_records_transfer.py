"""Recorded calls go with their run: deleted and pruned with it, carried by export/import (an
imported run's in-flight turn finds its records, under a new run id too) and by a fork (the records
of the turns it copies, not those of a turn in flight at the cut), and checked by ``verify`` and by
an import like every other row."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from autogen_agentchat.messages import BaseChatMessage

from agents import Boom, Scripted, chain, close_stores, durable
from graphflow_durable import current_execution
from graphflow_durable.errors import UsageError
from graphflow_durable.store import CallRecord, Store

Doc = dict[str, Any]


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class Recorder:
    """A ``before`` hook: each turn records one model call of its own (its idempotency key), reads
    what its turn had recorded before, and a node of ``crash`` raises after recording."""

    def __init__(self, crash: Sequence[str] = ()) -> None:
        self.store: Store | None = None
        self.crash = set(crash)
        self.found: dict[str, list[CallRecord]] = {}  # per turn key: what the turn found recorded

    async def __call__(self, agent: Scripted, messages: Sequence[BaseChatMessage]) -> None:
        ctx = current_execution()
        assert ctx is not None and self.store is not None
        key = ctx.idempotency_key
        self.found[key] = self.store.calls.for_turn(ctx.run_id, key)
        made = CallRecord(
            run_id=ctx.run_id,
            turn_key=key,
            node=ctx.node,
            step=ctx.step,
            attempt=ctx.attempt,
            kind="model",
            name="scripted-model",
            ident="0",
            fingerprint=f"fp-{ctx.node}",
            outcome="live",
            result=json.dumps({"content": f"{ctx.node} thinks"}),
            prompt_tokens=10,
            completion_tokens=2,
            created_at=time.time(),
        )
        self.store.calls.record(made, fencing_token=None)
        if agent.name in self.crash:
            self.crash.discard(agent.name)
            raise Boom(f"{agent.name} crashed after its call")


def team_of(url: str | Store, run_id: str, recorder: Recorder) -> Any:
    a, b, c = (Scripted(name, before=recorder) for name in "ABC")
    team = durable([a, b, c], chain(a, b, c), url, run_id)
    recorder.store = team.store
    return team


async def crashed_run(store_url: str) -> tuple[Any, Recorder]:
    """Run ``source`` A -> B -> C; C records a call, then raises: the run fails with C in flight
    (steps: created 1, start 2, A 3, B 4, interrupt 5; C's turn dispatched at step 4)."""
    recorder = Recorder(crash=["C"])
    team = team_of(store_url, "source", recorder)
    with pytest.raises(RuntimeError, match="C crashed after its call"):  # as GraphFlow raises it
        await team.run(task="go")
    assert [(r.node, r.turn_key) for r in team.store.calls.list("source")] == [
        ("A", "source/A/2"),
        ("B", "source/B/3"),
        ("C", "source/C/4"),
    ]
    return team, recorder


def keys(store: Store, run_id: str) -> list[tuple[int, str, str]]:
    return [(r.seq, r.node, r.turn_key) for r in store.calls.list(run_id)]


async def test_delete_and_prune_remove_a_runs_call_records(store_url: str) -> None:
    team, _ = await crashed_run(store_url)
    store: Store = team.store
    gone = store.delete_run("source")
    assert gone.rows["graphflow_call_records"] == 3
    assert store.calls.list("source") == []
    again, _ = await crashed_run(store_url)
    pruned = again.store.prune(older_than=0, status=["failed"], dry_run=False)
    assert pruned.run_ids == ("source",) and pruned.rows["graphflow_call_records"] == 3
    assert again.store.calls.list("source") == []


async def test_an_imported_run_carries_its_records_and_its_in_flight_turn_replays_them(
    store_url: str, tmp_path: Path
) -> None:
    team, _ = await crashed_run(store_url)
    document = json.loads(json.dumps(team.store.export_run("source")))  # through a file's text
    assert [c["turn_key"] for c in document["call_records"]] == ["source/A/2", "source/B/3", "source/C/4"]
    target = Store(f"sqlite:///{tmp_path / 'target.db'}")  # another store, another backend
    try:
        target.import_run(document)
        assert target.calls.list("source") == team.store.calls.list("source")
        target.import_run(document, run_id="moved")  # under a new id: its turns' keys name it
        assert keys(target, "moved") == [(1, "A", "moved/A/2"), (2, "B", "moved/B/3"), (3, "C", "moved/C/4")]
        recorder = Recorder()
        resumed = team_of(target, "moved", recorder)
        await resumed.run()
        (c_record,) = recorder.found["moved/C/4"]  # the resumed turn found what it recorded before
        assert (c_record.seq, c_record.node, c_record.attempt) == (3, "C", 1)
    finally:
        target.close()


async def test_an_import_keeps_a_turn_key_brought_from_another_run(store_url: str) -> None:
    team, _ = await crashed_run(store_url)
    document = team.store.export_run("source")
    document["call_records"][2]["turn_key"] = "elsewhere/C/9"  # a turn moved in by load_state()
    document["version"] = 1  # unsigned: the edit is not refused by its checksum
    team.store.import_run(document, run_id="moved")
    assert [k for _, _, k in keys(team.store, "moved")] == ["moved/A/2", "moved/B/3", "elsewhere/C/9"]


def _edit(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "where", "unsigned"),
    [
        (
            _edit(("call_records", 1, "discarded"), True),
            r"call_records\[1\]: does not match its checksum",
            False,
        ),
        (
            _edit(("call_records", 1, "kind"), "shell"),
            r"call_records\[1\]\.kind: is 'shell', not one of",
            True,
        ),
        (_edit(("call_records", 1, "seq"), 1), r"call_records\[1\]\.seq: is 1, not above the record", True),
        (_edit(("call_records", 0, "node"), "Z"), r"call_records\[0\]\.node: 'Z' is not a node", True),
        (_edit(("call_records", 0, "step"), 9), r"call_records\[0\]\.step: is 9, a step the document", True),
        (
            _edit(("call_records", 0, "result"), "{not json"),
            r"call_records\[0\]\.result: is not JSON text",
            True,
        ),
        (_edit(("call_records", 0, "result"), None), r"call_records\[0\]\.result: must be JSON text", True),
        (_edit(("call_records", 2, "prompt_tokens"), -3), r"call_records\[2\]\.prompt_tokens: is -3", True),
        (_edit(("call_records", 2, "discarded"), "no"), r"call_records\[2\]\.discarded: is 'no'", True),
        (_edit(("call_records",), {}), r"call_records: is \{\}, not a JSON array", True),
    ],
)
async def test_an_import_with_a_bad_call_record_is_refused_whole(
    store_url: str, edit: Callable[[Doc], None], where: str, unsigned: bool
) -> None:
    team, _ = await crashed_run(store_url)
    document = copy.deepcopy(team.store.export_run("source"))
    if unsigned:
        document["version"] = 1
    edit(document)
    with pytest.raises(UsageError, match=where + ".*nothing was imported"):
        team.store.import_run(document, run_id="copy")
    assert team.store.get_run("copy") is None and team.store.calls.list("copy") == []


async def test_a_document_without_call_records_imports_with_none(store_url: str) -> None:
    team, _ = await crashed_run(store_url)
    document = team.store.export_run("source")
    del document["call_records"]  # as written before call records existed
    document["version"] = 2
    team.store.import_run(document, run_id="old")
    assert team.store.calls.list("old") == []


async def test_a_fork_carries_the_records_of_the_turns_it_copies_not_of_a_turn_in_flight(
    store_url: str,
) -> None:
    team, _ = await crashed_run(store_url)
    store: Store = team.store
    store.fork("source", 4, new_run_id="fork")  # A and B completed by step 4; C in flight there
    assert keys(store, "fork") == [(1, "A", "fork/A/2"), (2, "B", "fork/B/3")]
    store.fork("source", 3, new_run_id="fork-early")
    assert keys(store, "fork-early") == [(1, "A", "fork-early/A/2")]
    recorder = Recorder()
    await team_of(store, "fork", recorder).run()
    assert recorder.found["fork/C/4"] == []  # C's turn in the fork is its own: it calls out again
    assert keys(store, "source") == [(1, "A", "source/A/2"), (2, "B", "source/B/3"), (3, "C", "source/C/4")]


async def test_verify_reports_a_damaged_call_record(store_url: str) -> None:
    team, _ = await crashed_run(store_url)
    raw = sa.create_engine(store_url)
    try:
        with raw.begin() as conn:
            conn.execute(sa.text("UPDATE graphflow_call_records SET prompt_tokens = 99 WHERE seq = 2"))
    finally:
        raw.dispose()
    found = team.store.verify(["source"])
    assert [d.describe() for d in found.damaged] == [
        "run source: call record 2 (node 'B', step 3) in graphflow_call_records does not match its checksum"
    ]
    assert found.checked >= 3
