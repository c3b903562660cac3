"""Commands that only read (or change existing runs) never create a store: a mistyped ``--store``
is refused on one line, exit 2, and nothing is created; ``Store(url, create=False)`` is the option
they open with. ``submit`` and ``import`` still create the store they write into."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE, main
from graphflow_durable.errors import StoreConfigError
from graphflow_durable.flow import DEFAULT_STORE_ENV
from graphflow_durable.store import Store

#: Every command that needs an existing store, with its arguments.
NEEDS_A_STORE = [
    ["list"],
    ["show", "X"],
    ["history", "X"],
    ["transcript", "X"],
    ["export", "X"],
    ["verify"],
    ["stats"],
    ["respond", "X", "yes"],
    ["cancel", "X"],
    ["retry", "X"],
    ["delete", "X"],
    ["fork", "X", "--at", "1"],
    ["prune", "--older-than", "1d"],
]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("command", NEEDS_A_STORE, ids=lambda args: args[0])
def test_a_command_on_a_store_path_that_does_not_exist_refuses_it_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    typo = tmp_path / "typo.db"
    code, out, err = _run(capsys, "runs", *command, "--store", f"sqlite:///{typo}")
    assert (code, out) == (EXIT_USAGE, "")
    assert err == (
        f"graphflow-durable: no store at sqlite:///{typo} (the file does not exist); nothing was created; "
        "check --store\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_default_store_that_does_not_exist_is_refused_without_creating_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DEFAULT_STORE_ENV, raising=False)
    code, _, err = _run(capsys, "runs", "list")
    assert code == EXIT_USAGE and err.count("\n") == 1
    assert f"no store at sqlite:///{tmp_path}/.graphflow_durable/runs.db (the file does not exist)" in err
    assert f"give --store or set {DEFAULT_STORE_ENV}" in err
    typo = tmp_path / "elsewhere.db"
    monkeypatch.setenv(DEFAULT_STORE_ENV, f"sqlite:///{typo}")
    code, _, err = _run(capsys, "runs", "stats")
    assert code == EXIT_USAGE and err.endswith(f"; check {DEFAULT_STORE_ENV}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_holds_no_store_is_refused_and_left_byte_for_byte_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    other = tmp_path / "other.db"
    engine = sa.create_engine(f"sqlite:///{other}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"))
    engine.dispose()
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    for path in (empty, other):
        code, _, err = _run(capsys, "runs", "list", "--store", f"sqlite:///{path}")
        assert code == EXIT_USAGE
        assert f"no store at sqlite:///{path} (the file holds no graphflow-durable store)" in err
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


async def test_submit_and_import_still_create_the_store_they_write_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite:///{tmp_path / 'source.db'}"
    assert _run(capsys, "submit", "--store", source, "r-1", "go")[0] == EXIT_OK
    a, b = Scripted("A", calls=[]), Scripted("B", calls=[])
    await durable([a, b], chain(a, b), source, "r-2").run(task="go")  # an export the import accepts
    close_stores()
    code, exported, _ = _run(capsys, "runs", "export", "--store", source, "r-2")
    assert code == EXIT_OK
    document = tmp_path / "r-2.json"
    document.write_text(exported, encoding="utf-8")
    target = tmp_path / "target.db"
    assert _run(capsys, "runs", "import", "--store", f"sqlite:///{target}", str(document))[0] == EXIT_OK
    with Store(f"sqlite:///{target}", create=False) as store:
        assert [run.run_id for run in store.list_runs()] == ["r-2"]


@pytest.mark.postgres
def test_a_postgresql_database_without_the_store_tables_is_no_store_and_gets_no_table(
    postgres_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "runs", "show", "X", "--store", postgres_database)
    assert (code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1 and "no store at postgresql" in err
    assert "(the database holds no graphflow-durable store); nothing was created; check --store" in err
    engine = sa.create_engine(postgres_database.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            assert sa.inspect(conn).get_table_names() == []
    finally:
        engine.dispose()
    with Store(postgres_database):
        pass  # now it holds a store
    assert _run(capsys, "runs", "list", "--store", postgres_database)[0] == EXIT_OK


def test_store_create_false_opens_an_existing_store_and_refuses_a_missing_one(store_url: str) -> None:
    with pytest.raises(StoreConfigError, match=r"^no store at .*; nothing was created$") as caught:
        Store(store_url, create=False)
    assert caught.value.option == "create"
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("r", graph_fingerprint="fp", graph={}, owner="w", lease_seconds=60)
        )
    with Store(store_url, create=False) as store:
        assert store.get_run("r") is not None


def test_respond_to_an_unknown_run_says_what_show_says(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(sqlite_url):
        pass
    shown = _run(capsys, "runs", "show", "nope", "--store", sqlite_url)
    answered = _run(capsys, "runs", "respond", "nope", "yes", "--store", sqlite_url)
    assert shown[0] == answered[0] == EXIT_USAGE
    assert answered[2] == shown[2] and "create_run" not in answered[2]
    assert "run nope does not exist" in answered[2] and "'graphflow-durable runs list'" in answered[2]
    assert json.dumps(answered[1]) == '""'
