"""A database that belongs to something else: a database holding other tables and
no store is refused before any DDL, naming the tables, unless the store is told to share it."""

from __future__ import annotations

import hashlib
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


# --- tables with the store's names that the store did not create ---------------------------------


def add_table_named_like_ours(engine: sa.Engine) -> None:
    """Another application's table that happens to be called graphflow_runs (other columns)."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE graphflow_runs (id INTEGER PRIMARY KEY, title TEXT)"))
        conn.execute(sa.text("INSERT INTO graphflow_runs (id, title) VALUES (1, 'theirs')"))


def columns(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return sorted(column["name"] for column in sa.inspect(conn).get_columns(table))


def file_state(path: Path) -> tuple[str, list[str], int]:
    """The file's SHA-256, the names of the files beside it, and the modification time of their
    directory, which any file created there since (a -wal or -shm file, even removed again) moves."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, sorted(p.name for p in path.parent.iterdir()), path.parent.stat().st_mtime_ns


@pytest.mark.parametrize("shared", [False, True])
def test_a_sqlite_file_with_its_own_graphflow_runs_table_is_refused_and_left_byte_for_byte_unchanged(
    tmp_path: Path, shared: bool
) -> None:
    path = tmp_path / "app.db"
    add_table_named_like_ours(engine := sa.create_engine(f"sqlite:///{path}"))
    engine.dispose()
    before = file_state(path)
    with pytest.raises(StoreError) as info:
        Store(f"sqlite:///{path}", shared=shared)  # shared allows other tables, not a foreign one of ours
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and "graphflow_runs" in message and "graphflow_schema_version" in message
    assert "nothing was changed" in message and "a database of its own" in message
    assert isinstance(info.value, StoreConfigError) and info.value.option is None
    assert file_state(path) == before == (before[0], ["app.db"], before[2])  # no -wal or -shm, ever
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


def test_a_foreign_graphflow_runs_table_is_refused_on_both_backends_and_nothing_is_created(
    store_url: str, raw: sa.Engine
) -> None:
    add_table_named_like_ours(raw)
    with pytest.raises(StoreConfigError, match="graphflow_runs"):
        Store(store_url)
    assert tables(raw) == ["graphflow_runs"]
    assert columns(raw, "graphflow_runs") == ["id", "title"]
    with raw.connect() as conn:
        assert conn.execute(sa.text("SELECT title FROM graphflow_runs")).scalars().all() == ["theirs"]


def test_the_refusal_of_a_foreign_graphflow_runs_table_hides_the_postgresql_password(
    postgres_database: str,
) -> None:
    engine = sa.create_engine(postgres_database)
    try:
        add_table_named_like_ours(engine)
    finally:
        engine.dispose()
    url = sa.make_url(postgres_database).set(password="s3cr3t-pw").render_as_string(hide_password=False)
    with pytest.raises(StoreConfigError, match="graphflow_runs") as info:  # the test server trusts
        Store(url)
    assert "s3cr3t-pw" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize(
    ("ddl", "insert"),
    [
        ("CREATE TABLE graphflow_schema_version (version INTEGER, note TEXT)", None),
        (
            "CREATE TABLE graphflow_schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL)",
            "INSERT INTO graphflow_schema_version VALUES (1, 'their first release', 0)",
        ),
        (
            "CREATE TABLE graphflow_schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL)",
            None,
        ),
    ],
    ids=["other-columns", "rows-not-ours", "no-rows"],
)
def test_a_schema_version_table_the_store_did_not_write_is_refused_and_nothing_is_created(
    store_url: str, raw: sa.Engine, ddl: str, insert: str | None
) -> None:
    add_table_named_like_ours(raw)
    with raw.begin() as conn:
        conn.execute(sa.text(ddl))
        if insert:
            conn.execute(sa.text(insert))
    with pytest.raises(StoreConfigError, match="graphflow_schema_version") as info:
        Store(store_url)
    assert "not written by graphflow-durable" in str(info.value)
    assert tables(raw) == ["graphflow_runs", "graphflow_schema_version"]
    assert columns(raw, "graphflow_runs") == ["id", "title"]


def test_a_foreign_graphflow_runs_table_is_refused_again_under_the_migration_lock(
    store_url: str, raw: sa.Engine
) -> None:
    """The unlocked look saw an empty database (read elsewhere); the locked one still refuses."""
    add_table_named_like_ours(raw)
    engines = open_engines(store_url)
    empty = sa.create_engine("sqlite://")
    try:
        with pytest.raises(StoreConfigError, match="graphflow_runs"):
            _migrations.migrate(engines.write, read=empty, url=engines.url, shared=True)
    finally:
        empty.dispose()
        engines.engine.dispose()
    assert tables(raw) == ["graphflow_runs"]
    assert columns(raw, "graphflow_runs") == ["id", "title"]


@pytest.mark.parametrize("content", ["empty file", "database without tables"])
def test_an_empty_sqlite_file_becomes_a_store(tmp_path: Path, content: str) -> None:
    path = tmp_path / "new.db"
    path.touch()
    if content == "database without tables":
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 0")
        conn.execute("VACUUM")  # writes the header: a valid database of one page, no table
        conn.close()
    with Store(f"sqlite:///{path}") as store:
        assert commit_text(store, "run-1", 0, start(store), 0, text="kept") == 1
    with Store(f"sqlite:///{path}") as store:  # ours, reopened
        assert [m.body["content"] for m in store.load("run-1").messages] == ["kept"]


def test_a_store_with_no_runs_reopens(store_url: str) -> None:
    Store(store_url).close()
    with Store(store_url) as store:
        assert store.list_runs() == [] and store.schema_version() == _migrations.HEAD
