"""A database that belongs to something else (issue 12, item 10): a database holding other tables and
no store is refused before any DDL, naming the tables, unless the store is told to share it."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable._storage import migrations as _migrations
from graphflow_durable._storage.engine import open_engines
from graphflow_durable._storage.urls import parse_store_url
from graphflow_durable.cli.runs import EXIT_USAGE, main
from graphflow_durable.errors import StoreConfigError, StoreError
from graphflow_durable.store import Store

from .test_store import commit_text, start


def with_query(url: str, **options: str) -> str:
    return sa.make_url(url).update_query_dict(options).render_as_string(hide_password=False)


@pytest.fixture
def raw(store_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(store_url)
    yield engine
    engine.dispose()


def tables(engine: sa.Engine) -> list[str]:
    """Every table and view in the database (PostgreSQL: in the schema on the search path)."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        return sorted([*inspector.get_table_names(), *inspector.get_view_names()])


def add_application_table(engine: sa.Engine, name: str = "customers") -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, email TEXT)"))
        conn.execute(sa.text(f"INSERT INTO {name} (id, email) VALUES (1, 'a@example.com')"))


def test_a_database_with_an_application_table_is_refused_naming_it_and_nothing_is_created(
    store_url: str, raw: sa.Engine
) -> None:
    add_application_table(raw)
    with pytest.raises(StoreConfigError) as info:
        Store(store_url)
    message = str(info.value)
    assert "\n" not in message
    assert "customers" in message and "shared=true" in message and "of its own" in message
    assert message.startswith("database ") and "nothing was created" in message
    assert info.value.option == "shared" and isinstance(info.value, ValueError)
    assert isinstance(info.value, StoreError)
    assert tables(raw) == ["customers"]


def test_the_refusal_hides_the_password_and_lists_a_few_of_many_tables(postgres_database: str) -> None:
    engine = sa.create_engine(postgres_database)
    try:
        for number in range(8):
            add_application_table(engine, f"app_{number}")
    finally:
        engine.dispose()
    url = sa.make_url(postgres_database).set(password="s3cr3t-pw").render_as_string(hide_password=False)
    with pytest.raises(StoreError) as info:  # the password is wrong or unused: either way not shown
        Store(url)
    assert "s3cr3t-pw" not in str(info.value)
    with pytest.raises(StoreConfigError) as refused:
        Store(postgres_database)
    message = str(refused.value)
    assert "app_0, app_1, app_2, app_3, app_4 and 3 more" in message
    assert "a database or schema of its own" in message


def test_a_refused_sqlite_file_keeps_its_journal_mode_and_gets_no_wal_files(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreConfigError, match="customers"):
        Store(f"sqlite:///{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    assert path.read_bytes() == before
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


def test_a_postgresql_table_outside_the_search_path_is_not_foreign_but_one_on_it_is(
    postgres_database: str, postgres_admin: sa.Engine
) -> None:
    other = f"other_{uuid.uuid4().hex[:8]}"
    with postgres_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{other}"')
        conn.exec_driver_sql(f'CREATE TABLE "{other}".elsewhere (id INTEGER)')
    engine = sa.create_engine(postgres_database)
    try:
        add_application_table(engine)
        with pytest.raises(StoreConfigError) as info:
            Store(postgres_database)
        assert "customers" in str(info.value) and "elsewhere" not in str(info.value)
        assert tables(engine) == ["customers"]
    finally:
        engine.dispose()
        with postgres_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{other}" CASCADE')


@pytest.mark.parametrize("how", ["url", "argument"])
def test_shared_true_opens_a_database_with_application_tables_and_works(
    store_url: str, raw: sa.Engine, how: str
) -> None:
    add_application_table(raw)
    opened = Store(with_query(store_url, shared="true")) if how == "url" else Store(store_url, shared=True)
    with opened as store:
        assert "shared=true" in store.config_url
        assert commit_text(store, "run-1", 0, start(store), 0, text="kept") == 1
        log = store.load("run-1")
        assert [m.body["content"] for m in log.messages] == ["kept"]
    names = tables(raw)
    assert "customers" in names and "graphflow_runs" in names
    with raw.connect() as conn:
        assert conn.execute(sa.text("SELECT email FROM customers")).scalars().all() == ["a@example.com"]
    with Store(store_url) as again:  # now it holds a store: it opens without shared
        assert [r.run_id for r in again.list_runs()] == ["run-1"]


def test_an_existing_store_that_later_gained_an_application_table_still_opens(
    store_url: str, raw: sa.Engine
) -> None:
    with Store(store_url) as store:
        commit_text(store, "run-1", 0, start(store), 0)
    add_application_table(raw)
    with Store(store_url) as store:
        assert [r.run_id for r in store.list_runs()] == ["run-1"]


def test_the_check_is_repeated_under_the_migration_lock(store_url: str, raw: sa.Engine) -> None:
    """The unlocked look saw an empty database (read elsewhere); the locked one still refuses."""
    add_application_table(raw)
    engines = open_engines(store_url)
    empty = sa.create_engine("sqlite://")
    try:
        with pytest.raises(StoreConfigError, match="customers"):
            _migrations.migrate(engines.write, read=empty, url=engines.url)
    finally:
        empty.dispose()
        engines.engine.dispose()
    assert tables(raw) == ["customers"]


def test_concurrent_openers_of_an_application_database_are_all_refused(
    store_url: str, raw: sa.Engine
) -> None:
    add_application_table(raw)
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            Store(store_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 6 and all(isinstance(e, StoreConfigError) for e in errors)
    assert tables(raw) == ["customers"]


def test_shared_is_parsed_like_the_other_options() -> None:
    assert parse_store_url("sqlite:///a.db?shared=yes").shared is True
    assert parse_store_url("sqlite:///a.db?shared=false").config_url == "sqlite:///a.db"
    assert parse_store_url("sqlite:///a.db", shared=True).config_url == "sqlite:///a.db?shared=true"
    pg = parse_store_url("postgresql://app@db/agents?shared=on&connect_timeout=5")
    assert pg.shared is True and pg.config_url == "postgresql://app@db/agents?connect_timeout=5&shared=true"
    assert "shared" not in pg.engine_url.query
    with pytest.raises(StoreConfigError, match="shared='maybe' is not true or false"):
        parse_store_url("sqlite:///a.db?shared=maybe")
    with pytest.raises(StoreConfigError, match="shared is given twice with different values"):
        parse_store_url("sqlite:///a.db?shared=true", shared=False)


def test_the_cli_refuses_an_application_database_in_one_line_with_exit_code_2(
    store_url: str, raw: sa.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    add_application_table(raw)
    assert (
        main(["submit", "--store", store_url, "r-1", "go"]) == EXIT_USAGE
    )  # a command that creates the store
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("graphflow-durable: database ") and "customers" in err and "shared=true" in err
    assert tables(raw) == ["customers"]
