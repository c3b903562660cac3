"""``graphflow-durable runs list`` and ``runs verify``: what they print, for :mod:`.runs`.

``runs list`` judges each lease by the store's lease clock (the database server's on PostgreSQL)
and, for a holder on this host, by whether its process still lives (the rule early takeover uses,
:func:`owner_gone`): a run whose driver died shows as such, not as ``running`` with a future lease.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any

from graphflow_durable._storage.lease import EXPIRED, GONE, HELD, iso, lease_state
from graphflow_durable.cli._common import table
from graphflow_durable.store import DEFAULT_QUEUE, ENDED_STATUSES, Store

__all__ = ["EXIT_DAMAGED", "HELD", "EXPIRED", "GONE", "SUBMITTED", "lease_state", "list_rows", "verify"]

#: ``runs verify``: damaged rows were found (each printed on one line).
EXIT_DAMAGED = 4

#: ``runs list --status`` value for submissions whose run does not exist yet.
SUBMITTED = "submitted"


def list_rows(
    store: Store, wanted: Collection[str], queues: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """The rows ``runs list`` shows (``--json``: one object each), runs then waiting submissions;
    ``queues``: only those of these named queues (a run never submitted is in ``default``)."""
    now = store.lease_clock()
    teams = {s.run_id: s for s in store.queue.list_submissions()}
    rows: list[dict[str, Any]] = []
    real = [s for s in wanted if s != SUBMITTED]
    for run in store.list_runs(real) if real else []:
        sub = teams.get(run.run_id)
        if queues is not None and (DEFAULT_QUEUE if sub is None else sub.queue) not in queues:
            continue
        rows.append(
            {
                "run_id": run.run_id,
                "status": run.status,
                "team": None if sub is None else sub.team,
                "head": run.head_seq,
                "messages": run.message_count,
                "lease_owner": run.lease_owner,
                "lease_expires_at": run.lease_expires_at,
                "lease_state": lease_state(run, now),
                "lease_host": run.lease_host,
                "lease_pid": run.lease_pid,
                "attempts": 0 if sub is None else sub.attempts,
                "queue": DEFAULT_QUEUE if sub is None else sub.queue,
                "priority": 0 if sub is None else sub.priority,
                "partition": None if sub is None else sub.partition,
                # an error a later success superseded is not the run's now
                "last_error": None if sub is None or run.status in ENDED_STATUSES else sub.last_error,
                "pending": [r.to_json() for r in store.pending_requests(run.run_id)]
                if run.status == "waiting"
                else [],
            }
        )
    if SUBMITTED in wanted:
        for sub in store.queue.list_submissions(waiting=True):
            if queues is not None and sub.queue not in queues:
                continue
            expires = sub.claim_expires_at
            state = None if sub.claimed_by is None else EXPIRED if expires is None or expires < now else HELD
            rows.append(
                {
                    "run_id": sub.run_id,
                    "status": SUBMITTED,
                    "team": sub.team,
                    "head": None,
                    "messages": 0,
                    "lease_owner": sub.claimed_by,
                    "lease_expires_at": expires,
                    "lease_state": state,
                    "lease_host": None,
                    "lease_pid": None,
                    "attempts": sub.attempts,
                    "queue": sub.queue,
                    "priority": sub.priority,
                    "partition": sub.partition,
                    "last_error": sub.last_error,
                    "pending": [],
                }
            )
    return rows


def print_rows(rows: Sequence[dict[str, Any]], as_json: bool, out: Callable[[str], None]) -> None:
    """Print ``runs list``: JSON lines, or a table whose STATUS says when a running run's driver is
    gone (``running (owner gone)``, ``running (lease expired)``)."""
    if as_json:
        for row in rows:
            out(json.dumps(row, sort_keys=True))
        return
    cells: list[list[str]] = []
    for row in rows:
        status, state = row["status"], row["lease_state"]
        lease = "-"
        if state == GONE:
            where = f"pid {row['lease_pid']} on {row['lease_host']}"
            lease = f"{row['lease_owner']} ({where} is gone; lease until {iso(row['lease_expires_at'])})"
        elif state is not None:
            word = "expired" if state == EXPIRED else "until"
            lease = f"{row['lease_owner']} ({word} {iso(row['lease_expires_at'])})"
        if status == "running" and state in (EXPIRED, GONE):
            status = f"running ({'lease expired' if state == EXPIRED else state})"
        head = "-" if row["head"] is None else str(row["head"])
        cells.append([row["run_id"], status, row["team"] or "-", head, lease])
    header, *lines = table([("RUN", 24), ("STATUS", 24), ("TEAM", 12), ("HEAD", -5), ("LEASE", 0)], cells)
    out(header)
    for row, line in zip(rows, lines, strict=True):
        out(line)
        for request in row["pending"]:  # what a waiting run waits for, one line each
            out(f"  waits for {request['request_id']}: {request['node']} asks {request['prompt']!r}")


def verify(store: Store, run_ids: Sequence[str], as_json: bool, out: Callable[[str], None]) -> int:
    """``runs verify``: each damaged row on one line (stdout), a summary on stderr; the exit code
    (0 clean, :data:`EXIT_DAMAGED` damage found). An unknown run id raises RunNotFoundError."""
    found = store.verify(run_ids or None)
    for damage in found.damaged:
        out(json.dumps(damage.as_dict(), sort_keys=True) if as_json else damage.describe())
    unchecked = (
        f"; {found.unchecked} rows written before schema version 6 have no checksum (not checked)"
        if found.unchecked
        else ""
    )
    sys.stderr.write(
        f"graphflow-durable: {len(found.runs)} runs, {found.checked} rows checked, "
        f"{len(found.damaged)} damaged{unchecked}\n"
    )
    if found.damaged:
        sys.stderr.write(
            "graphflow-durable: damaged rows are refused when a run is resumed; restore the database "
            "from a backup\n"
        )
        return EXIT_DAMAGED
    return 0
