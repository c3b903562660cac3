"""Lease rules, without I/O on the database: who may take a run over, and the errors that say no.

The store reads the run's lease columns under its write lock, asks :func:`takeover_reason`, and
writes the new owner and token in the same transaction.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import sys
from typing import Any, Protocol

from graphflow_durable.errors import LeaseLostError, RunLockedError

__all__ = ["LeaseRow", "iso", "lease_lost", "locked", "pid_alive", "takeover_reason"]


class LeaseRow(Protocol):
    """The lease columns of a run's row (a SQLAlchemy ``Row`` satisfies it)."""

    @property
    def fencing_token(self) -> Any: ...
    @property
    def lease_owner(self) -> Any: ...
    @property
    def lease_host(self) -> Any: ...
    @property
    def lease_pid(self) -> Any: ...
    @property
    def lease_expires_at(self) -> Any: ...


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (``True`` when it cannot be told)."""
    if pid <= 0 or sys.platform == "win32":  # os.kill(0 or <0) signals groups; Windows kill terminates
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited but not been reaped by its parent (Linux ``/proc``; else False)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # "pid (comm) state ...": comm may hold spaces or parentheses, the state follows the last ")".
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def takeover_reason(row: LeaseRow, owner: str, now: float) -> str | None:
    """Why ``owner`` may take the lease now (``"free"``, ``"same owner"``, ``"expired"``,
    ``"holder process N is gone"``), or ``None`` if the current holder keeps it."""
    if row.lease_owner is None:
        return "free"
    if row.lease_owner == owner:
        return "same owner"
    if row.lease_expires_at is None or row.lease_expires_at < now:
        return "expired"
    if row.lease_host == socket.gethostname() and row.lease_pid is not None and not pid_alive(row.lease_pid):
        return f"holder process {row.lease_pid} on this host is gone"
    return None


def iso(epoch: float | None) -> str:
    """An epoch time as ISO 8601 UTC text (``"never"`` for ``None``)."""
    if epoch is None:
        return "never"
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.timezone.utc).isoformat(timespec="seconds")


def locked(run_id: str, row: LeaseRow) -> RunLockedError:
    """The error for a run whose live holder keeps its lease."""
    return RunLockedError(
        f"run {run_id} is being driven by {row.lease_owner} (pid {row.lease_pid} on {row.lease_host}) "
        f"until {iso(row.lease_expires_at)}; wait for that worker to finish or its lease to expire, "
        "or stop that worker and retry",
        run_id=run_id,
        owner=row.lease_owner,
        host=row.lease_host,
        pid=None if row.lease_pid is None else int(row.lease_pid),
        expires_at=row.lease_expires_at,
    )


def lease_lost(run_id: str, fencing_token: int, row: LeaseRow, owner: str | None = None) -> LeaseLostError:
    """The error for a worker whose fencing token is stale (or whose lease was released)."""
    holder = "nobody (the lease was released)" if row.lease_owner is None else repr(row.lease_owner)
    if row.fencing_token == fencing_token:
        what = f"token {fencing_token} is current but the lease is held by {holder}, not {owner!r}"
    else:
        what = (
            f"this worker's fencing token is {fencing_token} but the run's token is {row.fencing_token}, "
            f"held by {holder}"
        )
    return LeaseLostError(
        f"run {run_id}: {what}; this worker lost its lease and must stop driving the run "
        "(nothing was written); acquire the lease again and reload the run to continue",
        run_id=run_id,
        token=fencing_token,
        current_token=int(row.fencing_token),
        owner=row.lease_owner,
        expires_at=None if row.lease_owner is None else row.lease_expires_at,
    )
