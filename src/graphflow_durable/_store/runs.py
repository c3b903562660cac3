"""Store methods: create a run, read its row, list runs, the lease clock; load a run's log, its head
scheduler state, and verify rows against their checksums."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from graphflow_durable._agentstate.writer import state_row
from graphflow_durable._model.records import AgentStateRecord, AgentStateRow, RunLog, RunRecord, Step
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.commit import CreateParams, encode_creation
from graphflow_durable._storage.engine import read_row
from graphflow_durable._storage.reading import Verification, head_scheduler, read_log, scan_run
from graphflow_durable._storage.rows import not_found, run_record
from graphflow_durable._storage.schema import runs
from graphflow_durable._store.base import StoreBase

__all__ = ["RunMethods"]


class RunMethods(StoreBase):
    """Runs: create, read, list; a run's log read back and checked."""

    def create_run(
        self,
        run_id: str,
        *,
        graph_fingerprint: str,
        graph: Mapping[str, Any],
        owner: str,
        lease_seconds: float,
        parent_run_id: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        first_step: Step | None = None,
        agent_states: Sequence[AgentStateRecord | AgentStateRow] = (),
    ) -> RunRecord:
        """Create a run (status ``running``, head 0, no steps), leased to ``owner`` with a new fencing
        token (the record's ``fencing_token``, drawn from the store's counter in the transaction
        that writes the run: a driver of a run deleted under this id can never commit to it).

        With ``first_step``, the run starts at head 1: that step and ``agent_states`` are written in
        the same transaction (a new run's first snapshot costs no commit of its own).

        ``host``/``pid`` identify the owner's process (default: this process; a pid is one of this
        PID namespace); with the boot id, PID namespace and start time recorded beside them, they
        let a worker on the same host, boot and PID namespace take the run over at once if that
        process dies.

        Raises:
            ConflictError: a run with this id exists already.
            NotSerializableError: ``graph`` is not JSON.
        """
        params = self._encode_creation(
            run_id,
            graph_fingerprint,
            graph,
            owner,
            lease_seconds,
            parent_run_id,
            host,
            pid,
            first_step,
            agent_states,
        )
        record: RunRecord = self._writer.submit(params).result()
        return record

    def submit_create_run(
        self,
        run_id: str,
        *,
        graph_fingerprint: str,
        graph: Mapping[str, Any],
        owner: str,
        lease_seconds: float,
        parent_run_id: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        first_step: Step | None = None,
        agent_states: Sequence[AgentStateRecord | AgentStateRow] = (),
    ) -> asyncio.Future[RunRecord]:
        """:meth:`create_run` for coroutines: hand the new run to the store's writer (with the
        commits of other runs) and return at once; the future gives the run's record once it is
        durable, or raises what :meth:`create_run` raises (a value that is not JSON raises here,
        before anything is handed over). Call it from a running event loop."""
        params = self._encode_creation(
            run_id,
            graph_fingerprint,
            graph,
            owner,
            lease_seconds,
            parent_run_id,
            host,
            pid,
            first_step,
            agent_states,
        )
        return self._writer.submit_async(params, asyncio.get_running_loop())

    def _encode_creation(
        self,
        run_id: str,
        graph_fingerprint: str,
        graph: Mapping[str, Any],
        owner: str,
        lease_seconds: float,
        parent_run_id: str | None,
        host: str | None,
        pid: int | None,
        first_step: Step | None,
        agent_states: Sequence[AgentStateRecord | AgentStateRow],
    ) -> CreateParams:
        rows = [state if isinstance(state, AgentStateRow) else state_row(state) for state in agent_states]
        return encode_creation(
            run_id,
            graph_fingerprint,
            graph,
            owner,
            lease_seconds,
            parent_run_id,
            host,
            pid,
            time.time(),
            first_step,
            rows,
        )

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's row, or ``None`` when there is no such run."""
        select = S.HotPath.for_dialect(self._e.engine.dialect).select_run
        with self._guard(f"reading run {run_id}", run_id):
            row = read_row(self._e, select.sql, select.bind({"p_run_id": run_id}))
        return None if row is None else run_record(row)

    def list_runs(self, status: str | Sequence[str] | None = None) -> list[RunRecord]:
        """Runs in creation order, optionally only those with the given status(es)."""
        query = sa.select(runs).order_by(runs.c.created_at, runs.c.run_id)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            query = query.where(runs.c.status.in_(wanted))
        with self._guard("listing runs"), self._e.read.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [run_record(row) for row in rows]

    def lease_clock(self) -> float:
        """The time leases are judged by, now (epoch seconds): the database server's clock on
        PostgreSQL, this host's on SQLite. Compare a run's ``lease_expires_at`` with it."""
        with self._guard("reading the lease clock"), self._e.read.begin() as conn:
            return S.lease_clock(conn, time.time())

    def load(self, run_id: str) -> RunLog:
        """Everything needed to resume ``run_id``, read in one consistent transaction.

        Every step, message and agent-state row read is checked against the checksum stored with
        it (rows written before schema version 6 have none and are not checked).

        Raises:
            RunNotFoundError: no such run.
            StoreCorruptError: a row does not match its checksum, a step or message row is
                missing (or stored beyond the run's head or message count), or the agent-state rows
                do not fold; the error names the run, table, step and message seq or node.
        """
        with self._guard(f"loading run {run_id}", run_id), self._e.read.begin() as conn:
            return read_log(conn, run_id, self._e.url)

    def head_scheduler(self, run_id: str) -> Mapping[str, Any] | None:
        """The scheduler JSON of the run's head step (``None`` before the first step), read alone
        and checked against the step's checksum (:class:`StoreCorruptError` if it does not match)."""
        with self._guard(f"reading the head of run {run_id}", run_id), self._e.read.begin() as conn:
            found: Mapping[str, Any] | None = head_scheduler(conn, run_id, self._e.url)
        return found

    def verify(self, run_ids: Sequence[str] | None = None) -> Verification:
        """Check every step, message and agent-state row of the runs (default: every run) against
        its checksum, check that none of their steps and messages is missing, and report the damaged
        rows and gaps instead of raising. Each run is read in its own transaction. Rows written
        before schema version 6 have no checksum: counted, not checked.

        Raises:
            RunNotFoundError: one of ``run_ids`` does not exist (nothing is reported then).
        """
        ids = [run.run_id for run in self.list_runs()] if run_ids is None else list(dict.fromkeys(run_ids))
        if missing := [run_id for run_id in ids if run_ids is not None and self.get_run(run_id) is None]:
            raise not_found(missing[0])
        scans = []
        for run_id in ids:
            with self._guard(f"verifying run {run_id}", run_id), self._e.read.begin() as conn:
                scans.append(scan_run(conn, run_id))
        return Verification.of(ids, scans)
