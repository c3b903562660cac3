"""Backend set-up: SQLite pragmas and concurrency, in-memory sharing, URLs and error wrapping."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from graphflow_durable.errors import StoreError
from graphflow_durable.store import Store

from .test_store import commit_text, start


def pragmas(store: Store) -> dict[str, object]:
    with store._e.read.connect() as conn:
        return {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
        }


def test_a_sqlite_file_uses_wal_full_sync_a_busy_timeout_and_foreign_keys(sqlite_url: str) -> None:
    with Store(sqlite_url) as store:
        assert pragmas(store) == {
            "journal_mode": "wal",
            "synchronous": 2,
            "busy_timeout": 30000,
            "foreign_keys": 1,
        }


def test_sqlite_synchronous_can_be_lowered_to_normal(sqlite_url: str) -> None:
    with Store(sqlite_url, synchronous="NORMAL") as store:
        assert pragmas(store)["synchronous"] == 1


def test_an_unknown_synchronous_mode_is_refused(sqlite_url: str) -> None:
    with pytest.raises(StoreError, match="synchronous='FAST' is not a SQLite synchronous mode"):
        Store(sqlite_url, synchronous="FAST")


def test_write_transactions_begin_immediate_so_a_second_writer_waits_instead_of_failing(
    sqlite_url: str,
) -> None:
    with Store(sqlite_url) as store:
        token = start(store)
        with store._e.write.begin() as conn:  # hold the write lock
            blocker = sa.create_engine(sqlite_url, connect_args={"timeout": 0.05})
            try:
                with pytest.raises(sa.exc.OperationalError, match="locked"), blocker.connect() as other:
                    other.exec_driver_sql("BEGIN IMMEDIATE")
            finally:
                blocker.dispose()
            conn.exec_driver_sql("SELECT 1")
        assert commit_text(store, "run-1", 0, token, 0) == 1


def test_two_threads_committing_to_one_sqlite_file_never_see_database_is_locked(sqlite_url: str) -> None:
    commits = 150
    errors: list[BaseException] = []

    def drive(run_id: str) -> None:
        try:
            with Store(sqlite_url) as store:
                token = start(store, run_id)
                for seq in range(commits):
                    commit_text(store, run_id, seq, token, seq)
        except BaseException as exc:
            errors.append(exc)

    Store(sqlite_url).close()  # migrate first, so the threads race only on commits
    threads = [threading.Thread(target=drive, args=(f"run-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Store(sqlite_url) as store:
        assert sorted((r.run_id, r.head_seq) for r in store.list_runs()) == [
            (f"run-{i}", commits) for i in range(4)
        ]


def test_two_processes_committing_to_one_sqlite_file_never_see_database_is_locked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    Store(url).close()
    script = textwrap.dedent(
        """
        import sys
        from graphflow_durable._storage.driver import CommitRequest, CreateRequest
        from graphflow_durable.store import MessageRecord, Step, Store
        url, run_id = sys.argv[1], sys.argv[2]
        with Store(url) as store:
            run = store._driver.create_run(CreateRequest(run_id, graph_fingerprint="f", graph={}, owner=run_id, lease_seconds=60))
            token = run.fencing_token
            for seq in range(200):
                store._driver.commit(CommitRequest(run_id, expected_head=seq, fencing_token=token, step=Step("complete", "a", {}),
                             messages=[MessageRecord(seq, {"content": "x" * 500}, True)]))
        """
    )
    children = [
        subprocess.Popen([sys.executable, "-c", script, url, f"proc-{i}"], stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    outcomes = [(child.communicate(timeout=120)[1], child.returncode) for child in children]
    assert all(code == 0 for _, code in outcomes), outcomes
    with Store(url) as store:
        assert sorted((r.run_id, r.message_count) for r in store.list_runs()) == [
            (f"proc-{i}", 200) for i in range(3)
        ]


def test_an_in_memory_store_is_shared_across_threads() -> None:
    with Store("sqlite://") as store:
        token = start(store)
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                assert store.get_run("run-1") is not None
                for i in range(5):
                    start(store, f"t-{i}")
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        for seq in range(20):
            commit_text(store, "run-1", seq, token, seq)
        thread.join()
        assert errors == []
        assert len(store.list_runs()) == 6 and store.load("run-1").run.head_seq == 20


@pytest.mark.postgres
def test_a_plain_postgresql_url_is_served_by_psycopg_3(postgres_database: str) -> None:
    plain = sa.make_url(postgres_database).set(drivername="postgresql").render_as_string(hide_password=False)
    with Store(plain) as store:
        assert store.dialect == "postgresql"
        assert store._e.engine.url.drivername == "postgresql+psycopg"
        assert commit_text(store, "run-1", 0, start(store), 0) == 1


def test_a_password_never_appears_in_an_error_and_the_driver_error_is_chained() -> None:
    with pytest.raises(StoreError) as info:
        Store("postgresql://alice:s3cr3t-pw@127.0.0.1:1/graphflow?connect_timeout=2")
    assert "s3cr3t-pw" not in str(info.value)
    assert "postgresql+psycopg://alice:***@127.0.0.1:1/graphflow" in str(info.value)
    assert isinstance(info.value.__cause__, sa.exc.SQLAlchemyError)


@pytest.mark.parametrize("url", ["mysql://u:pw@host/db", "postgresql+psycopg2://u:pw@host/db", "not a url"])
def test_an_unsupported_url_is_refused_naming_what_is_supported(url: str) -> None:
    with pytest.raises(StoreError, match="sqlite:///") as info:
        Store(url)
    assert ":pw@" not in str(info.value)


def test_a_missing_sqlite_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"opening the store failed on sqlite:///.*unable to open"):
        Store(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
