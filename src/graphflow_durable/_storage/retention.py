"""Deleting runs and retention, and the store's statistics.

Deleting a run removes its steps, messages, agent states, requests for human input and queue row,
and its nested runs: the
runs recorded with ``parent_run_id`` equal to it, and the runs a nested durable team drove inside
its agents' turns (run id ``RUN/node/step/team``), recursively. A run that is ``running`` or held
by a live driver is refused (``delete``) or skipped (``prune``) unless forced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.records import RUN_STATUSES
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.admin import held, run_state
from graphflow_durable._storage.lease import iso
from graphflow_durable._storage.rows import not_found
from graphflow_durable._storage.schema import agent_states, input_requests, messages, queue, runs, steps
from graphflow_durable.errors import RunStateError, UsageError

__all__ = ["TABLES", "Removal", "StoreStats", "check_prune", "delete", "prune", "stats"]

_R = runs.c
#: The package's tables, children first (the order rows are deleted in).
TABLES: tuple[sa.Table, ...] = (agent_states, messages, steps, input_requests, queue, runs)
#: Statuses whose runs are never picked by ``prune`` or ``delete`` without ``force``.
_ACTIVE = "running"
#: At most this many run ids per ``IN (...)`` list (SQLite's parameter limit is far above it).
_CHUNK = 500


@dataclass(frozen=True)
class Removal:
    """What :meth:`Store.delete_run` or :meth:`Store.prune` removed (or, with ``dry_run``, would).

    Attributes:
        run_ids: the runs removed, nested runs included, in the order found.
        rows: rows removed per table (every table of the store, 0 included).
        skipped: runs that matched but were left alone because they are running (``prune``
            without ``force``).
        dry_run: nothing was removed; the counts are what a real call would remove now.
    """

    run_ids: tuple[str, ...]
    rows: Mapping[str, int]
    skipped: tuple[str, ...] = ()
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "run_ids": list(self.run_ids),
            "rows": dict(self.rows),
            "skipped": list(self.skipped),
            "dry_run": self.dry_run,
        }


@dataclass(frozen=True)
class StoreStats:
    """What :meth:`Store.stats` counts.

    Attributes:
        runs: runs per status (every status, 0 included).
        submissions: submissions whose run was not created yet.
        rows: rows per table.
        bytes: bytes per table, its indexes included (SQLite: pages of the ``dbstat`` table;
            PostgreSQL: ``pg_total_relation_size``); ``None`` where the database cannot say
            (SQLite built without ``dbstat``).
    """

    runs: Mapping[str, int]
    submissions: int
    rows: Mapping[str, int]
    bytes: Mapping[str, int | None]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "runs": dict(self.runs),
            "submissions": self.submissions,
            "rows": dict(self.rows),
            "bytes": dict(self.bytes),
        }


def _nested(conn: sa.Connection, parents: Sequence[str]) -> list[str]:
    """The runs nested in ``parents`` (one level): ``parent_run_id`` among them, or a run id
    ``PARENT/node/step/team`` (the id a nested durable team derives from its outer turn)."""
    found: list[str] = []
    for chunk in _chunks(parents):
        by_parent = sa.select(_R.run_id).where(_R.parent_run_id.in_(chunk))
        found.extend(conn.execute(by_parent).scalars())
        for parent in chunk:
            pattern = _escape(parent) + "/%"
            derived = sa.select(_R.run_id).where(_R.run_id.like(pattern, escape="\\"))
            for child in conn.execute(derived).scalars():
                node, step, team = ([*child[len(parent) + 1 :].split("/", 2), "", ""])[:3]
                if node and step.isdigit() and team and "/" not in team:
                    found.append(child)
    return list(dict.fromkeys(found))


def _family(conn: sa.Connection, run_ids: Iterable[str]) -> list[str]:
    """``run_ids`` and every run nested in them, at any depth."""
    seen = dict.fromkeys(run_ids)
    level = list(seen)
    while level:
        level = [child for child in _nested(conn, level) if child not in seen]
        seen.update(dict.fromkeys(level))
    return list(seen)


def _active(conn: sa.Connection, run_ids: Sequence[str], now: float, lock: bool) -> list[str]:
    """Of ``run_ids``, those running or held by a live driver (``lock``: their rows locked until the
    transaction ends, so that none is taken while it deletes them)."""
    found = []
    for run_id in run_ids:
        row = run_state(conn, run_id, now, lock=lock)
        if row is not None and (row.status == _ACTIVE or held(row)):
            found.append(run_id)
    return found


def _remove(conn: sa.Connection, run_ids: Sequence[str], dry_run: bool) -> dict[str, int]:
    """Delete (or, ``dry_run``, count) every row of ``run_ids``; rows per table."""
    rows = {table.name: 0 for table in TABLES}
    for chunk in _chunks(run_ids):
        for table in TABLES:
            where = table.c.run_id.in_(chunk)
            if dry_run:
                rows[table.name] += int(conn.execute(sa.select(sa.func.count()).where(where)).scalar_one())
            else:
                rows[table.name] += int(conn.execute(sa.delete(table).where(where)).rowcount)
    return rows


def delete(conn: sa.Connection, run_id: str, now: float, *, force: bool, dry_run: bool) -> Removal:
    """Delete ``run_id`` (a run, or a submission whose run was not created yet) with its nested runs.

    Raises RunNotFoundError, or RunStateError when it (or a nested run) is running or held by a
    live driver and ``force`` is false.
    """
    exists = conn.execute(S.SELECT_LEASE, {"p_run_id": run_id}).first() is not None
    if not exists and conn.execute(sa.select(queue.c.run_id).where(queue.c.run_id == run_id)).first() is None:
        raise not_found(run_id)
    family = _family(conn, [run_id]) if exists else [run_id]
    if not force and (busy := _active(conn, family, now, not dry_run)):
        row = run_state(conn, busy[0], now, lock=False)
        holder = (
            f"held by {row.lease_owner} until {iso(row.lease_expires_at)}"
            if row.lease_owner is not None
            else "with no driver"
        )
        which = "it is" if busy[0] == run_id else f"its nested run {busy[0]} is"
        raise RunStateError(
            f"run {run_id} was not deleted: {which} {row.status} ({holder}); cancel it first "
            "(graphflow-durable runs cancel) and wait for it to stop, or pass force=True (--force) to "
            "delete it anyway (its driver then fails on its next write)",
            run_id=run_id,
            status=row.status,
        )
    return Removal(tuple(family), _remove(conn, family, dry_run), dry_run=dry_run)


def check_prune(statuses: Sequence[str], older_than: float, force: bool) -> None:
    """Refuse a prune that names an unknown status, a negative age, or running runs without ``force``."""
    if not statuses:
        raise UsageError("prune needs at least one status (e.g. finished)", option="status")
    for status in statuses:
        if status not in RUN_STATUSES:
            raise UsageError(
                f"prune: unknown status {status!r}; expected one of {', '.join(RUN_STATUSES)}",
                option="status",
            )
    if not math.isfinite(older_than) or older_than < 0:
        raise UsageError(
            f"prune: older_than must be 0 seconds or more, not {older_than}", option="older_than"
        )
    if _ACTIVE in statuses and not force:
        raise RunStateError(
            "prune: running runs are being driven (or were, by a driver that died); pass force=True "
            "(--force) to prune them anyway, or cancel them first",
            status=_ACTIVE,
        )


def prune(
    conn: sa.Connection, statuses: Sequence[str], older_than: float, now: float, *, force: bool, dry_run: bool
) -> Removal:
    """Delete (``dry_run``: count) the runs with one of ``statuses`` last updated more than
    ``older_than`` seconds before ``now``, with their nested runs; a run running or held by a live
    driver (or with such a nested run) is skipped unless ``force``."""
    check_prune(statuses, older_than, force)
    query = (
        sa.select(_R.run_id)
        .where(_R.status.in_(list(statuses)), _R.updated_at < now - older_than)
        .order_by(_R.updated_at, _R.run_id)
    )
    chosen: list[str] = []
    skipped: list[str] = []
    for run_id in conn.execute(query).scalars():
        if run_id in chosen:
            continue  # nested in a run chosen before
        family = _family(conn, [run_id])
        if not force and _active(conn, family, now, not dry_run):
            skipped.append(run_id)
            continue
        chosen.extend(r for r in family if r not in chosen)
    return Removal(tuple(chosen), _remove(conn, chosen, dry_run), tuple(skipped), dry_run)


def stats(conn: sa.Connection) -> StoreStats:
    """Runs per status, waiting submissions, rows and bytes per table."""
    per_status: dict[str, int] = dict.fromkeys(RUN_STATUSES, 0)
    for status, count in conn.execute(sa.select(_R.status, sa.func.count()).group_by(_R.status)):
        per_status[str(status)] = int(count)
    waiting = (
        sa.select(sa.func.count()).select_from(queue).where(~sa.exists().where(_R.run_id == queue.c.run_id))
    )
    rows = {t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()) for t in TABLES}
    return StoreStats(per_status, int(conn.execute(waiting).scalar_one()), rows, _bytes(conn))


_SQLITE_BYTES = sa.text(
    "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat AS d JOIN sqlite_master AS m ON m.name = d.name "
    "GROUP BY m.tbl_name"
)
_PG_BYTES = sa.text("SELECT pg_total_relation_size(to_regclass(:name))")


def _bytes(conn: sa.Connection) -> dict[str, int | None]:
    names = [t.name for t in TABLES]
    if conn.dialect.name == "postgresql":
        return {n: int(conn.execute(_PG_BYTES, {"name": n}).scalar_one() or 0) for n in names}
    try:
        with conn.begin_nested():
            found = {str(name): int(size) for name, size in conn.execute(_SQLITE_BYTES)}
    except sa.exc.OperationalError:  # SQLite built without the dbstat virtual table
        return dict.fromkeys(names, None)
    return {n: found.get(n, 0) for n in names}


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])


def _escape(text: str) -> str:
    """``text`` as a literal LIKE prefix (escape character ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
