"""Sealed columns: how a content value is stored under the store's codec, and opened again.

A sealed value is text, so every content column keeps its type on both backends::

    gfd1:<key id>:<base64 of nonce + ciphertext + tag>

Every stored content value is JSON text or NULL when plain, so it never starts with ``gfd1:``;
the prefix is how a reader tells the two apart without a key. The associated data of each value
is its place, ``table, run id, position, column``: a value copied into another run, another seq
or another column does not authenticate there. Checksums are computed over the stored text (the
ciphertext), so ``runs verify`` checks a sealed store without its keys.

Fail closed: a store with a codec refuses a plain content row (unless ``allow_plaintext``, the
migration window), and a store without one refuses to hand out a sealed row, naming its key id.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any, overload

from graphflow_durable._model.records import RunRecord, SealedValue
from graphflow_durable.crypto import KEY_ID, Codec, OpenFailed
from graphflow_durable.errors import StoreConfigError, StoreCorruptError

__all__ = [
    "PLAIN",
    "PREFIX",
    "SEALED",
    "keyless",
    "openable",
    "unheld",
    "seal_commit",
    "Sealer",
    "aad",
    "key_of",
    "is_sealed",
    "position_of",
]

PREFIX = "gfd1:"

#: The sealed columns: table name -> (how a row's position is formed, its content columns).
#: Positions: ``"run"`` and ``"queue"`` (the literal: one row per run), ``"seq"`` (the row's
#: ``seq``, an int), ``"node@step_seq"`` (``f"{node}@{step_seq}"``), ``"request_id"`` (the
#: request's id). Every other column stays plain (docs/encryption.md, "What stays plain").
SEALED: dict[str, tuple[str, tuple[str, ...]]] = {
    "graphflow_runs": ("run", ("task", "result")),
    "graphflow_steps": ("seq", ("data",)),
    "graphflow_messages": ("seq", ("body",)),
    "graphflow_agent_states": ("node@step_seq", ("body",)),
    "graphflow_queue": ("queue", ("task", "last_error")),
    "graphflow_input_requests": ("request_id", ("prompt", "answer", "default_answer")),
    "graphflow_call_records": ("seq", ("result",)),
}


def is_sealed(stored: str | None) -> bool:
    """Whether a stored content value is sealed (by any key)."""
    return stored is not None and stored.startswith(PREFIX)


def key_of(stored: str) -> str | None:
    """The key id a sealed value names, or ``None`` for a plain (or malformed) value."""
    if not stored.startswith(PREFIX):
        return None
    key_id, sep, _ = stored[len(PREFIX) :].partition(":")
    return key_id if sep and KEY_ID.fullmatch(key_id) else None


def position_of(table: str, row: Mapping[str, Any]) -> str | int:
    """The position of ``row`` (a mapping of its columns) of ``table``, as :data:`SEALED` forms it."""
    form = SEALED[table][0]
    if form in ("run", "queue"):
        return form
    if form == "seq":
        return int(row["seq"])
    if form == "node@step_seq":
        return f"{row['node']}@{row['step_seq']}"
    return str(row["request_id"])


def aad(table: str, run_id: str, position: str | int, column: str) -> bytes:
    """The associated data binding a sealed value to its place."""
    return f"{table}\x1f{run_id}\x1f{position}\x1f{column}".encode()


class Sealer:
    """The store's codec applied to its content columns (a no-op when the store has none).

    ``check`` looks up the key check value the store keeps for a key id (``None`` if none is
    kept yet); the sealer compares it once per key id, so a wrong key is told apart from a damaged
    row. ``url`` is the store's URL (password hidden), for messages.
    """

    def __init__(
        self,
        codec: Codec | None,
        *,
        allow_plaintext: bool = False,
        check: Callable[[str], str | None] | None = None,
        keep: Callable[[str, str], str] | None = None,
        url: str | None = None,
    ) -> None:
        self.codec = codec
        self.allow_plaintext = allow_plaintext
        self._check = check
        self._keep = keep
        self._checked: set[str] = set()  # compared with the value kept (or none can be kept)
        self._looked: set[str] = set()  # looked up to open with: none was kept
        self._url = url

    @property
    def on(self) -> bool:
        return self.codec is not None

    def holds(self, key_id: str) -> bool:
        """Whether the store was opened with a key of id ``key_id``."""
        return self.codec is not None and self.codec.has_key(key_id)

    def seal(
        self,
        text: str | None,
        table: str,
        run_id: str,
        position: str | int,
        column: str,
        *,
        key_id: str | None = None,
    ) -> str | None:
        """``text`` as stored: sealed under ``key_id`` (default: the active key), or as it is without a codec."""
        if text is None or self.codec is None:
            return text
        key_id = self.codec.active if key_id is None else key_id
        if key_id not in self._checked:
            self.verify_key(key_id, keep=True)
        body = self.codec.seal(key_id, text.encode(), aad(table, run_id, position, column))
        return f"{PREFIX}{key_id}:{base64.b64encode(body).decode('ascii')}"

    @overload
    def open(
        self,
        stored: str,
        table: str,
        run_id: str,
        position: str | int,
        column: str,
        *,
        seq: int | None = None,
        node: str | None = None,
    ) -> str: ...

    @overload
    def open(
        self,
        stored: str | None,
        table: str,
        run_id: str,
        position: str | int,
        column: str,
        *,
        seq: int | None = None,
        node: str | None = None,
    ) -> str | None: ...

    def open(
        self,
        stored: str | None,
        table: str,
        run_id: str,
        position: str | int,
        column: str,
        *,
        seq: int | None = None,
        node: str | None = None,
    ) -> str | None:
        """The text of a stored value; raises when it cannot be trusted (see the module's docstring)."""
        if stored is None:
            return None
        where = f"{table} row (run {run_id!r}, {_place(position)}, column {column})"
        if not stored.startswith(PREFIX):
            if self.codec is not None and not self.allow_plaintext:
                raise StoreCorruptError(
                    f"{where} is plain text in a store opened with a codec: if the store is being "
                    f"encrypted, run `graphflow-durable runs rekey --encrypt` or open it with "
                    f"allow_plaintext=True meanwhile",
                    url=self._url,
                    run_id=run_id,
                    table=table,
                    seq=seq,
                    node=node,
                )
            return stored
        key_id = key_of(stored)
        if key_id is None:
            raise StoreCorruptError(
                f"{where} has a malformed sealed value",
                url=self._url,
                run_id=run_id,
                table=table,
                seq=seq,
                node=node,
            )
        if self.codec is None or not self.codec.has_key(key_id):
            raise unheld(where, key_id, self._url)
        if key_id not in self._checked:
            self.verify_key(key_id)
        try:
            body = base64.b64decode(stored[len(PREFIX) + len(key_id) + 1 :], validate=True)
            return self.codec.open(key_id, body, aad(table, run_id, position, column)).decode()
        except (OpenFailed, binascii.Error, ValueError):
            raise StoreCorruptError(
                f"{where} does not open under key {key_id!r}: it was changed, truncated or moved "
                f"from another row; restore it from a backup",
                url=self._url,
                run_id=run_id,
                table=table,
                seq=seq,
                node=node,
            ) from None

    def verify_key(self, key_id: str, *, keep: bool = False) -> None:
        """Refuse a key whose check value differs from the one the store keeps for its id.

        ``keep``: the key is about to seal, so its check value is kept if none is yet (in a
        transaction of its own: call this before a write transaction that seals with a key other
        than the active one, which the store checks when it opens).
        """
        if key_id in self._checked or self.codec is None or (not keep and key_id in self._looked):
            return
        kept = self._check(key_id) if self._check is not None else None
        if kept is None and keep and self._keep is not None:
            kept = self._keep(key_id, self.codec.check_value(key_id))
        if kept is not None and kept != self.codec.check_value(key_id):
            raise StoreConfigError(
                f"key {key_id!r} is not the key this store's rows were sealed with (its check value "
                f"differs): give the original key material for {key_id!r}",
                url=self._url,
                option="codec",
            )
        if kept is not None or self._keep is None:
            self._checked.add(key_id)
        else:
            self._looked.add(key_id)


def unheld(where: str, key_id: str, url: str | None) -> StoreConfigError:
    """The refusal to open ``where``, sealed with key ``key_id``, which the store does not hold."""
    return StoreConfigError(
        f"{where} is sealed with key {key_id!r}, which this store was not opened with: "
        f"set GRAPHFLOW_DURABLE_KEYS (or pass codec=) with key {key_id!r}",
        url=url,
        option="codec",
    )


def openable(run: RunRecord, url: str | None) -> RunRecord:
    """``run`` as a listing read it, refused (naming the key) when its task or result is a
    :class:`SealedValue`: a driver, a load or a fork never goes on without the run's keys."""
    for column in ("task", "result"):
        value = getattr(run, column)
        if isinstance(value, SealedValue):
            where = f"graphflow_runs row (run {run.run_id!r}, run, column {column})"
            raise unheld(where, value.key_id, url)
    return run


def keyless(run_id: str, url: str | None, doing: str) -> StoreConfigError:
    """The refusal of a store without a codec to write into the sealed run ``run_id``."""
    error = StoreConfigError(
        f"run {run_id!r} holds sealed content and this store has no codec: {doing} would store "
        f"plain text in it; open the store with its keys (GRAPHFLOW_DURABLE_KEYS, or codec=); "
        f"nothing was written",
        url=url,
        option="codec",
    )
    error.run_id = run_id
    return error


def seal_commit(
    sealer: Sealer,
    run_id: str,
    run: dict[str, Any],
    step: dict[str, Any],
    messages: list[dict[str, Any]],
    states: list[dict[str, Any]],
) -> None:
    """Seal the content of one encoded commit in place (before its checksums are computed)."""
    runs = "graphflow_runs"
    if run.get("p_task") is not None:
        run["p_task"] = sealer.seal(run["p_task"], runs, run_id, "run", "task")
    if run.get("p_result") is not None:
        run["p_result"] = sealer.seal(run["p_result"], runs, run_id, "run", "result")
    step["data"] = sealer.seal(step["data"], "graphflow_steps", run_id, step["seq"], "data")
    for m in messages:
        m["body"] = sealer.seal(m["body"], "graphflow_messages", run_id, m["seq"], "body")
    for a in states:
        where = f"{a['node']}@{a['step_seq']}"
        a["body"] = sealer.seal(a["body"], "graphflow_agent_states", run_id, where, "body")


#: The sealer of a store without a codec: plain values pass, a sealed one is refused naming its key.
PLAIN = Sealer(None)


def _place(position: str | int) -> str:
    return f"seq {position}" if isinstance(position, int) else str(position)
