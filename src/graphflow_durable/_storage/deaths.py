"""Which process each run died with, and which other runs died with it.

A process that dies takes down every turn it had in flight, of every run it drove. To tell the turn
that killed it from the bystanders (see docs/retries.md, "Crash loops in a pool"), the store keeps,
at each takeover of a run its holder left ``running`` (the holder died, or stalled past its lease),
who that holder was (:func:`record`); the runs a dead holder drove are then those still leased to
it and those taken over from it (:func:`company`). Written only when a run is taken over from a
dead driver: nothing on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from graphflow_durable._storage.schema import deaths, runs

__all__ = ["KEEP_SECONDS", "Death", "company", "of_run", "record"]

_D, _R = deaths.c, runs.c

#: How long a death row is kept: long past the takeovers of the dead process's other runs.
KEEP_SECONDS = 7 * 24 * 3600.0


def record(conn: sa.Connection, run_id: str, holder: tuple[str, int, str], now: float) -> None:
    """In a takeover's transaction: ``run_id``, if its status is ``running``, died with ``holder``
    (host, pid, process identity) at its head now. Once per (head, holder); old rows go."""
    host, pid, process = holder
    same = sa.and_(
        _D.run_id == run_id,
        _D.head_seq == _R.head_seq,
        _D.holder_host == host,
        _D.holder_pid == pid,
        _D.holder_process == process,
    )
    died = sa.select(
        _R.run_id,
        _R.head_seq,
        sa.literal(host, sa.String),
        sa.literal(pid, sa.Integer),
        sa.literal(process, sa.String),
        sa.literal(now, sa.Double),
    ).where(_R.run_id == run_id, _R.status == "running", ~sa.exists().where(same))
    conn.execute(deaths.delete().where(_D.died_at < now - KEEP_SECONDS))
    conn.execute(
        deaths.insert().from_select(
            ["run_id", "head_seq", "holder_host", "holder_pid", "holder_process", "died_at"], died
        )
    )


def company(conn: sa.Connection, run_id: str, head_seq: int) -> frozenset[str] | None:
    """The other runs the process that ``run_id`` died with at ``head_seq`` drove (``None``: no
    death of the run recorded at that head, e.g. its holder was unknown): those still leased to
    it and ``running``, and those taken over from it. Runs nested in ``run_id`` and its outer run
    are part of its turn, never company."""
    last = conn.execute(
        sa.select(_D.holder_host, _D.holder_pid, _D.holder_process)
        .where(_D.run_id == run_id, _D.head_seq == head_seq)
        .order_by(_D.died_at.desc())
        .limit(1)
    ).first()
    if last is None:
        return None
    host, pid, process = last
    parent = conn.execute(sa.select(_R.parent_run_id).where(_R.run_id == run_id)).scalar()
    held = sa.select(_R.run_id).where(
        _R.lease_host == host,
        _R.lease_pid == pid,
        sa.func.coalesce(_R.lease_process, "") == process,
        _R.status == "running",
    )
    taken = sa.select(_D.run_id).where(
        _D.holder_host == host, _D.holder_pid == pid, _D.holder_process == process
    )
    found = {str(r) for r in conn.execute(sa.union(held, taken)).scalars()}
    if not found - {run_id}:
        return frozenset()
    children = conn.execute(sa.select(_R.run_id).where(_R.parent_run_id == run_id)).scalars()
    return frozenset(found - {run_id, parent, *children})


@dataclass(frozen=True)
class Death:
    """A takeover of a run from a holder that left it ``running`` (died, or stalled past its lease):
    the run's head then, the holder's host and pid, and when the takeover happened (epoch seconds)."""

    head_seq: int
    host: str
    pid: int
    died_at: float


def of_run(conn: sa.Connection, run_id: str) -> list[Death]:
    """The deaths recorded of ``run_id`` (kept :data:`KEEP_SECONDS`), in time order."""
    rows = conn.execute(
        sa.select(_D.head_seq, _D.holder_host, _D.holder_pid, _D.died_at)
        .where(_D.run_id == run_id)
        .order_by(_D.died_at, _D.head_seq, _D.holder_host, _D.holder_pid)
    )
    return [Death(int(h), str(host), int(pid), float(t)) for h, host, pid, t in rows]
