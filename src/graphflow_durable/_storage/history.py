"""A run at a past step: the cut read back (``Store.cut``) and a new run started from it
(``Store.fork``). The SQL half of ``_model.history``; the rows move through ``transfer``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

import sqlalchemy as sa

from graphflow_durable._model.codec import dumps
from graphflow_durable._model.history import check_step, cut_record
from graphflow_durable._model.records import RunLog, RunRecord
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.commit import not_found
from graphflow_durable._storage.lease import owner_gone
from graphflow_durable._storage.reading import read_log
from graphflow_durable._storage.rows import run_record
from graphflow_durable._storage.transfer import read_rows, write_rows
from graphflow_durable.errors import RunLockedError

__all__ = ["fork_run", "read_cut", "run_row"]

_log = logging.getLogger(__name__)


def run_row(conn: sa.Connection, run_id: str) -> RunRecord:
    """The run's row; :class:`RunNotFoundError` when there is none."""
    row = conn.execute(S.SELECT_RUN, {"p_run_id": run_id}).mappings().first()
    if row is None:
        raise not_found(run_id)
    return run_record(row)


def read_cut(conn: sa.Connection, run_id: str, at: int, url: str) -> RunLog:
    """The run as it stood once step ``at`` was committed (see ``Store.cut``), every row checked."""
    run = run_row(conn, run_id)
    log = read_log(conn, run_id, url, check_step(run, at))
    return dataclasses.replace(log, run=cut_record(run, log, at))


def fork_run(conn: sa.Connection, run_id: str, at: int, new_run_id: str | None, url: str) -> RunRecord:
    """Write a new run holding ``run_id``'s rows up to step ``at`` (see ``Store.fork``); its row."""
    new_id = check_run_id(new_run_id if new_run_id is not None else f"{run_id}-fork-{uuid.uuid4().hex[:8]}")
    source = run_row(conn, run_id)
    check_step(source, at)
    if at == source.head_seq and source.status == "running" and source.lease_owner is not None:
        held = (source.lease_expires_at or 0) >= S.lease_clock(conn, time.time()) and not owner_gone(source)
        if held:
            raise RunLockedError(
                f"run {run_id} is running under {source.lease_owner} and step {at} is its head: its "
                "nodes in flight are running there; fork at an earlier step, or after the run ends",
                run_id=run_id,
                owner=source.lease_owner,
                expires_at=source.lease_expires_at,
            )
    rows = read_rows(conn, run_id, url, at)
    cut = cut_record(source, rows.log(source), at)
    now = time.time()
    values = {
        "run_id": new_id,
        "graph_fingerprint": rows.run["graph_fingerprint"],
        "graph": rows.run["graph"],
        "status": cut.status,
        "head_seq": at,
        "message_count": cut.message_count,
        "task": None if cut.task is None else dumps(cut.task),
        "result": None if cut.result is None else dumps(cut.result),
        "parent_run_id": run_id,
        "created_at": now,
        "updated_at": now,
    }
    forked = write_rows(conn, rows, values, url).run
    _log.info("run %s: forked at step %d as run %s (%s)", run_id, at, new_id, forked.status)
    return forked
