"""One item of the commit writer's group, written on the group's connection: a commit's guarded
head move and rows, or a new run's row with its first step; a refused or failed item is rolled back
alone (to its savepoint in a group of several).

:class:`GroupItems` is held by the :class:`~graphflow_durable._storage.writer.CommitWriter`, which
owns the transaction around the items. It runs precompiled statements (``statements.HotPath``);
on PostgreSQL each commit's head move and inserts go in one round trip (psycopg's pipeline mode).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from graphflow_durable._storage.commit import CommitParams, CreateParams, refusal, run_exists
from graphflow_durable._storage.engine import Engines
from graphflow_durable._storage.statements import HotPath, LeaseTuple, Prepared, run_record

__all__ = ["GroupItems", "Item"]


@dataclass
class Item:
    """One commit (or a new run: :class:`CreateParams`) handed to the writer, and what became of
    it: ``waiter`` (a coroutine's, on ``loop``) or ``future`` (a thread's) gives ``result`` (a
    commit's new head, a new run's record) or the error. An item handed over together with others
    (``CommitWriter.together``) after a failed one of the same run (``after``) is not written: it
    fails with that error (a run's first commit must never land on a run its failed creation did
    not make)."""

    params: CommitParams | CreateParams
    loop: asyncio.AbstractEventLoop | None = None
    after: Item | None = None  # handed over together before this one, of the same run
    created_token: int | None = None  # the token its run's creation drew, in this group (see follow)
    future: Future[Any] | None = None  # a thread's (a coroutine's item has a waiter instead)
    waiter: asyncio.Future[Any] | None = None
    result: Any = None
    error: BaseException | None = None

    @property
    def run_id(self) -> str:
        if isinstance(self.params, CreateParams):
            return str(self.params.run["run_id"])
        return str(self.params.run["p_run_id"])

    def follow(self, before: Item) -> None:
        """Write this item after ``before`` (of the same run, handed over together): a commit
        after its run's creation is written under the fencing token that creation drew in this
        same transaction, which its driver could not know when it handed the commit over (whatever
        token it named: nobody else can hold a run created in the transaction that writes it)."""
        if before.created_token is not None and isinstance(self.params, CommitParams):
            self.params.run["p_token"] = self.created_token = before.created_token

    @property
    def action(self) -> str:
        if isinstance(self.params, CreateParams):
            return f"creating run {self.run_id}"
        return f"committing step {int(self.params.run['p_expected']) + 1} of run {self.run_id}"


class GroupItems:
    """Writes the items of a group on its connection, with the statements compiled for its dialect."""

    def __init__(self, engines: Engines) -> None:
        dialect = engines.engine.dialect
        self._url = engines.url
        self._integrity_error: type[Any] = dialect.loaded_dbapi.IntegrityError
        self._hot = HotPath.for_dialect(dialect)
        # psycopg's pipeline mode (libpq >= 14): one round trip for the statements of a commit.
        self._pipeline = engines.dialect == "postgresql" and _pipeline_supported(dialect.loaded_dbapi)

    def apply(self, dbapi: Any, cursor: Any, item: Item, *, savepoint: bool) -> BaseException | None:
        """One commit of the group: ``None`` when it was written, else why not. With ``savepoint``
        it runs after one and a refused or failed commit is rolled back to it, the group's other
        commits untouched; without (a group of one), the transaction is rolled back."""
        params = item.params
        if isinstance(params, CreateParams):
            return self._create(dbapi, cursor, item, params, savepoint)
        update_head = self._hot.update_head[bool(params.messages), params.updates_run]
        try:
            if self._pipeline:
                moved = self._apply_pipelined(dbapi, cursor, update_head, params, savepoint)
            else:
                if savepoint:
                    cursor.execute("SAVEPOINT graphflow_commit")
                cursor.execute(update_head.sql, update_head.bind(params.run))
                moved = cursor.rowcount == 1
                if moved:
                    self._insert_rows(cursor, params)
        except self._integrity_error as exc:  # the head moved, so the rows themselves are wrong
            self._undo(dbapi, cursor, savepoint)
            failed: BaseException = exc
            return failed
        if moved:
            item.result = int(params.run["p_new_head"])
            return None
        self._undo(dbapi, cursor, savepoint)
        select = self._hot.select_lease
        cursor.execute(select.sql, select.bind(params.run))
        found = cursor.fetchone()
        row = None if found is None else LeaseTuple(*found)
        first_seq = params.messages[0]["seq"] if params.messages else None
        return refusal(item.run_id, row, int(params.run["p_expected"]), int(params.run["p_token"]), first_seq)

    def _create(
        self, dbapi: Any, cursor: Any, item: Item, params: CreateParams, savepoint: bool
    ) -> BaseException | None:
        """A new run's row, under a fencing token drawn from the store's counter, and its first step
        and agent states; refused if the id is taken."""
        insert, draw = self._hot.insert_run, self._hot.draw_token
        try:
            if savepoint:
                cursor.execute("SAVEPOINT graphflow_commit")
            cursor.execute(draw.sql, draw.bind({}))
            (token,) = cursor.fetchone()
            run = {**params.run, "fencing_token": int(token)}
            cursor.execute(insert.sql, insert.bind(run))
            (expires,) = cursor.fetchone()
            if params.first is not None:
                self._insert_rows(cursor, params.first)
        except self._integrity_error:  # the primary key: the run exists
            self._undo(dbapi, cursor, savepoint)
            return run_exists(item.run_id, self._url)
        item.created_token = run["fencing_token"]
        item.result = run_record({**run, "lease_expires_at": float(expires)})
        return None

    @staticmethod
    def _undo(dbapi: Any, cursor: Any, savepoint: bool) -> None:
        if savepoint:
            cursor.execute("ROLLBACK TO SAVEPOINT graphflow_commit")
        else:
            dbapi.rollback()

    def _insert_rows(self, cursor: Any, params: CommitParams) -> None:
        hot = self._hot
        cursor.execute(hot.insert_step.sql, hot.insert_step.bind(params.step))
        if params.messages:
            insert = hot.insert_message
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.messages])
        if params.states:
            insert = hot.insert_state
            cursor.executemany(insert.sql, [insert.bind(row) for row in params.states])

    def _apply_pipelined(
        self, dbapi: Any, cursor: Any, update_head: Prepared, params: CommitParams, savepoint: bool
    ) -> bool:
        """PostgreSQL: the savepoint, the head move and the inserts in one round trip; whether the
        head moved. If it did not, the inserts ran for nothing (or failed on a key that the winner
        already wrote): the caller rolls them back."""
        connection = dbapi.dbapi_connection
        head = connection.cursor()
        try:
            with connection.pipeline():
                if savepoint:
                    cursor.execute("SAVEPOINT graphflow_commit")
                head.execute(update_head.sql, update_head.bind(params.run))
                self._insert_rows(cursor, params)
        except self._integrity_error:
            if head.rowcount == 1:
                raise
            return False
        return bool(head.rowcount == 1)


def _pipeline_supported(driver: Any) -> bool:
    pipeline = getattr(driver, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())
