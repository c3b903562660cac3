"""What every group of the store's methods works with: the engines, the writer, the queue, the
requests, and the guard each database call runs under."""

from __future__ import annotations

from contextlib import AbstractContextManager

from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.requests import InputRequests
from graphflow_durable._storage.workqueue import WorkQueue
from graphflow_durable._storage.writer import CommitWriter

__all__ = ["StoreBase"]


class StoreBase:
    """The state :class:`~graphflow_durable.store.Store` sets up when it opens, shared by its method groups."""

    _e: Engines
    _writer: CommitWriter
    _queue: WorkQueue
    _requests: InputRequests

    def _guard(self, action: str, run_id: str | None = None) -> AbstractContextManager[None]:
        """Serialise (in-memory SQLite only) and turn database errors into :class:`StoreError`."""
        return guarded(self._e, action, run_id=run_id)
