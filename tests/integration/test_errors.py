"""Errors carry their facts as attributes, keep their messages and built-in bases, and fall in exact
categories (a caller's mistake is a UsageError, never a ConflictError or a plain StoreError)."""

from __future__ import annotations

import pickle
import time
import traceback

import pytest
import sqlalchemy as sa

from graphflow_durable import errors
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable._storage.schema import runs
from graphflow_durable.errors import (
    ConflictError,
    GraphflowDurableError,
    GraphMismatchError,
    LeaseLostError,
    RunExistsError,
    RunLockedError,
    RunNotFoundError,
    SchemaVersionError,
    StoreConfigError,
    StoreError,
    UsageError,
)
from graphflow_durable.store import Store

from .test_store import start

RUNS = runs.name


def test_every_error_class_derives_from_the_root_and_keeps_its_message_and_built_in_bases() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, GraphflowDurableError), name
        assert cls.__doc__ and (cls is GraphflowDurableError or "Attributes:" in cls.__doc__), name
    assert issubclass(StoreConfigError, ValueError) and issubclass(StoreConfigError, StoreError)
    assert issubclass(RunNotFoundError, LookupError) and issubclass(RunNotFoundError, StoreError)
    assert issubclass(GraphMismatchError, ValueError) and issubclass(RunExistsError, ValueError)
    for cls in (StoreConfigError, RunNotFoundError, GraphMismatchError, RunExistsError):
        assert issubclass(cls, UsageError) and not issubclass(cls, ConflictError)
    assert issubclass(LeaseLostError, ConflictError) and issubclass(ConflictError, RuntimeError)
    error = LeaseLostError("run r: lost", run_id="r", token=1, current_token=2, owner="w2")
    assert str(error) == "run r: lost"
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.run_id, copy.token, copy.current_token, copy.owner) == (
        "run r: lost",
        "r",
        1,
        2,
        "w2",
    )


def test_every_error_class_is_named_by_the_public_errors_module_in_tracebacks_and_pickles() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert (cls.__module__, cls.__qualname__) == ("graphflow_durable.errors", name)
    error = RunNotFoundError("no run r", run_id="r")
    assert b"graphflow_durable.errors" in pickle.dumps(error)
    assert b"_errors" not in pickle.dumps(error)
    line = traceback.format_exception_only(type(error), error)[-1]
    assert line == "graphflow_durable.errors.RunNotFoundError: no run r\n"


def test_run_locked_names_the_holder_and_its_expiry_as_attributes(store: Store) -> None:
    start(store, owner="worker-1")
    with pytest.raises(RunLockedError) as locked:
        store._driver.acquire_lease("run-1", "worker-2", lease_seconds=30)
    run = store.get_run("run-1")
    assert run is not None
    error = locked.value
    assert (error.run_id, error.owner, error.expires_at) == ("run-1", "worker-1", run.lease_expires_at)
    assert error.pid is not None and error.host is not None


def test_lease_lost_carries_both_tokens_and_the_new_holder(store: Store) -> None:
    store._driver.create_run(
        CreateRequest("run-1", graph_fingerprint="fp", graph={}, owner="worker-1", lease_seconds=0.01)
    )
    time.sleep(0.02)
    store._driver.acquire_lease("run-1", "worker-2", lease_seconds=30)
    with pytest.raises(LeaseLostError) as lost:
        store._driver.renew_lease("run-1", "worker-1", 1, lease_seconds=30)
    error = lost.value
    assert (error.run_id, error.token, error.current_token, error.owner) == ("run-1", 1, 2, "worker-2")
    assert error.expires_at is not None and error.expires_at > time.time()


def test_a_database_failure_is_a_plain_store_error_naming_the_url_run_and_action(
    store: Store, store_url: str
) -> None:
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:  # break the database under the store: the table a read needs is gone
        conn.execute(
            sa.text(f"DROP TABLE {RUNS} CASCADE" if store.dialect == "postgresql" else f"DROP TABLE {RUNS}")
        )
    engine.dispose()
    with pytest.raises(StoreError) as failed:
        store.get_run("run-9")
    error = failed.value
    assert type(error) is StoreError and isinstance(error.__cause__, Exception)
    assert (error.run_id, error.action, error.url) == ("run-9", "reading run run-9", store.url)


def test_a_bad_store_url_names_the_option_and_the_password_free_url() -> None:
    with pytest.raises(StoreConfigError) as bad:
        Store("postgresql://app:secret@db.invalid/agents?pool_pre_ping=maybe")
    error = bad.value
    assert error.option == "pool_pre_ping" and error.url is not None
    assert "secret" not in error.url and "secret" not in str(error)
    with pytest.raises(StoreConfigError) as unknown:
        Store("sqlite:///x.db?synchronus=FULL")
    assert unknown.value.option == "synchronus"


def test_a_newer_schema_names_both_versions(sqlite_url: str) -> None:
    with Store(sqlite_url) as store:
        known = store.schema_version()
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO graphflow_schema_version (version, description, applied_at) VALUES (:v, 'x', 0)"
            ),
            {"v": known + 5},
        )
    engine.dispose()
    with pytest.raises(SchemaVersionError) as newer:
        Store(sqlite_url)
    assert (newer.value.version, newer.value.known_version) == (known + 5, known)
    assert newer.value.url == sqlite_url


def test_a_taken_run_id_is_a_usage_error_not_a_conflict(store: Store) -> None:
    store.queue.submit("r1", task="a", team="t")
    with pytest.raises(UsageError) as taken:
        store.queue.submit("r1", task="b", team="t")
    assert isinstance(taken.value, RunExistsError) and not isinstance(taken.value, ConflictError)
    assert (taken.value.run_id, taken.value.team) == ("r1", "t")
    start(store, run_id="direct")
    with pytest.raises(RunExistsError) as exists:
        store.queue.submit("direct", task="a", team=None)
    assert (exists.value.run_id, exists.value.team) == ("direct", None)
