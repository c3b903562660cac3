"""A sealed run moves between stores: ``runs export`` writes its rows as stored (no plaintext; a
store holding the keys imports it), ``--decrypt`` writes them plain; ``runs import`` seals with the
target store's codec, for the run's new id when it gets one; a fork of a sealed run is sealed for
the fork's own id."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE, main
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.errors import StoreConfigError, UsageError
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import team

K1, K2 = os.urandom(32), os.urandom(32)
SECRET = "the secret task"


def keyed(*ids: str) -> AESGCMCodec:
    return AESGCMCodec({i: {"k1": K1, "k2": K2}[i] for i in ids})


def one_run(store: Store, run_id: str = "r0") -> None:
    os.environ["GFD_AGENT_DELAY"] = "0"
    store.queue.submit(run_id, task=f"{SECRET} of {run_id}", team="t")
    asyncio.run(Worker(store, {"t": team}, poll_interval=0.01).run_until_idle())


def thread(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(m.body) for m in store.transcript(run_id)]


def all_sealed(store: Store, run_id: str) -> None:
    audit = store.audit_sealing([run_id], open_values=True)
    assert audit.plain == {} and audit.unopened == [] and audit.sealed_total > 0


@pytest.fixture
def other_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'other.db'}"


def test_an_export_of_a_sealed_run_holds_no_plaintext_and_imports_into_a_store_with_the_keys(
    store_url: str, other_url: str
) -> None:
    with Store(store_url, codec=keyed("k1")) as source:
        one_run(source)
        expected = thread(source, "r0")
        document = source.export_run("r0")
    text = json.dumps(document)
    assert document["version"] == 3 and SECRET not in text and "P1 turn" not in text
    with Store(other_url, codec=keyed("k1", "k2")) as target:  # active k2: sealed again under it
        target.import_run(json.loads(text))
        target.import_run(json.loads(text), run_id="moved")  # another id: sealed for it
        for run_id in ("r0", "moved"):
            assert thread(target, run_id) == expected
            all_sealed(target, run_id)
            assert set(target.audit_sealing([run_id]).keys) == {"k2"}
    with Store(other_url.replace("other", "keyless"), create=True) as keyless:
        with pytest.raises(StoreConfigError, match="'k1'"):
            keyless.import_run(json.loads(text))
        assert keyless.get_run("r0") is None


def test_an_edited_sealed_export_is_refused_naming_the_row(store_url: str, other_url: str) -> None:
    with Store(store_url, codec=keyed("k1")) as source:
        one_run(source)
        document = source.export_run("r0")
    swapped = json.loads(json.dumps(document))
    swapped["messages"][1]["body"], swapped["messages"][2]["body"] = (
        document["messages"][2]["body"],
        document["messages"][1]["body"],
    )
    with Store(other_url, codec=keyed("k1")) as target:
        with pytest.raises(UsageError, match=r"messages\[1\]: does not match its checksum"):
            target.import_run(swapped)
        assert target.get_run("r0") is None


def test_export_decrypt_writes_plain_rows_that_import_sealed_into_a_keyed_store(
    store_url: str, other_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(store_url, codec=keyed("k1")) as source:
        one_run(source)
        expected = thread(source, "r0")
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k1={base64.b64encode(K1).decode()}")
    code = main(["runs", "export", "r0", "--decrypt", "--store", store_url])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    document = json.loads(out)
    assert document["version"] == 2 and SECRET in out
    with Store(other_url) as plain:  # no codec: the plain document imports plain
        plain.import_run(document)
        assert plain.audit_sealing(["r0"]).sealed == {}
        assert thread(plain, "r0") == expected
    path = Path(other_url.removeprefix("sqlite:///")).with_name("doc.json")
    path.write_text(out)
    target = other_url.replace("other", "third")
    code = main(["runs", "import", str(path), "--store", target])
    assert code == EXIT_OK, capsys.readouterr().err
    with Store(target, codec=keyed("k1")) as store:
        all_sealed(store, "r0")
        assert thread(store, "r0") == expected
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS")
    code = main(["runs", "export", "r0", "--decrypt", "--store", store_url])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "'k1'" in err


def test_a_fork_of_a_sealed_run_is_sealed_for_the_forks_own_id(store_url: str) -> None:
    with Store(store_url, codec=keyed("k1")) as store:
        one_run(store)
        at = 4
        cut = [dict(m.body) for m in store.cut("r0", at).messages]
        forked = store.fork("r0", at, new_run_id="r0-fork")
        assert forked.parent_run_id == "r0"
        assert [dict(m.body) for m in store.load("r0-fork").messages] == cut
        all_sealed(store, "r0-fork")
        os.environ["GFD_AGENT_DELAY"] = "0"
        asyncio.run(team("r0-fork", store=store).run())  # it resumes, sealed
        assert store.get_run("r0-fork").status == "finished"  # type: ignore[union-attr]
        all_sealed(store, "r0-fork")


@pytest.mark.postgres
def test_a_sealed_export_moves_between_sqlite_and_postgresql_and_stays_sealed(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    other = (
        request.getfixturevalue("sqlite_url")
        if store_url.startswith("postgresql")
        else request.getfixturevalue("postgres_database")
    )
    with Store(store_url, codec=keyed("k1")) as source:
        one_run(source)
        expected = thread(source, "r0")
        document = source.export_run("r0")
    with Store(other, codec=keyed("k1")) as target:
        target.import_run(document, run_id="moved")
        assert thread(target, "moved") == expected
        all_sealed(target, "moved")
        back = target.export_run("moved")
    assert back["version"] == 3 and SECRET not in json.dumps(back)
    with Store(store_url, codec=keyed("k1")) as source:
        source.import_run(back, run_id="returned")
        assert thread(source, "returned") == expected
        all_sealed(source, "returned")
