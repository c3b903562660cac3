"""Sealed rows swept outside their driver: re-sealed under another key (``runs rekey``), sealed for
the first time (``runs rekey --encrypt``), opened one by one (``runs verify --decrypt``), and the
plain rows a sealed store still holds counted (``runs verify``).

A re-seal runs while workers drive runs. Rows are taken a batch at a time, each batch in one short
write transaction; every row is rewritten with a compare-and-set on its stored content (and its
checksum): a commit that changed the row since it was read wins, and the row is taken again by the
next pass, so nothing a run committed is lost or reordered. A row's content and its checksum
(computed over the new stored text, ``_storage.checksum``) change in one statement, so a rekey
killed at any point leaves every row sealed under the old key or the new one, and running it
again finishes the job. The old key must stay available until it has.

On SQLite, ``--encrypt`` runs with ``PRAGMA secure_delete`` (a replaced value's bytes are zeroed in
its page) and ends with a ``VACUUM`` and a WAL checkpoint, so no plaintext survives in free pages
or in the WAL. PostgreSQL keeps the old versions of updated rows until a ``VACUUM`` reclaims them
(and a plain ``VACUUM`` only marks their space free): docs/encryption.md says when a
``VACUUM FULL`` is wanted.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._storage import checksum as C
from graphflow_durable._storage.engine import Engines
from graphflow_durable._storage.schema import (
    agent_states,
    call_records,
    input_requests,
    key_checks,
    messages,
    queue,
    runs,
    steps,
)
from graphflow_durable._storage.sealing import PREFIX, SEALED, Sealer, is_sealed, key_of, position_of
from graphflow_durable._storage.statements import not_found
from graphflow_durable.errors import StoreConfigError, StoreCorruptError, UsageError

__all__ = ["BATCH", "Rekeyed", "SealAudit", "Unopened", "audit", "rekey"]

_log = logging.getLogger(__name__)

#: Rows re-sealed per write transaction: short enough that a commit waits a few milliseconds at most.
BATCH = 200
#: Sweeps over the store before a rekey gives up on rows that every sweep found changed meanwhile.
_PASSES = 8


@dataclass(frozen=True)
class _Place:
    """How a sealed table's rows are found, placed (``sealing.SEALED``) and checksummed."""

    table: sa.Table
    checksum: Callable[[Mapping[str, Any]], int] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return SEALED[self.table.name][1]

    @property
    def key(self) -> tuple[sa.Column[Any], ...]:
        return tuple(self.table.primary_key.columns)

    def position(self, row: Mapping[str, Any]) -> str | int:
        return position_of(self.table.name, row)

    def seq(self, row: Mapping[str, Any]) -> int | None:
        """The seq a message names the row by (a step's, a message's, a call record's; a state's step)."""
        value = row.get("seq", row.get("step_seq"))
        return None if value is None else int(value)

    def node(self, row: Mapping[str, Any]) -> str | None:
        value = row.get("node")
        return None if value is None else str(value)


def _step_sum(r: Mapping[str, Any]) -> int:
    return C.step_sum(r["run_id"], r["seq"], r["kind"], r["node"], r["data"], r["scheduler"])


def _message_sum(r: Mapping[str, Any]) -> int:
    return C.message_sum(r["run_id"], r["seq"], r["step_seq"], r["published"], r["body"])


def _state_sum(r: Mapping[str, Any]) -> int:
    return C.state_sum(r["run_id"], r["node"], r["step_seq"], r["base_step"], r["body"])


def _call_sum(r: Mapping[str, Any]) -> int:
    return C.call_sum(r["run_id"], r)


#: Every sealed table, in the order a rekey sweeps them, with the checksum over its stored text.
PLACES: tuple[_Place, ...] = (
    _Place(runs),
    _Place(queue),
    _Place(steps, _step_sum),
    _Place(messages, _message_sum),
    _Place(agent_states, _state_sum),
    _Place(input_requests),
    _Place(call_records, _call_sum),
)
assert {place.table.name for place in PLACES} == set(SEALED), "a sealed table rekey does not sweep"


@dataclass
class Rekeyed:
    """What a rekey did: rows re-sealed per table (``resealed``), and the rows still not under the
    target key because a commit changed them in every sweep (``left``; run it again)."""

    key_id: str
    resealed: dict[str, int] = field(default_factory=dict)
    left: int = 0
    vacuumed: bool = False

    @property
    def total(self) -> int:
        return sum(self.resealed.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key_id,
            "resealed": dict(self.resealed),
            "total": self.total,
            "left": self.left,
            "vacuumed": self.vacuumed,
        }


@dataclass(frozen=True)
class Unopened:
    """A sealed value that did not open: its row and why (the error's one line)."""

    table: str
    run_id: str
    position: str | int
    column: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "table": self.table,
            "position": self.position,
            "column": self.column,
            "problem": self.message,
        }


@dataclass
class SealAudit:
    """The sealing of a store's rows: values sealed and plain per table, the key ids in use, and
    (when the values were opened) those that did not open."""

    sealed: dict[str, int] = field(default_factory=dict)
    plain: dict[str, int] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)
    unopened: list[Unopened] = field(default_factory=list)
    opened: int = 0

    @property
    def plain_total(self) -> int:
        return sum(self.plain.values())

    @property
    def sealed_total(self) -> int:
        return sum(self.sealed.values())


def _needs(column: sa.Column[Any], target: str, encrypt: bool) -> sa.ColumnElement[bool]:
    """SQL: the column holds a value not sealed under ``target`` that this rekey seals again."""
    head = sa.func.substr(column, 1, len(target))
    wanted = head != target
    if not encrypt:
        wanted = sa.and_(wanted, sa.func.substr(column, 1, len(PREFIX)) == PREFIX)
    return sa.and_(column.is_not(None), wanted)


def _page(
    place: _Place,
    run_ids: Sequence[str] | None,
    target: str,
    encrypt: bool,
    after: tuple[Any, ...] | None,
    batch: int,
) -> sa.Select[Any]:
    t = place.table
    cond = sa.or_(*(_needs(t.c[name], target, encrypt) for name in place.columns))
    query = sa.select(t).where(cond)
    if run_ids is not None:
        query = query.where(t.c.run_id.in_(list(run_ids)))
    if after is not None:
        query = query.where(sa.tuple_(*place.key) > sa.tuple_(*after))
    return query.order_by(*place.key).limit(batch)


def _reseal(
    place: _Place, row: Mapping[str, Any], sealer: Sealer, key_id: str, encrypt: bool, target: str
) -> dict[str, Any]:
    """The row's new content values (only the columns that change)."""
    new: dict[str, Any] = {}
    name = place.table.name
    for column in place.columns:
        stored = row[column]
        if stored is None or stored.startswith(target) or (not encrypt and not is_sealed(stored)):
            continue
        position = place.position(row)
        if is_sealed(stored):
            text = sealer.open(
                stored, name, row["run_id"], position, column, seq=place.seq(row), node=place.node(row)
            )
        else:
            text = stored
        new[column] = sealer.seal(text, name, row["run_id"], position, column, key_id=key_id)
    return new


def _compare_and_set(
    conn: sa.Connection, place: _Place, row: Mapping[str, Any], new: Mapping[str, Any]
) -> bool:
    """Write ``new`` into ``row`` if the row still holds what was read; whether it did."""
    t = place.table
    values = dict(new)
    guard = [column == row[column.name] for column in place.key]
    guard += [t.c[name].is_not_distinct_from(row[name]) for name in place.columns]
    if place.checksum is not None:
        guard.append(t.c.checksum.is_not_distinct_from(row["checksum"]))
        if row["checksum"] is not None:
            values["checksum"] = place.checksum({**row, **new})
    done = conn.execute(sa.update(t).where(*guard).values(values))
    return done.rowcount == 1


@contextlib.contextmanager
def _secure_delete(e: Engines, on: bool) -> Iterator[sa.Connection]:
    """A write connection; on SQLite with ``on``, one whose replaced values are zeroed on disk."""
    with e.write.connect() as conn:
        raw = conn.connection.driver_connection if e.dialect == "sqlite" and on else None
        if raw is not None:
            raw.execute("PRAGMA secure_delete = ON")
        try:
            yield conn
        finally:
            if raw is not None:
                with contextlib.suppress(Exception):
                    raw.execute("PRAGMA secure_delete = OFF")


def rekey(
    e: Engines,
    sealer: Sealer,
    run_ids: Sequence[str] | None = None,
    *,
    to: str | None = None,
    encrypt: bool = False,
    batch: int = BATCH,
    progress: Callable[[str, int], None] | None = None,
) -> Rekeyed:
    """Seal every content value of the runs (default: all; the queue's rows included) under key
    ``to`` (default: the codec's active key): values sealed under another key always, plain values
    with ``encrypt``; ``batch`` rows per transaction. See the module for how a live run's rows are
    kept whole.

    Raises:
        StoreConfigError: the store has no codec, or no key ``to``, or a row's key is missing.
        StoreCorruptError: a sealed value does not open (nothing more is re-sealed).
    """
    if batch < 1:
        raise UsageError(f"batch={batch}: give at least 1 row per transaction", option="batch")
    codec = sealer.codec
    if codec is None:
        raise StoreConfigError(
            "runs rekey needs the store's keys: set GRAPHFLOW_DURABLE_KEYS (or pass codec=)",
            url=e.url,
            option="codec",
        )
    key_id = codec.active if to is None else to
    if not codec.has_key(key_id):
        raise StoreConfigError(
            f"no key {key_id!r} among the store's keys: add it to GRAPHFLOW_DURABLE_KEYS",
            url=e.url,
            option="to",
        )
    for run_id in run_ids or ():  # ids only: nothing is opened before the key is checked
        found = [sa.select(t.c.run_id).where(t.c.run_id == run_id) for t in (runs, queue)]
        with e.read.begin() as conn:
            if conn.execute(sa.union_all(*found)).first() is None:
                raise not_found(run_id)
    sealer.verify_key(key_id, keep=True)  # the key's check value kept before it seals a row
    target = f"{PREFIX}{key_id}:"
    done = Rekeyed(key_id, {place.table.name: 0 for place in PLACES})
    with _secure_delete(e, encrypt) as conn:
        if encrypt:  # first: from now on a store without the keys writes no plain row into them
            with conn.begin():
                mark = sa.update(runs).where(runs.c.sealed.is_(None) | (runs.c.sealed == sa.false()))
                if run_ids is not None:
                    mark = mark.where(runs.c.run_id.in_(list(run_ids)))
                conn.execute(mark.values(sealed=True))
        for _ in range(_PASSES):
            raced = 0
            for place in PLACES:
                after: tuple[Any, ...] | None = None
                while True:
                    with conn.begin():
                        page = conn.execute(_page(place, run_ids, target, encrypt, after, batch)).mappings()
                        rows = [dict(row) for row in page]
                        for row in rows:
                            new = _reseal(place, row, sealer, key_id, encrypt, target)
                            if new and _compare_and_set(conn, place, row, new):
                                done.resealed[place.table.name] += 1
                            elif new:
                                raced += 1
                    if rows and progress is not None:
                        progress(place.table.name, done.resealed[place.table.name])
                    if len(rows) < batch:
                        break
                    after = tuple(rows[-1][column.name] for column in place.key)
            if raced == 0:
                break
            _log.info("rekey: %d rows changed while they were re-sealed; sweeping again", raced)
        done.left = raced
    if encrypt and e.dialect == "sqlite":
        _vacuum(e)
        done.vacuumed = True
    _log.info("rekey: %d rows re-sealed under key %r (%s)", done.total, key_id, done.resealed)
    return done


def _vacuum(e: Engines) -> None:
    """Rebuild the SQLite file (no free page keeps a replaced value) and empty its WAL."""
    with e.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.execute("VACUUM")
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def audit(
    conn: sa.Connection,
    sealer: Sealer | None,
    run_ids: Sequence[str] | None = None,
    *,
    open_values: bool = False,
) -> SealAudit:
    """Count the plain and sealed content values of the runs (default: all), and with
    ``open_values`` open every sealed one under ``sealer``'s keys, recording each that does not."""
    found = SealAudit()
    if conn.execute(sa.select(key_checks.c.key_id).limit(1)).first() is None:
        return found  # no key ever sealed a value here: a plain store, nothing to count
    for place in PLACES:
        t, name = place.table, place.table.name
        query = sa.select(t)
        if run_ids is not None:
            query = query.where(t.c.run_id.in_(list(run_ids)))
        for found_row in conn.execute(query.order_by(*place.key)).mappings():
            row = dict(found_row)
            for column in place.columns:
                stored = row[column]
                if stored is None:
                    continue
                if not is_sealed(stored):
                    found.plain[name] = found.plain.get(name, 0) + 1
                    continue
                found.sealed[name] = found.sealed.get(name, 0) + 1
                key_id = key_of(stored) or "?"
                found.keys[key_id] = found.keys.get(key_id, 0) + 1
                if not open_values or sealer is None:
                    continue
                position = place.position(row)
                try:
                    sealer.open(
                        stored,
                        name,
                        row["run_id"],
                        position,
                        column,
                        seq=place.seq(row),
                        node=place.node(row),
                    )
                    found.opened += 1
                except StoreCorruptError as exc:
                    found.unopened.append(Unopened(name, row["run_id"], position, column, str(exc)))
    return found
