"""A sealed store read without its keys, on SQLite and PostgreSQL: the runs are listed and shown
(ids, statuses, leases, queues are plain), their task and result read as a marker naming the key
(never the ciphertext), while nothing drives, answers or reads the content of a run without them;
a wrong key or a damaged value still fails."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import sqlalchemy as sa

from agents import Scripted, chain
from graphflow_durable import DurableGraphFlow, SealedValue, Store
from graphflow_durable.errors import StoreConfigError, StoreCorruptError
from integration.test_cli_manage import cli
from integration.test_encryption_at_rest import OTHER, codec, two_runs

MARKER = SealedValue("k1")


def test_a_keyless_store_lists_and_reads_runs_with_the_content_marked(store_url: str) -> None:
    two_runs(store_url).close()
    with Store(store_url) as keyless:
        listed = keyless.list_runs()
        assert [(r.run_id, r.status) for r in listed] == [("r1", "finished"), ("r2", "finished")]
        assert all(r.task == MARKER and r.result == MARKER for r in listed)
        run = keyless.get_run("r1")
        assert run is not None and run.task == MARKER and run.head_seq > 0
        assert str(run.task) == "<sealed with key 'k1'>"
        page = keyless.list_runs_page().runs
        assert sorted(r.run_id for r in page) == ["r1", "r2"]
        assert {r.status for r in page} == {listed[0].status}
        assert all(r.result == MARKER for r in page)
        with pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
            keyless.load("r1")  # content stays refused
        with pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
            keyless.transcript("r1")
    with Store(store_url, codec=codec({"k2": os.urandom(32)}, active="k2")) as other:  # the id unknown
        assert other.get_run("r1").task == MARKER  # type: ignore[union-attr]
    with Store(store_url, codec=codec()) as store:  # with the key: the content itself
        assert store.get_run("r1").task[0]["content"] == "t r1"  # type: ignore[union-attr,index]


def test_a_wrong_key_or_a_damaged_task_still_fails_the_listing(store_url: str) -> None:
    two_runs(store_url).close()
    store = Store(store_url, codec=codec({"k1": OTHER, "k2": os.urandom(32)}, active="k2"))
    with store, pytest.raises(StoreConfigError, match=r"key 'k1' is not the key"):
        store.list_runs()
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:  # r1's task moved into r2: it does not open there
        task = conn.execute(sa.text("SELECT task FROM graphflow_runs WHERE run_id = 'r1'")).scalar_one()
        conn.execute(sa.text("UPDATE graphflow_runs SET task = :t WHERE run_id = 'r2'"), {"t": task})
    engine.dispose()
    with Store(store_url, codec=codec()) as store, pytest.raises(StoreCorruptError, match=r"run 'r2'"):
        store.list_runs()


def test_a_keyless_run_of_a_sealed_run_raises_naming_the_key_and_writes_nothing(store_url: str) -> None:
    two_runs(store_url).close()
    engine = sa.create_engine(store_url)

    def rows() -> list[tuple[object, ...]]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT * FROM graphflow_runs ORDER BY run_id"))]

    before = rows()
    for keyless in (Store(store_url), Store(store_url, codec=codec({"k2": os.urandom(32)}, active="k2"))):
        with keyless:
            a, b = Scripted("A"), Scripted("B")
            team = DurableGraphFlow([a, b], chain(a, b), store=keyless, run_id="r1")
            with pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
                asyncio.run(team.run(task="more"))
            with pytest.raises(StoreConfigError, match=r"sealed with key 'k1'"):
                asyncio.run(DurableGraphFlow([a, b], chain(a, b), store=keyless, run_id="r1").run())
            assert (a.turn, b.turn) == (0, 0)
    assert rows() == before
    engine.dispose()


def test_runs_list_and_show_without_keys_exit_0_with_the_marker_and_no_ciphertext(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    two_runs(store_url).close()
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    code, out, err = cli(capsys, store_url, "list")
    assert code == 0 and not err and "r1" in "\n".join(out) and "r2" in "\n".join(out)
    code, out, err = cli(capsys, store_url, "list", "--json")
    assert code == 0 and not err
    listed = [json.loads(line) for line in out]
    assert {(r["run_id"], r["content"]["sealed"]) for r in listed} == {("r1", "k1"), ("r2", "k1")}
    code, out, err = cli(capsys, store_url, "show", "r1")
    assert code == 0 and not err
    text = "\n".join(out)
    assert "<sealed with key 'k1'>" in text and "status" in text
    code, out, err = cli(capsys, store_url, "show", "r1", "--json")
    assert code == 0 and not err
    shown = json.loads(out[0])
    assert shown["content"] == {"sealed": "k1"} and shown["run_id"] == "r1"
    for command in (["list"], ["list", "--json"], ["show", "r1"], ["show", "r1", "--json"]):
        code, out, err = cli(capsys, store_url, *command)
        assert "gfd1:" not in "\n".join(out + err) and "t r1" not in "\n".join(out)
