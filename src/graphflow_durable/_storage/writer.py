"""The commit hot path: one step, its messages and agent-state rows in one guarded transaction.

:class:`CommitWriter` is held by the :class:`~graphflow_durable.store.Store` and is the only owner
of the SQLite connection kept between commits. It runs the precompiled statements of
``statements.HotPath`` on a raw DBAPI connection (no per-statement SQLAlchemy execution overhead);
on PostgreSQL the head move and the inserts go in one round trip (psycopg's pipeline mode).
"""

from __future__ import annotations

import threading
from typing import Any

from graphflow_durable._storage.commit import CommitParams, refusal
from graphflow_durable._storage.engine import Engines
from graphflow_durable._storage.statements import HotPath, LeaseTuple, Prepared

__all__ = ["CommitWriter"]


class CommitWriter:
    """Writes encoded commits (:class:`CommitParams`) on the store's engines."""

    def __init__(self, engines: Engines) -> None:
        self._e = engines
        dialect = engines.engine.dialect
        self._driver_error: type[Any] = dialect.loaded_dbapi.Error
        self._integrity_error: type[Any] = dialect.loaded_dbapi.IntegrityError
        self._hot = HotPath.for_dialect(dialect)
        self._kept: Any = None  # SQLite: the connection of the last successful commit
        self._lock = threading.Lock()
        # sqlite3 runs with isolation_level=None (see engine): the commit path must BEGIN itself.
        self._begin = "BEGIN IMMEDIATE" if engines.dialect == "sqlite" else None
        # psycopg's pipeline mode (libpq >= 14): one round trip for the statements of a commit.
        self._pipeline = engines.dialect == "postgresql" and _pipeline_supported(dialect.loaded_dbapi)

    def write(
        self,
        params: CommitParams,
        expected_head: int,
        fencing_token: int,
        first_seq: int | None,
        updates_run: bool,
    ) -> None:
        """Move the head and insert the rows in one transaction; raise why if the head did not move.

        Driver errors propagate (the store's guard turns them into ``StoreError``).
        """
        hot = self._hot
        run_id = params.run["p_run_id"]
        dbapi = self._take()
        committed = False
        update_head = hot.update_head[bool(params.messages), updates_run]
        try:
            cursor = dbapi.cursor()
            if self._pipeline:
                moved = self._write_pipelined(dbapi, cursor, update_head, params)
            else:
                if self._begin is not None:
                    cursor.execute(self._begin)
                cursor.execute(update_head.sql, update_head.bind(params.run))
                moved = cursor.rowcount == 1
                if moved:
                    self._insert_rows(cursor, params)
            if not moved:
                dbapi.rollback()
                cursor.execute(hot.select_lease.sql, hot.select_lease.bind(params.run))
                found = cursor.fetchone()
                row = None if found is None else LeaseTuple(*found)
                raise refusal(run_id, row, expected_head, fencing_token, first_seq)
            dbapi.commit()
            committed = True
        except self._driver_error as exc:
            if self._e.engine.dialect.is_disconnect(exc, dbapi.dbapi_connection, None):
                dbapi.invalidate(exc)  # never hand this connection out again
            raise
        finally:
            self._give_back(dbapi, committed)

    def close(self) -> None:
        """Close the kept connection."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def _insert_rows(self, cursor: Any, params: CommitParams) -> None:
        hot = self._hot
        cursor.execute(hot.insert_step.sql, hot.insert_step.bind(params.step))
        if params.messages:
            insert = hot.insert_message
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.messages])
        if params.states:
            insert = hot.insert_state
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.states])

    def _write_pipelined(self, dbapi: Any, cursor: Any, update_head: Prepared, params: CommitParams) -> bool:
        """PostgreSQL: send the head move and the inserts in one round trip; whether the head
        moved. If it did not, the inserts ran for nothing (or failed on a key that the winner
        already wrote) and the caller rolls them back."""
        connection = dbapi.dbapi_connection
        head = connection.cursor()
        try:
            with connection.pipeline():
                head.execute(update_head.sql, update_head.bind(params.run))
                self._insert_rows(cursor, params)
        except self._integrity_error:
            if head.rowcount == 1:
                raise  # the head moved, so the rows themselves are wrong: not a refusal
            return False
        return bool(head.rowcount == 1)

    def _take(self) -> Any:
        with self._lock:
            dbapi, self._kept = self._kept, None
        return dbapi if dbapi is not None else self._e.engine.raw_connection()

    def _give_back(self, dbapi: Any, committed: bool) -> None:
        """Keep a SQLite connection that just committed; anything else goes back to the pool
        (which rolls back whatever is uncommitted)."""
        if committed and self._e.dialect == "sqlite":
            with self._lock:
                if self._kept is None:
                    self._kept = dbapi
                    return
        dbapi.close()


def _pipeline_supported(driver: Any) -> bool:
    pipeline = getattr(driver, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())
