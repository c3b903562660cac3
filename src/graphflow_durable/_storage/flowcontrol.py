"""Flow control for the worker pool (schema version 15): named queues, their settings, and what a
claim may take under them.

A queue's settings (:class:`QueueSettings`, one row of ``graphflow_queue_settings``) bound how
many of its runs are driven at once across the pool (``concurrency``), by one worker
(``worker_concurrency``) and per partition key (``partition_concurrency``, 1 when unset), and how
many runs start or resume per period (``rate``). A queue with no row has no limits (but a partition
key still allows one driven run at a time).

Nothing here is a counter: a claim derives the load from the rows, inside its own transaction
(:class:`Gate`): the runs of each queue whose lease is unexpired and not held by a dead process of
this host, and the submissions whose claim is, plus the recent claims of ``graphflow_queue_starts``
for a rate. SQLite's write lock serialises the claimers; on PostgreSQL a claim that takes a run of a
capped queue (or of a partition) first takes that queue's transaction-scoped advisory lock
(:func:`lock_queue`: trying for a while, never blocking, so a claimer stopped inside its claim holds
up no one; a claim that does not get it leaves the queue to its next claim) and counts again under
it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.records import ENDED_STATUSES
from graphflow_durable._storage.schema import queue, queue_settings, queue_starts, runs
from graphflow_durable._storage.statements import DB_NOW, STATEMENT_NOW
from graphflow_durable.errors import UsageError

__all__ = [
    "DEFAULT_QUEUE",
    "SETTINGS",
    "Gate",
    "QueueSettings",
    "check_queue_name",
    "configure",
    "format_rate",
    "parse_rate",
    "queue_of",
    "read_settings",
]

_Q = queue.c
_R = runs.c
_S = queue_settings.c

#: The queue of a run submitted without one, and of a run never submitted.
DEFAULT_QUEUE = "default"
#: The settings ``configure`` takes and ``clear`` names.
SETTINGS = ("concurrency", "worker_concurrency", "partition_concurrency", "rate")
#: A run's queue: its queue row's, or the default for a run that has none.
queue_of: sa.ColumnElement[str] = sa.func.coalesce(_Q.queue, DEFAULT_QUEUE)
#: Statuses whose lease, even held, drives nothing a cap counts (ended, parked for a person).
_NOT_DRIVEN = (*ENDED_STATUSES, "cancelled", "failed", "waiting")
#: The namespace (first key) of the per-queue advisory locks on PostgreSQL.
_LOCK_SPACE = 0x67F1_0D0C
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")


@dataclass(frozen=True)
class QueueSettings:
    """A named queue's settings (``None``: no such limit).

    Attributes:
        queue: the queue's name.
        concurrency: at most this many of its runs driven at once across all workers.
        worker_concurrency: at most this many of its runs driven at once by one worker.
        partition_concurrency: at most this many driven at once per partition key (``None``: 1).
        rate: at most ``N`` run starts or resumptions per period, as ``"N/PERIOD"`` (``"100/60s"``).
    """

    queue: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    partition_concurrency: int | None = None
    rate: str | None = None

    @property
    def partition_cap(self) -> int:
        """Driven runs allowed per partition key."""
        return self.partition_concurrency or 1

    def rate_limit(self) -> tuple[int, float] | None:
        """``rate`` as ``(count, seconds)``, or ``None``."""
        return None if self.rate is None else parse_rate(self.rate)

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "concurrency": self.concurrency,
            "worker_concurrency": self.worker_concurrency,
            "partition_concurrency": self.partition_concurrency,
            "rate": self.rate,
        }


def check_queue_name(name: object, option: str = "queue") -> str:
    """``name`` if it is a usable queue name (non-empty text, no white space around it, printable,
    at most 200 characters); else :class:`UsageError`."""
    if not isinstance(name, str) or not name or name != name.strip() or len(name) > 200:
        raise UsageError(
            f"{option} must be a non-empty name of at most 200 characters with no white space around "
            f"it, not {name!r}",
            option=option,
        )
    if not name.isprintable():
        raise UsageError(
            f"{option} {name!r} holds a non-printable character; name it in plain text", option=option
        )
    return name


def parse_rate(text: object) -> tuple[int, float]:
    """``"N/PERIOD"`` (``100/60s``, ``5/1m``, ``1000/h``: PERIOD a number and ``s``, ``m``, ``h``
    or ``d``) as ``(N, seconds)``; :class:`UsageError` otherwise."""
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is not None:
        count, amount, unit = int(found.group(1)), float(found.group(2) or 1), found.group(3)
        seconds = amount * _UNITS[unit]
        if count > 0 and math.isfinite(seconds) and seconds > 0:
            return count, seconds
    raise UsageError(
        f"rate must be N/PERIOD with N a positive whole number and PERIOD like 1s, 60s, 1m or 1h "
        f"(e.g. 100/60s), not {text!r}",
        option="rate",
    )


def format_rate(count: int, seconds: float) -> str:
    """``(N, seconds)`` as ``"N/PERIODs"``."""
    return f"{count}/{seconds:g}s"


def _positive(option: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{option} must be a positive whole number, not {value!r}", option=option)
    return value


def check_settings(values: Mapping[str, object]) -> dict[str, Any]:
    """The given settings (``None``: not given) checked whole, as column values; :class:`UsageError`
    for the first bad one (nothing is written by the caller then)."""
    checked: dict[str, Any] = {}
    for option in ("concurrency", "worker_concurrency", "partition_concurrency"):
        if (number := _positive(option, values.get(option))) is not None:
            checked[option] = number
    if values.get("rate") is not None:
        checked["rate_count"], checked["rate_seconds"] = parse_rate(values["rate"])
        checked["rate"] = "".join(str(values["rate"]).split())  # as given, white space left out
    return checked


def _settings(row: Any) -> QueueSettings:
    rate = (
        None
        if row.rate_count is None
        else row.rate or format_rate(int(row.rate_count), float(row.rate_seconds))
    )
    return QueueSettings(
        queue=row.queue,
        concurrency=row.concurrency,
        worker_concurrency=row.worker_concurrency,
        partition_concurrency=row.partition_concurrency,
        rate=rate,
    )


def read_settings(conn: sa.Connection) -> dict[str, QueueSettings]:
    """Every configured queue's settings, by name."""
    return {row.queue: _settings(row) for row in conn.execute(sa.select(queue_settings))}


def configure(
    conn: sa.Connection, name: str, values: Mapping[str, Any], *, clear: Collection[str] = ()
) -> None:
    """Set the checked column ``values`` of queue ``name`` (its row made if it has none) and reset
    the settings named in ``clear`` to no limit."""
    columns = dict(values)
    for setting in clear:
        if setting == "rate":
            columns.update(rate_count=None, rate_seconds=None, rate=None)
        else:
            columns[setting] = None
    now = time.time()
    changed = conn.execute(
        sa.update(queue_settings).where(_S.queue == name).values(**columns, updated_at=now)
    ).rowcount
    if not changed:
        conn.execute(sa.insert(queue_settings).values(queue=name, **columns, updated_at=now))


# -- the load a claim derives from the rows --------------------------------------------------


def _alive(host_col: Any, pid_col: Any, here: str, dead: Collection[int]) -> sa.ColumnElement[bool]:
    """Not held by one of this host's processes found dead."""
    if not dead:
        return sa.true()
    return sa.not_(sa.and_(host_col == here, pid_col.in_(list(dead))))


def held_runs(here: str, dead: Collection[int]) -> tuple[sa.ColumnElement[bool], ...]:
    """The run rows (outer-joined to their queue rows) a cap counts: driven under a live lease."""
    return (
        _R.lease_owner.is_not(None),
        _R.lease_expires_at >= STATEMENT_NOW,  # stable: an index scan of the live leases
        _R.status.not_in(_NOT_DRIVEN),
        _alive(_R.lease_host, _R.lease_pid, here, dead),
    )


def held_submissions(here: str, dead: Collection[int]) -> tuple[sa.ColumnElement[bool], ...]:
    """The submissions a cap counts: claimed by a live worker that has not created the run yet."""
    return (
        _Q.claimed_by.is_not(None),
        _Q.claim_expires_at >= STATEMENT_NOW,
        ~sa.exists().where(_R.run_id == _Q.run_id),
        _alive(_Q.claim_host, _Q.claim_pid, here, dead),
    )


def _load_rows(
    conn: sa.Connection, *, owner: str, here: str, dead: Collection[int], now: float, only: str | None
) -> Iterable[Any]:
    """``(queue, partition, mine, n)``: the driven items per queue, partition and whether ``owner``
    holds them, read in ONE statement: a run created from its claimed submission (its claim stops
    counting as its lease starts, committed by another worker at any time) is seen as one or the
    other. Two statements (two snapshots at PostgreSQL's READ COMMITTED) could see it as neither."""
    mine_run = sa.case((_R.lease_owner == owner, 1), else_=0)
    mine_sub = sa.case((_Q.claimed_by == owner, 1), else_=0)
    by_runs = (
        sa.select(queue_of.label("q"), _Q.partition_key, mine_run.label("mine"), sa.func.count().label("n"))
        .select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
        .where(*held_runs(here, dead), sa.true() if only is None else queue_of == only)
        .group_by(queue_of, _Q.partition_key, mine_run)
    )
    by_claims = (
        sa.select(_Q.queue.label("q"), _Q.partition_key, mine_sub.label("mine"), sa.func.count().label("n"))
        .where(*held_submissions(here, dead), sa.true() if only is None else _Q.queue == only)
        .group_by(_Q.queue, _Q.partition_key, mine_sub)
    )
    return list(conn.execute(sa.union_all(by_runs, by_claims), {"p_now": now}))


def recent_starts(conn: sa.Connection, name: str, seconds: float, now: float) -> int:
    """How many runs of queue ``name`` started or resumed in the last ``seconds`` (lease clock)."""
    query = sa.select(sa.func.count()).where(
        queue_starts.c.queue == name, queue_starts.c.started_at > DB_NOW - seconds
    )
    return int(conn.execute(query, {"p_now": now}).scalar_one())


@dataclass
class Gate:
    """What one claim may take: the queues and partitions at a cap, and why (derived from the rows
    in the claim's transaction). Build it with :meth:`read`."""

    settings: dict[str, QueueSettings]
    active: dict[str, int] = field(default_factory=dict)
    mine: dict[str, int] = field(default_factory=dict)
    partitions: dict[tuple[str, str], int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    #: queue -> why it takes nothing now
    closed: dict[str, str] = field(default_factory=dict)
    #: (queue, partition) -> why it takes nothing now
    busy: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        conn: sa.Connection,
        *,
        owner: str,
        here: str,
        dead: Collection[int],
        now: float,
        settings: dict[str, QueueSettings] | None = None,
        only: str | None = None,
    ) -> Gate:
        """The load now (of queue ``only``, or of all) and the caps it reached."""
        gate = cls(read_settings(conn) if settings is None else settings)
        for row in _load_rows(conn, owner=owner, here=here, dead=dead, now=now, only=only):
            n = int(row.n)
            gate.active[row.q] = gate.active.get(row.q, 0) + n
            if row.mine:
                gate.mine[row.q] = gate.mine.get(row.q, 0) + n
            if row.partition_key is not None:
                key = (row.q, row.partition_key)
                gate.partitions[key] = gate.partitions.get(key, 0) + n
        for name, setting in gate.settings.items():
            if only is not None and name != only:
                continue
            if (limit := setting.rate_limit()) is not None:
                gate.starts[name] = recent_starts(conn, name, limit[1], now)
        gate._judge()
        return gate

    def _judge(self) -> None:
        for name, setting in self.settings.items():
            active, mine = self.active.get(name, 0), self.mine.get(name, 0)
            limit = setting.rate_limit()
            if setting.concurrency is not None and active >= setting.concurrency:
                self.closed[name] = (
                    f"queue {name} is at its concurrency cap ({active} of {setting.concurrency} driven)"
                )
            elif setting.worker_concurrency is not None and mine >= setting.worker_concurrency:
                self.closed[name] = (
                    f"queue {name} is at its worker concurrency cap in this worker "
                    f"({mine} of {setting.worker_concurrency})"
                )
            elif limit is not None and self.starts.get(name, 0) >= limit[0]:
                self.closed[name] = (
                    f"queue {name} is at its rate ({self.starts[name]} starts in the last "
                    f"{limit[1]:g} s, rate {setting.rate})"
                )
        for (name, part), n in self.partitions.items():
            cap = self.settings.get(name, QueueSettings(name)).partition_cap
            if n >= cap:
                self.busy[(name, part)] = f"partition {part} of queue {name} is busy ({n} of {cap} driven)"

    def locks(self, name: str, partition: str | None) -> bool:
        """Whether taking an item of queue ``name`` (``partition``) must be serialised per queue."""
        setting = self.settings.get(name)
        return partition is not None or (
            setting is not None and (setting.concurrency is not None or setting.rate is not None)
        )

    def why(self, name: str, partition: str | None) -> str | None:
        """Why an item of queue ``name`` (``partition``) cannot be taken now, or ``None``."""
        if name in self.closed:
            return self.closed[name]
        return None if partition is None else self.busy.get((name, partition))

    def shut(self, name: str, partition: str | None, why: str) -> None:
        """Take nothing more of queue ``name`` (of its ``partition`` only, when given) in this claim."""
        if partition is None:
            self.closed[name] = why
        else:
            self.busy[(name, partition)] = why

    def open_items(self, queue_col: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
        """The condition on queue rows (``queue_col``: their queue) that leaves out what is shut."""
        conditions: list[sa.ColumnElement[bool]] = []
        if self.closed:
            conditions.append(queue_col.not_in(sorted(self.closed)))
        parts: dict[str, list[str]] = {}
        for name, part in self.busy:
            parts.setdefault(name, []).append(part)
        for name, keys in sorted(parts.items()):
            conditions.append(
                sa.or_(queue_col != name, _Q.partition_key.is_(None), _Q.partition_key.not_in(keys))
            )
        return sa.and_(sa.true(), *conditions)

    def record_start(self, conn: sa.Connection, name: str, run_id: str, at: float) -> None:
        """Count a start of queue ``name`` at ``at`` (lease clock) for its rate, if it has one,
        deleting its starts older than the rate's period."""
        setting = self.settings.get(name)
        limit = None if setting is None else setting.rate_limit()
        if limit is None:
            return
        conn.execute(
            sa.delete(queue_starts).where(
                queue_starts.c.queue == name, queue_starts.c.started_at <= at - limit[1]
            )
        )
        conn.execute(sa.insert(queue_starts).values(queue=name, started_at=at, run_id=run_id))


def lock_queue(conn: sa.Connection, name: str, *, wait: float) -> bool:
    """PostgreSQL: take queue ``name``'s transaction-scoped advisory lock, trying for up to
    ``wait`` seconds (never blocking on it: a claimer stopped inside its claim, SIGSTOP or a VM
    pause, must not hold up every other claimer of the queue until it continues); whether it is
    held. Other databases serialise claims already: ``True``."""
    if conn.dialect.name != "postgresql":
        return True
    statement = sa.text("SELECT pg_try_advisory_xact_lock(CAST(:space AS integer), hashtext(:name))")
    deadline = time.monotonic() + wait
    while True:
        if conn.execute(statement, {"space": _LOCK_SPACE, "name": name}).scalar_one():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


# -- what the queues hold: queues list, runs show, the per-queue gauges ----------------------


def _items(conn: sa.Connection, now: float, run_id: str | None = None) -> list[dict[str, Any]]:
    """The unfinished items (submissions not started, unfinished runs), each with its queue,
    partition, whether it is driven, parked for a person, and when it may start."""
    held_lease = sa.and_(_R.lease_owner.is_not(None), _R.lease_expires_at >= DB_NOW)
    started = (
        sa.select(
            queue_of.label("queue"),
            _Q.partition_key,
            _R.status,
            held_lease.label("held"),
            _Q.not_before,
            sa.func.coalesce(_Q.created_at, _R.created_at).label("created_at"),
            sa.literal(False).label("submission"),
        )
        .select_from(runs.outerjoin(queue, _Q.run_id == _R.run_id))
        .where(_R.status.not_in(_NOT_DRIVEN[:-1]), sa.true() if run_id is None else _R.run_id == run_id)
    )
    waiting = sa.select(
        _Q.queue,
        _Q.partition_key,
        sa.literal("submitted").label("status"),
        sa.and_(_Q.claimed_by.is_not(None), _Q.claim_expires_at >= DB_NOW).label("held"),
        _Q.not_before,
        _Q.created_at,
        sa.literal(True).label("submission"),
    ).where(
        _Q.task.is_not(None),
        ~sa.exists().where(_R.run_id == _Q.run_id),
        sa.true() if run_id is None else _Q.run_id == run_id,
    )
    params = {"p_now": now}
    return [dict(row._mapping) for query in (started, waiting) for row in conn.execute(query, params)]


def queue_stats(conn: sa.Connection, here: str, now: float) -> list[dict[str, Any]]:
    """One dict per queue (configured, or holding unfinished items), by name: its settings and
    ``queued`` (not driven, not parked), ``claimable`` (queued, due, its queue and partition
    under their caps), ``active`` (driven), ``waiting`` (parked for a person), ``backing_off``
    (runs between retries), ``scheduled`` (submissions not due yet), ``oldest_queued_age`` (s)."""
    gate = Gate.read(conn, owner="", here=here, dead=(), now=now)
    found: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        setting = gate.settings.get(name, QueueSettings(name))
        counts = dict.fromkeys(("queued", "claimable", "active", "waiting", "backing_off", "scheduled"), 0)
        return found.setdefault(name, {**setting.to_json(), **counts, "oldest_queued_age": None})

    for name in gate.settings:
        entry(name)
    for item in _items(conn, now):
        row = entry(item["queue"])
        if item["status"] == "waiting":
            row["waiting"] += 1
        elif item["held"]:
            row["active"] += 1
        else:
            row["queued"] += 1
            age = max(now - float(item["created_at"]), 0.0)
            row["oldest_queued_age"] = max(row["oldest_queued_age"] or 0.0, age)
            if item["not_before"] is not None and item["not_before"] > now:
                row["scheduled" if item["submission"] else "backing_off"] += 1
            elif gate.why(item["queue"], item["partition_key"]) is None:
                row["claimable"] += 1
    return [found[name] for name in sorted(found)]


def why_not_started(conn: sa.Connection, run_id: str, here: str, now: float) -> str | None:
    """Why run ``run_id``, queued, is not being started now (not due, its queue or partition at a
    cap), or ``None`` (it is driven, finished, parked for a person, or claimable)."""
    items = _items(conn, now, run_id)
    if not items or items[0]["held"] or items[0]["status"] == "waiting":
        return None
    item = items[0]
    if item["not_before"] is not None and item["not_before"] > now:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(item["not_before"]))
        return f"not due until {when}"
    gate = Gate.read(conn, owner="", here=here, dead=(), now=now, only=item["queue"])
    return gate.why(item["queue"], item["partition_key"])
