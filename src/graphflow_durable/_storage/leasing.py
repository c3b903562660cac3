"""A run's lease, taken, renewed and given back inside the store's transactions.

The rules (who may take a lease over, who is provably dead) are in :mod:`.lease`; this module runs
the statements that apply them. Expiry is judged, and stored, by the database server's clock on
PostgreSQL (``p_now``, this host's clock, is only SQLite's).
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from graphflow_durable._storage import statements as S
from graphflow_durable._storage.lease import lease_lost, locked, process_identity, takeover_reason
from graphflow_durable._storage.rows import not_found

__all__ = ["acquire", "release", "renew"]


def acquire(
    conn: sa.Connection, run_id: str, owner: str, lease_seconds: float, host: str, pid: int
) -> tuple[int, str, str | None]:
    """Take the lease for ``owner``: the new fencing token (the store's next), why it was allowed, the
    previous owner.

    Raises RunNotFoundError or RunLockedError (nothing changed).
    """
    p = {"p_run_id": run_id, "p_now": time.time()}
    row = conn.execute(S.SELECT_LEASE_NOW.with_for_update(), p).first()
    if row is None:
        raise not_found(run_id)
    reason = takeover_reason(row, owner, float(row.db_now))
    if reason is None:
        raise locked(run_id, row)
    token = S.next_token(conn)  # after the row's lock: a run's tokens only grow
    taken = conn.execute(
        S.UPDATE_LEASE,
        {
            **p,
            "p_old_token": row.fencing_token,
            "p_token": token,
            "p_owner": owner,
            "p_host": host,
            "p_pid": pid,
            "p_process": process_identity(pid),
            "p_seconds": lease_seconds,
            "p_early": reason.startswith("holder process"),
        },
    ).first()
    if taken is None:  # the database's clock went back between the two statements
        again = conn.execute(S.SELECT_LEASE, p).first()
        raise locked(run_id, again) if again is not None else not_found(run_id)
    return token, reason, row.lease_owner


def renew(
    conn: sa.Connection, run_id: str, owner: str, fencing_token: int, lease_seconds: float
) -> tuple[float, float | None]:
    """Extend the lease ``owner`` holds with ``fencing_token``; the new expiry, and when a cancel of
    the run was requested (``None``: it was not), read in the same statement.

    Raises RunNotFoundError or LeaseLostError.
    """
    params = {
        "p_run_id": run_id,
        "p_owner": owner,
        "p_token": fencing_token,
        "p_seconds": lease_seconds,
        "p_now": time.time(),
    }
    renewed = conn.execute(S.RENEW_LEASE, params).first()
    if renewed is None:
        row = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first()
        if row is None:
            raise not_found(run_id)
        raise lease_lost(run_id, fencing_token, row, owner)
    cancel = renewed.cancel_requested_at
    return float(renewed.lease_expires_at), None if cancel is None else float(cancel)


def release(conn: sa.Connection, run_id: str, fencing_token: int) -> bool:
    """Give the lease up if ``fencing_token`` still holds it; whether it did."""
    return bool(conn.execute(S.RELEASE_LEASE, {"p_run_id": run_id, "p_token": fencing_token}).rowcount)
