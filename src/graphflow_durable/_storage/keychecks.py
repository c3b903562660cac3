"""The key check values a store keeps (``graphflow_key_checks``): read, and kept the first time.

A check value is a short, non-secret digest of a key (``Codec.check_value``). The first store that
seals with a key id inserts it (an insert that does nothing when a row is already there, so racing
stores keep one); every store with a key of that id compares its own digest with the kept one, so
a wrong key is refused as such instead of every row it opens being reported as damaged.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from graphflow_durable._storage.engine import Engines, guarded
from graphflow_durable._storage.schema import key_checks
from graphflow_durable._storage.sealing import Sealer
from graphflow_durable.crypto import Codec

__all__ = ["keep", "kept", "store_sealer"]


def store_sealer(engines: Engines, codec: Codec, *, allow_plaintext: bool) -> Sealer:
    """The sealer of a store opened with ``codec``: it reads and keeps check values through the
    store's engines, a database fault raised as a :class:`StoreError`."""

    def check(key_id: str) -> str | None:
        with guarded(engines, "reading a key check value"):
            return kept(engines.read, key_id)

    def keep_value(key_id: str, value: str) -> str:
        with guarded(engines, "keeping a key check value"):
            return keep(engines.write, key_id, value)

    return Sealer(codec, allow_plaintext=allow_plaintext, check=check, keep=keep_value, url=engines.url)


def kept(read: Engine, key_id: str) -> str | None:
    """The check value kept for ``key_id``, or ``None`` when none is."""
    with read.begin() as conn:
        value = conn.execute(
            sa.select(key_checks.c.check_value).where(key_checks.c.key_id == key_id)
        ).scalar_one_or_none()
    return None if value is None else str(value)


def keep(write: Engine, key_id: str, value: str) -> str:
    """Keep ``value`` for ``key_id`` unless one is kept already; return the one kept."""
    row = {"key_id": key_id, "check_value": value, "created_at": time.time()}
    insert = (sqlite if write.dialect.name == "sqlite" else postgresql).insert(key_checks)
    with write.begin() as conn:
        conn.execute(insert.values(**row).on_conflict_do_nothing(index_elements=["key_id"]))
        found = conn.execute(
            sa.select(key_checks.c.check_value).where(key_checks.c.key_id == key_id)
        ).scalar_one()
    return str(found)
