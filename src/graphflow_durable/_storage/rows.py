"""Rows as the database returns them, turned into the store's value objects (JSON decoded)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import RowMapping

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import RunRecord

__all__ = ["run_record"]


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
