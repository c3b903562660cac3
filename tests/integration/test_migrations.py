"""Schema migrations on both backends: empty -> head equals the declared schema; newer is refused."""

from __future__ import annotations

import ast
import inspect
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from graphflow_durable._storage import migrations as _migrations
from graphflow_durable._storage import schema as _schema
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable._storage.engine import open_engines
from graphflow_durable.errors import SchemaVersionError, StoreError
from graphflow_durable.store import Store


@pytest.fixture
def raw(store_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(store_url)
    yield engine
    engine.dispose()


def shape(conn: Connection) -> dict[str, tuple[list[str], list[str]]]:
    """{table: (column names, primary key columns)} of the graphflow_ tables."""
    inspector = sa.inspect(conn)
    return {
        name: (
            sorted(column["name"] for column in inspector.get_columns(name)),
            sorted(inspector.get_pk_constraint(name)["constrained_columns"]),
        )
        for name in inspector.get_table_names()
        if name.startswith("graphflow_")
    }


def test_an_empty_database_migrates_to_exactly_the_declared_tables_and_columns(
    store_url: str, raw: sa.Engine
) -> None:
    Store(store_url).close()
    tables = _schema.declared_tables(raw.dialect.name)
    declared = {
        table.name: (sorted(c.name for c in table.columns), sorted(c.name for c in table.primary_key))
        for table in tables
    }
    with raw.connect() as conn:
        assert shape(conn) == declared
        inspector = sa.inspect(conn)
        indexes = {name: {i["name"] for i in inspector.get_indexes(name)} for name in declared}
        foreign = {
            name: sorted(tuple(fk["constrained_columns"]) for fk in inspector.get_foreign_keys(name))
            for name in declared
        }
        if raw.dialect.name == "postgresql":  # its token counter is a sequence, not a table
            assert inspector.get_sequence_names() == [_schema.FENCING_SEQUENCE.name]
    assert indexes["graphflow_runs"] >= {"graphflow_runs_status", "graphflow_runs_parent"}
    assert foreign == {
        table.name: sorted(tuple(c.name for c in fk.columns) for fk in table.foreign_key_constraints)
        for table in tables
    }


def test_the_schema_version_is_head_after_open_and_reopening_changes_nothing(
    store_url: str, raw: sa.Engine
) -> None:
    with Store(store_url) as store:
        assert store.schema_version() == _migrations.HEAD == len(_migrations.MIGRATIONS)
    with Store(store_url) as store:
        assert store.schema_version() == _migrations.HEAD
    with raw.connect() as conn:
        rows = conn.execute(sa.text("SELECT version, description FROM graphflow_schema_version")).all()
    assert [tuple(r) for r in rows] == [(v, d) for v, d, _ in _migrations.MIGRATIONS]


def test_a_database_with_a_newer_schema_is_refused_naming_both_versions(
    store_url: str, raw: sa.Engine
) -> None:
    Store(store_url).close()
    newer = _migrations.HEAD + 41
    with raw.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO graphflow_schema_version (version, description, applied_at) VALUES (:v, 'x', 0)"
            ),
            {"v": newer},
        )
    with pytest.raises(
        SchemaVersionError,
        match=rf"schema version {newer}.*up to {_migrations.HEAD}.*upgrade graphflow-durable",
    ):
        Store(store_url)


def test_a_failing_migration_rolls_back_together_with_its_version_bump(
    store_url: str, raw: sa.Engine
) -> None:
    def good(conn: Connection) -> None:
        conn.execute(sa.text("CREATE TABLE graphflow_probe_a (x INTEGER)"))

    def bad(conn: Connection) -> None:
        conn.execute(sa.text("CREATE TABLE graphflow_probe_b (x INTEGER)"))
        conn.execute(sa.text("SELECT no_such_column FROM graphflow_probe_b"))

    engines = open_engines(store_url)
    try:
        with pytest.raises(sa.exc.SQLAlchemyError):
            _migrations.migrate(
                engines.write, url=engines.url, migrations=((1, "good", good), (2, "bad", bad))
            )
    finally:
        engines.engine.dispose()
    with raw.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        versions = conn.execute(sa.text("SELECT version FROM graphflow_schema_version")).scalars().all()
    assert "graphflow_probe_a" in tables and "graphflow_probe_b" not in tables
    assert versions == [1]


def open_at_once(url: str, count: int) -> list[BaseException]:
    """Open ``count`` stores on ``url`` from as many threads at once; what they raised."""
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            Store(url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_stores_opened_at_once_on_an_empty_database_migrate_it_once(store_url: str, raw: sa.Engine) -> None:
    assert open_at_once(store_url, 4) == []
    with raw.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT COUNT(*) FROM graphflow_schema_version")).scalar_one()
            == _migrations.HEAD
        )


def test_threads_racing_to_open_new_sqlite_files_all_get_a_wal_store(tmp_path: Path) -> None:
    """SQLite answers "database is locked" at once (no busy wait) to the losers of the race to
    switch a new file to WAL; opening retries instead of failing."""
    for round_ in range(25):
        url = f"sqlite:///{tmp_path / f'race{round_}.db'}"
        errors = open_at_once(url, 6)
        assert errors == [], f"round {round_}: {errors[0]!r}"
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        engine.dispose()


def test_migrations_are_numbered_one_to_head_in_order_and_described() -> None:
    versions = [version for version, _, _ in _migrations.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1)) and versions[-1] == _migrations.HEAD
    assert all(description.strip() for _, description, _ in _migrations.MIGRATIONS)


def test_migrations_define_their_own_tables_and_never_use_the_live_schema() -> None:
    tree = ast.parse(inspect.getsource(_migrations))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "_schema" not in imported and not any(m and m.endswith("_schema") for m in imported)


def test_a_store_error_wraps_a_schema_that_was_tampered_with(store_url: str, raw: sa.Engine) -> None:
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("x", graph_fingerprint="f", graph={}, owner="w", lease_seconds=60)
        )
    with raw.begin() as conn:
        conn.execute(sa.text("DROP TABLE graphflow_agent_states"))
    with (
        Store(store_url) as store,
        pytest.raises(StoreError, match=r"loading run x failed on .*graphflow_agent_states"),
    ):
        store.load("x")


#: The last schema version before fencing tokens came from one store-wide counter.
PER_RUN_TOKENS = 9


def test_a_store_with_tokens_gets_a_token_counter_above_every_token_stored(
    store_url: str, raw: sa.Engine
) -> None:
    """A database whose runs and submissions hold tokens (each run counted its own from 1) issues,
    once migrated, only tokens above all of them: also past 2**31, which a 32-bit column cannot hold."""
    engines = open_engines(store_url)
    try:
        older = tuple(m for m in _migrations.MIGRATIONS if m[0] <= PER_RUN_TOKENS)
        _migrations.migrate(engines.write, url=engines.url, migrations=older)
    finally:
        engines.engine.dispose()
    top = 2**31 - 3
    with raw.begin() as conn:
        for run_id, token in (("low", 7), ("high", top)):
            conn.execute(
                sa.text(
                    "INSERT INTO graphflow_runs (run_id, graph_fingerprint, graph, status, head_seq, "
                    "message_count, fencing_token, created_at, updated_at) "
                    "VALUES (:r, 'f', '{}', 'interrupted', 0, 0, :t, 0, 0)"
                ),
                {"r": run_id, "t": token},
            )
        conn.execute(
            sa.text(
                "INSERT INTO graphflow_queue (run_id, status, attempts, claim_token, created_at, updated_at) "
                "VALUES ('sub', 'pending', 0, :t, 0, 0)"
            ),
            {"t": top - 1},
        )
    with Store(store_url) as store:
        assert store.schema_version() == _migrations.HEAD
        created = store._driver.create_run(
            CreateRequest("new", graph_fingerprint="f", graph={}, owner="w", lease_seconds=60)
        )
        tokens = [
            created.fencing_token,
            store._driver.acquire_lease("low", "w", lease_seconds=60),
            store._driver.acquire_lease("high", "w", lease_seconds=60),
            store._driver.acquire_lease("high", "w", lease_seconds=60),
        ]
        assert tokens == [top + 1, top + 2, top + 3, top + 4], tokens
        high = store.get_run("high")
        assert high is not None and high.fencing_token == top + 4 > 2**31


#: The last schema version before a nested run recorded its outer run in ``parent_run_id``.
NESTED_BY_ID = 10


def test_nested_runs_of_an_older_store_get_their_outer_run_as_parent_and_are_deleted_with_it(
    store_url: str, raw: sa.Engine
) -> None:
    """A store made before schema version 11 knew a nested durable team's run by its id alone
    (``OUTER/node/step/team``); the migration records the outer run as its parent, so deleting the
    outer run deletes it; ids that only look alike, or whose outer run is gone, are left alone."""
    engines = open_engines(store_url)
    try:
        older = tuple(m for m in _migrations.MIGRATIONS if m[0] <= NESTED_BY_ID)
        _migrations.migrate(engines.write, url=engines.url, migrations=older)
    finally:
        engines.engine.dispose()
    parents = {
        "outer": None,
        "outer/A/2/inner": None,  # a nested team's run
        "outer/A/2/inner/B/3/deeper": None,  # nested in it
        "fork": "outer",  # recorded already (a fork of outer): kept
        "outer/notnested": None,
        "outer/A/x/inner": None,  # no step number
        "gone/A/2/inner": None,  # its outer run was deleted
    }
    with raw.begin() as conn:
        for token, (run_id, parent) in enumerate(parents.items(), start=1):
            conn.execute(
                sa.text(
                    "INSERT INTO graphflow_runs (run_id, graph_fingerprint, graph, status, head_seq, "
                    "message_count, fencing_token, parent_run_id, created_at, updated_at) "
                    "VALUES (:r, 'f', '{}', 'finished', 0, 0, :t, :p, 0, 0)"
                ),
                {"r": run_id, "t": token, "p": parent},
            )
    with Store(store_url) as store:
        assert store.schema_version() == _migrations.HEAD
        found = {run.run_id: run.parent_run_id for run in store.list_runs()}
        assert found == {
            **parents,
            "outer/A/2/inner": "outer",
            "outer/A/2/inner/B/3/deeper": "outer/A/2/inner",
        }
        removed = store.delete_run("outer")
        assert set(removed.run_ids) == {"outer", "outer/A/2/inner", "outer/A/2/inner/B/3/deeper", "fork"}
        assert sorted(run.run_id for run in store.list_runs()) == [
            "gone/A/2/inner",
            "outer/A/x/inner",
            "outer/notnested",
        ]
