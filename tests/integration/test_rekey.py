"""``runs rekey`` re-seals a store's rows under another key, or (``--encrypt``) seals a plain store
in place, leaving no plaintext in a SQLite file's free pages; ``runs verify --decrypt`` opens every
sealed row and names one that was moved; a plain ``runs verify`` needs no key and counts the plain
rows a sealed store still holds."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable._storage.checksum import message_sum
from graphflow_durable.cli.runs import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, main
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import team

K1, K2 = os.urandom(32), os.urandom(32)
SECRET = "the secret task"


def env(**keys: bytes) -> str:
    return ",".join(f"{key_id}={base64.b64encode(material).decode()}" for key_id, material in keys.items())


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def fill(store: Store, runs: int = 2, pending: int = 1) -> None:
    """``runs`` finished runs (r0, r1...) and ``pending`` submissions nobody claimed (p0...)."""
    os.environ["GFD_AGENT_DELAY"] = "0"
    for i in range(runs):
        store.queue.submit(f"r{i}", task=f"{SECRET} {i}", team="t")
    asyncio.run(Worker(store, {"t": team}, poll_interval=0.01).run_until_idle())
    for i in range(pending):
        store.queue.submit(f"p{i}", task=f"{SECRET} pending {i}", team="nobody")


def transcripts(store: Store, runs: int = 2) -> list[list[str]]:
    return [[str(m.body.get("content")) for m in store.transcript(f"r{i}")] for i in range(runs)]


def test_rekey_encrypt_seals_every_plain_row_and_the_runs_read_back_the_same(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(store_url) as store:
        fill(store)
        before = transcripts(store)
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", env(k1=K1))
    code, out, err = _run(capsys, "runs", "rekey", "--encrypt", "--store", store_url)
    assert code == EXIT_OK, err
    messages = sum(len(t) for t in before)
    assert f"graphflow_messages: {messages} re-sealed" in out.splitlines()
    assert "graphflow_queue: 3 re-sealed" in out.splitlines()
    assert "re-sealed under key 'k1'; the database file was vacuumed" in out or "postgresql" in store_url
    with Store(store_url, codec=AESGCMCodec({"k1": K1})) as store:  # no allow_plaintext: all sealed
        audit = store.audit_sealing(open_values=True)
        assert (audit.plain, audit.unopened, audit.keys) == ({}, [], {"k1": audit.opened})
        assert transcripts(store) == before
        assert store.verify().damaged == ()
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS")
    code, out, err = _run(capsys, "runs", "verify", "--store", store_url)  # checksums, no key
    assert (code, out) == (EXIT_OK, ""), err
    assert "plain" not in err


def test_rekey_encrypt_leaves_no_plaintext_in_the_sqlite_file_or_its_wal(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with Store(sqlite_url) as store:
        fill(store, runs=3)
    with sa.create_engine(sqlite_url).connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    assert SECRET.encode() in path.read_bytes()
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", env(k1=K1))
    code, out, err = _run(capsys, "runs", "rekey", "--encrypt", "--store", sqlite_url)
    assert code == EXIT_OK, err
    assert "vacuumed" in out
    for file in path.parent.iterdir():  # the main file, its WAL and shared memory, if any
        assert SECRET.encode() not in file.read_bytes(), file.name
        assert b"P1 turn" not in file.read_bytes(), file.name


def test_rekey_to_a_new_key_reseals_every_row_so_the_old_key_can_go(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(store_url, codec=AESGCMCodec({"k1": K1})) as store:
        fill(store)
        before = transcripts(store)
        sealed = store.audit_sealing().sealed_total
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", env(k1=K1, k2=K2))
    monkeypatch.setenv("GRAPHFLOW_DURABLE_ACTIVE_KEY", "k1")
    code, out, err = _run(capsys, "runs", "rekey", "--to", "k2", "--json", "--store", store_url)
    assert code == EXIT_OK, err
    done = json.loads(out)
    assert (done["key"], done["left"], done["vacuumed"]) == ("k2", 0, False)
    assert done["resealed"]["graphflow_messages"] == sum(len(t) for t in before)
    assert done["resealed"]["graphflow_agent_states"] > 0 and done["total"] == sum(done["resealed"].values())
    with Store(store_url, codec=AESGCMCodec({"k2": K2})) as store:  # k1 is gone
        audit = store.audit_sealing(open_values=True)
        assert (audit.keys, audit.unopened, audit.plain) == ({"k2": sealed}, [], {})
        assert transcripts(store) == before
        assert store.verify().damaged == ()
    code, out, err = _run(capsys, "runs", "rekey", "--to", "k2", "--json", "--store", store_url)
    assert (code, json.loads(out)["total"]) == (EXIT_OK, 0)  # nothing left to do


def test_rekey_encrypt_without_keys_is_refused(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(sqlite_url) as store:
        fill(store, runs=1, pending=0)
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    code, out, err = _run(capsys, "runs", "rekey", "--encrypt", "--store", sqlite_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert "GRAPHFLOW_DURABLE_KEYS" in err and err.count("\n") == 1
    with Store(sqlite_url) as store:
        assert store.audit_sealing().sealed == {}


def test_verify_decrypt_names_a_ciphertext_moved_to_another_row_and_exits_4(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(store_url, codec=AESGCMCodec({"k1": K1})) as store:
        fill(store, runs=1, pending=0)
    # Someone who can write the database swaps two sealed bodies and fixes their checksums.
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT seq, step_seq, published, body FROM graphflow_messages WHERE run_id='r0' AND seq IN (1, 2) ORDER BY seq"
            )
        ).all()
        for (seq, step_seq, published, _), (_, _, _, body) in zip(rows, reversed(rows), strict=True):
            conn.execute(
                sa.text("UPDATE graphflow_messages SET body=:b, checksum=:c WHERE run_id='r0' AND seq=:s"),
                {"b": body, "c": message_sum("r0", seq, step_seq, published, body), "s": seq},
            )
    engine.dispose()
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    code, out, err = _run(capsys, "runs", "verify", "--store", store_url)  # checksums hold
    assert (code, out) == (EXIT_OK, ""), err
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", env(k1=K1))
    code, out, err = _run(capsys, "runs", "verify", "--decrypt", "--store", store_url)
    assert code == EXIT_DAMAGED, err
    lines = out.splitlines()
    assert len(lines) == 2
    for line, seq in zip(lines, (1, 2), strict=True):
        assert "graphflow_messages" in line and "'r0'" in line and f"seq {seq}" in line
    code, out, err = _run(capsys, "runs", "verify", "--decrypt", "--json", "--store", store_url)
    assert code == EXIT_DAMAGED
    assert [(r["table"], r["run_id"], r["position"]) for r in map(json.loads, out.splitlines())] == [
        ("graphflow_messages", "r0", 1),
        ("graphflow_messages", "r0", 2),
    ]


def test_verify_without_keys_counts_the_plain_rows_left_in_a_sealed_store(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(store_url) as store:
        fill(store, runs=2, pending=0)
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", env(k1=K1))
    code, out, err = _run(capsys, "runs", "rekey", "r0", "--encrypt", "--store", store_url)  # r1 stays plain
    assert code == EXIT_OK, err
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS")
    code, out, err = _run(capsys, "runs", "verify", "--store", store_url)
    assert (code, out) == (EXIT_OK, ""), err
    assert "content values are plain in a sealed store" in err and "runs rekey --encrypt" in err
    with Store(store_url, codec=AESGCMCodec({"k1": K1}), allow_plaintext=True) as store:
        assert {a.run_id for a in [store.get_run("r0"), store.get_run("r1")] if a} == {"r0", "r1"}
        assert store.audit_sealing(["r0"]).plain == {}
        assert store.audit_sealing(["r1"]).sealed == {}
