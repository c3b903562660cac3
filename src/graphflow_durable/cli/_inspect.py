"""``graphflow-durable runs list`` and ``runs verify``: what they print, for :mod:`.runs`.

The rows ``runs list`` prints (and ``--json``'s fields) are built by :mod:`graphflow_durable.views`,
which the console's API shares.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from graphflow_durable._storage.lease import iso
from graphflow_durable.cli._common import table
from graphflow_durable.store import Store
from graphflow_durable.views import EXPIRED, GONE

__all__ = ["EXIT_DAMAGED", "print_rows", "verify"]

#: ``runs verify``: damaged rows were found (each printed on one line).
EXIT_DAMAGED = 4


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
