"""A run's row: read by id (an unknown id is :func:`not_found`), and rows as the database returns
them turned into the store's value objects (JSON decoded)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunRecord
from graphflow_durable._storage import statements as S
from graphflow_durable.errors import RunNotFoundError

__all__ = ["not_found", "run_record", "run_row"]


def not_found(run_id: str) -> RunNotFoundError:
    """The error for a run id the store does not have (nothing was changed). One wording for every
    caller: the CLI prints it as it is, so it names the command that lists the runs."""
    return RunNotFoundError(
        f"run {run_id} does not exist, nothing was changed; 'graphflow-durable runs list' lists the runs",
        run_id=run_id,
    )


def run_row(conn: sa.Connection, run_id: str) -> RunRecord:
    """The run's row; :class:`RunNotFoundError` when there is none."""
    row = conn.execute(S.SELECT_RUN, {"p_run_id": run_id}).mappings().first()
    if row is None:
        raise not_found(run_id)
    return run_record(row)


def run_record(row: Mapping[str, Any] | RowMapping) -> RunRecord:
    """A run's row (as stored: JSON text) as a :class:`RunRecord` (JSON decoded)."""
    task, result = row["task"], row["result"]
    return RunRecord(
        run_id=row["run_id"],
        graph_fingerprint=row["graph_fingerprint"],
        graph=loads(row["graph"]),
        status=row["status"],
        head_seq=row["head_seq"],
        message_count=row["message_count"],
        task=None if task is None else loads(task),
        result=None if result is None else loads(result),
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        fencing_token=row["fencing_token"],
        parent_run_id=row["parent_run_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        lease_host=row["lease_host"],
        lease_pid=row["lease_pid"],
        lease_process=row.get("lease_process"),
        cancel_requested_at=row.get("cancel_requested_at"),
    )
