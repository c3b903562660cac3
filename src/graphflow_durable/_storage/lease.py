"""A run's lease: the rules (who may take a run over, the errors that say no) and the statements
that apply them inside the store's transactions (taken, renewed, given back).

The store reads the run's lease columns under its write lock and :func:`take_over` asks
:func:`takeover_reason` and writes the new owner and fencing token in the same transaction: the one
takeover path, for a driver's :func:`acquire` and for the work queue's claim. A holder counts as
dead before its lease expires only when :func:`owner_gone` proves it from the identity stored with
the lease (:func:`process_identity`: boot id, PID namespace, start time), never from host name and
pid alone. Expiry is judged, and stored, by the database server's clock on PostgreSQL (``p_now``,
this host's clock, is only SQLite's).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa

from graphflow_durable._storage import deaths
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.schema import runs
from graphflow_durable._storage.sealing import PLAIN, Sealer, keyless
from graphflow_durable.errors import LeaseLostError, RunLockedError, UsageError

__all__ = [
    "EXPIRED",
    "GONE",
    "HELD",
    "NOBODY",
    "Heartbeat",
    "LeaseRow",
    "LeaseRowNow",
    "Takeover",
    "acquire",
    "check_lease_seconds",
    "fenced",
    "holder_gone",
    "iso",
    "lease_lost",
    "lease_state",
    "locked",
    "owner_gone",
    "pid_alive",
    "process_identity",
    "release",
    "renew",
    "take_over",
    "takeover_reason",
]


#: Never an owner's name: asks :func:`takeover_reason` whether anyone but the holder may take the
#: lease (whether the holder keeps it), judging the holder's own lease as anyone else's.
NOBODY = "\x00graphflow-durable nobody"


def check_lease_seconds(value: object, option: str = "lease_seconds") -> float:
    """``value`` as a lease period, or :class:`UsageError` naming ``option``: a finite number
    greater than 0 (a lease of 0 s or less is expired as it is taken, so any other process could
    take a live run over while its agents run)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(f"{option} must be a number greater than 0, not {value!r}", option=option)
    return float(value)


class LeaseRow(Protocol):
    """The lease columns of a run's row (``statements.LEASE_COLUMNS``), the one type the lease
    rules read: a SQLAlchemy ``Row`` selecting them satisfies it, and so does a ``RunRecord``."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def lease_host(self) -> str | None: ...
    @property
    def lease_pid(self) -> int | None: ...
    @property
    def lease_expires_at(self) -> float | None: ...
    @property
    def lease_process(self) -> str | None: ...


class LeaseRowNow(LeaseRow, Protocol):
    """A run's lease columns read under its lock, with its id and the lease clock's time then
    (``statements.SELECT_LEASE_NOW``; the queue's claimable runs): what :func:`take_over` reads."""

    @property
    def run_id(self) -> str: ...
    @property
    def db_now(self) -> float: ...


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


@functools.cache
def _boot_id() -> str | None:
    """This machine's boot id (Linux; ``None`` elsewhere): a new one after every reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read().strip() or None
    except OSError:
        return None


@functools.cache
def _pid_namespace() -> str | None:
    """This process's PID namespace (``"pid:[4026531836]"``; ``None`` off Linux)."""
    try:
        return str(Path("/proc/self/ns/pid").readlink())
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field 22), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # fields after "pid (comm)": the state is field 3, so field 22 is the 20th after ")"
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_identity(pid: int) -> str:
    """What identifies process ``pid`` of this PID namespace beyond host name and pid, as stored
    with a lease (JSON): the boot id, the PID namespace, and the process's start time."""
    if pid == os.getpid():
        return _own_identity(pid)
    return _identity(pid)


@functools.lru_cache(maxsize=1)
def _own_identity(pid: int) -> str:
    # This process's identity never changes while it lives (a forked child has another pid):
    # read /proc once, not for every run it creates or claims.
    return _identity(pid)


def _identity(pid: int) -> str:
    identity = {"boot": _boot_id(), "pidns": _pid_namespace(), "start": _start_time(pid)}
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


def owner_gone(row: LeaseRow) -> bool:
    """Whether the lease holder is provably dead (see :func:`holder_gone`)."""
    return holder_gone(row.lease_host, row.lease_pid, row.lease_process)


#: :func:`lease_state` values: the holder's lease is valid; it ran out; its process is provably gone.
HELD, EXPIRED, GONE = "held", "expired", "owner gone"


def lease_state(row: LeaseRow, now: float) -> str | None:
    """How a run's lease stands at lease-clock time ``now`` (``runs list``, ``runs show``, the
    console): :data:`HELD`, :data:`EXPIRED`, :data:`GONE` (a process of this host, boot and PID
    namespace that no longer runs), or ``None`` (nobody holds it)."""
    if row.lease_owner is None:
        return None
    if row.lease_expires_at is None or row.lease_expires_at < now:
        return EXPIRED
    return GONE if owner_gone(row) else HELD


def holder_gone(host: str | None, pid: int | None, process: str | None) -> bool:
    """Whether the holder ``pid`` on ``host`` with identity ``process`` is provably dead: a process
    on this host, of this boot and this PID namespace, whose pid no longer exists or now belongs to
    a process started at another time. An unknown identity (a lease written before schema version
    5), another boot or another PID namespace (another container with the same host name) proves
    nothing: wait for expiry."""
    if host != socket.gethostname() or pid is None or not process:
        return False
    try:
        recorded = json.loads(process)
    except ValueError:
        return False
    if not isinstance(recorded, dict):
        return False
    if recorded.get("boot") != _boot_id() or recorded.get("pidns") != _pid_namespace():
        return False
    pid = int(pid)
    if not pid_alive(pid):
        return True
    started, now_started = recorded.get("start"), _start_time(pid)
    return started is not None and now_started is not None and started != now_started


def takeover_reason(row: LeaseRow, owner: str, now: float) -> str | None:
    """Why ``owner`` may take the lease now (``"free"``, ``"same owner"``, ``"expired"``,
    ``"holder process N is gone"``), or ``None`` if the current holder keeps it."""
    if row.lease_owner is None:
        return "free"
    if row.lease_owner == owner:
        return "same owner"
    if row.lease_expires_at is None or row.lease_expires_at < now:
        return "expired"
    if owner_gone(row):
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


def fenced(conn: sa.Connection, run_id: str, fencing_token: int | None, *, lock: bool = False) -> None:
    """A driver's write that is not a commit (an input request, an answer, a call record): refused,
    before anything is written, unless ``fencing_token`` is still the run's (``None``: not a
    driver's write, nothing checked unless ``lock``). Checked, the run's row stays locked to the end
    of the transaction (PostgreSQL ``FOR UPDATE``; SQLite: the write lock), and a missing run is
    :class:`RunNotFoundError`; ``lock`` does the same without a token (a write that must be
    serialised with the run's other writes, e.g. to number its rows)."""
    if fencing_token is None and not lock:
        return
    row = conn.execute(S.SELECT_LEASE.with_for_update(), {"p_run_id": run_id}).first()
    if row is None:
        raise S.not_found(run_id)
    if fencing_token is not None and row.fencing_token != fencing_token:
        raise lease_lost(run_id, fencing_token, row)


@dataclass(frozen=True)
class Takeover:
    """A lease taken by :func:`take_over`: the new fencing token, why it was allowed, its expiry."""

    token: int
    reason: str
    expires_at: float


def take_over(
    conn: sa.Connection,
    row: LeaseRowNow,
    *,
    asking: str,
    owner: str,
    host: str,
    pid: int,
    lease_seconds: float,
    now: float,
) -> Takeover | None:
    """Take the lease of the run ``row`` was read from (under its lock) for ``owner`` if
    :func:`takeover_reason` lets ``asking`` (``owner`` itself, or :data:`NOBODY` to judge the
    holder's own lease as anyone else's): the store's next fencing token, written with the new
    holder in one statement that checks the rule again by the lease clock. ``None`` (nothing
    changed) when the holder keeps it, or the row changed since it was read (SQLite cannot lock
    it; or the database's clock went back between the two statements).
    """
    reason = takeover_reason(row, asking, float(row.db_now))
    if reason is None:
        return None
    token = S.next_token(conn)  # after the row's lock (SQLite: the write lock): a run's tokens only grow
    process = process_identity(pid)
    if row.lease_pid is not None and (row.lease_host, row.lease_pid, row.lease_process or "") != (
        host,
        pid,
        process,
    ):  # a run left running by another process died with it (recorded only if still running)
        deaths.record(
            conn, row.run_id, (str(row.lease_host), int(row.lease_pid), row.lease_process or ""), now
        )
    expires = conn.execute(
        S.UPDATE_LEASE,
        {
            "p_run_id": row.run_id,
            "p_now": now,
            "p_old_token": row.fencing_token,
            "p_token": token,
            "p_owner": owner,
            "p_host": host,
            "p_pid": pid,
            "p_process": process,
            "p_seconds": lease_seconds,
            # the holder is alive by the clock, but take_over proved its process dead
            "p_early": reason.startswith("holder process"),
        },
    ).scalar()
    return None if expires is None else Takeover(token, reason, float(expires))


def acquire(
    conn: sa.Connection,
    run_id: str,
    owner: str,
    lease_seconds: float,
    host: str,
    pid: int,
    sealer: Sealer = PLAIN,
    url: str | None = None,
) -> tuple[int, str, str | None]:
    """Take the lease for ``owner``: the new fencing token (the store's next), why it was allowed, the
    previous owner. A store with a codec marks the run sealed (its commits will be); one without
    refuses a sealed run, whose commits it would write in plain.

    Raises RunNotFoundError, RunLockedError or StoreConfigError (nothing changed).
    """
    now = time.time()
    p = {"p_run_id": run_id, "p_now": now}
    row = conn.execute(S.SELECT_LEASE_NOW.with_for_update(), p).first()
    if row is None:
        raise S.not_found(run_id)
    if not row.sealed and sealer.on:
        conn.execute(sa.update(runs).where(runs.c.run_id == run_id).values(sealed=True))
    elif row.sealed and not sealer.on:
        raise keyless(run_id, url, "driving it")
    taken = take_over(
        conn, row, asking=owner, owner=owner, host=host, pid=pid, lease_seconds=lease_seconds, now=now
    )
    if taken is None:  # a live holder keeps it (or the database's clock went back meanwhile)
        again = conn.execute(S.SELECT_LEASE, p).first()
        raise locked(run_id, again) if again is not None else S.not_found(run_id)
    return taken.token, taken.reason, row.lease_owner


@dataclass(frozen=True)
class Heartbeat:
    """A lease renewal as its holder sees it (the driver's ``heartbeat``).

    Attributes:
        expires_at: the lease's new expiry (epoch seconds, by the lease clock).
        cancel_requested_at: when a cancel of the run was requested (:meth:`Store.cancel_run`), not
            yet honoured; ``None``: none. The holder stops dispatching and records ``cancelled``.
    """

    expires_at: float
    cancel_requested_at: float | None


def renew(
    conn: sa.Connection, run_id: str, owner: str, fencing_token: int, lease_seconds: float
) -> Heartbeat:
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
            raise S.not_found(run_id)
        raise lease_lost(run_id, fencing_token, row, owner)
    cancel = renewed.cancel_requested_at
    return Heartbeat(float(renewed.lease_expires_at), None if cancel is None else float(cancel))


def release(conn: sa.Connection, run_id: str, fencing_token: int) -> bool:
    """Give the lease up if ``fencing_token`` still holds it; whether it did."""
    return bool(conn.execute(S.RELEASE_LEASE, {"p_run_id": run_id, "p_token": fencing_token}).rowcount)
