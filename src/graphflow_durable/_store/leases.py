"""Store methods: a run's lease taken, renewed (with the cancel request read beside it) and given up."""

from __future__ import annotations

import logging
import os
import socket

from graphflow_durable._storage.admin import Heartbeat
from graphflow_durable._storage.leasing import acquire, release, renew
from graphflow_durable._store.base import StoreBase

__all__ = ["LeaseMethods"]

_log = logging.getLogger("graphflow_durable.store")  # the store's logger, wherever its methods live


class LeaseMethods(StoreBase):
    """Leases: one worker drives a run at a time; a fencing token fences out the previous holder
    (every token is drawn from one store-wide counter: none is issued twice)."""

    def acquire_lease(
        self,
        run_id: str,
        owner: str,
        *,
        lease_seconds: float,
        host: str | None = None,
        pid: int | None = None,
    ) -> int:
        """Take the run's lease for ``owner``; return the new fencing token: the store's next (one
        counter for every run), so a token never repeats for a run id, not even for a run deleted
        and made again under its id, and any token issued earlier is refused by its commits.

        Allowed when the run has no owner, when ``owner`` already holds it, when the lease has
        expired, or when the holder is provably dead: a process on this host, of this boot and PID
        namespace, whose pid is gone or was reused (another start time). ``host`` and
        ``pid`` describe the new owner's process (default: this process). Expiry is judged, and
        stored, by the database server's clock on PostgreSQL (by this host's on SQLite), in the
        statement that takes the lease.

        Raises:
            RunNotFoundError: no such run.
            RunLockedError: another live worker holds an unexpired lease.
        """
        host = socket.gethostname() if host is None else host
        pid = os.getpid() if pid is None else pid
        with self._guard(f"acquiring the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            token, reason, previous = acquire(conn, run_id, owner, lease_seconds, host, pid)
        if reason not in ("free", "same owner"):
            _log.info(
                "run %s: %s took the lease from %s (%s); token %d", run_id, owner, previous, reason, token
            )
        return token

    def renew_lease(self, run_id: str, owner: str, fencing_token: int, *, lease_seconds: float) -> float:
        """Extend a lease this worker holds; return the new expiry (epoch seconds, by the
        database server's clock on PostgreSQL).

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: the run's token or owner is no longer ``fencing_token`` / ``owner``.
        """
        return self.heartbeat(run_id, owner, fencing_token, lease_seconds=lease_seconds).expires_at

    def heartbeat(self, run_id: str, owner: str, fencing_token: int, *, lease_seconds: float) -> Heartbeat:
        """:meth:`renew_lease`, also saying whether a cancel of the run was requested (read in the
        same statement): a driver that sees one stops dispatching and records the run ``cancelled``.

        Raises what :meth:`renew_lease` raises.
        """
        with self._guard(f"renewing the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            return Heartbeat(*renew(conn, run_id, owner, fencing_token, lease_seconds))

    def release_lease(self, run_id: str, fencing_token: int) -> bool:
        """Give up the lease if ``fencing_token`` still holds it; return whether it did.

        Never raises because the lease was taken over (or the run is gone): there is nothing left
        to release then.
        """
        with self._guard(f"releasing the lease of run {run_id}", run_id), self._e.write.begin() as conn:
            return release(conn, run_id, fencing_token)
