"""``graphflow-durable runs rekey`` and the sealing half of ``runs verify``, for :mod:`.runs`.

A thin shell over :meth:`Store.rekey` and :meth:`Store.audit_sealing` (see docs/encryption.md):
``runs rekey`` re-seals the runs' rows under the active key (or ``--to KEY``), ``--encrypt`` seals
the plain rows of an existing store; ``runs verify --decrypt`` opens every sealed row, and a plain
``runs verify`` says how many content values a sealed store still holds in plain.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import click

from graphflow_durable._model.runid import check_run_id
from graphflow_durable.cli._common import INT, CliError, json_option, require_value, store_option
from graphflow_durable.store import Store

__all__ = ["EPILOG", "EXIT_LEFT", "add_command", "check", "rekey", "sealing_report"]

#: ``runs rekey``: rows a commit changed in every sweep are still under their old key (run it again).
EXIT_LEFT = 3

EPILOG = """\
  runs rekey [RUN ...] [--to KEY] [--encrypt] [--batch N] [--json]
                                     re-seal the runs' rows (default: all) under the active key
                                     (GRAPHFLOW_DURABLE_ACTIVE_KEY) or KEY, a batch at a time while
                                     workers drive them; --encrypt seals plain rows too (then
                                     vacuums a SQLite file); rows re-sealed per table
"""

Out = Callable[[str], None]


def add_command(runs: click.Group, dispatch: Callable[[str, dict[str, Any]], int]) -> None:
    """Add ``runs rekey`` to the ``runs`` group; it runs through ``dispatch``."""

    @runs.command(
        "rekey",
        help="re-seal the runs' rows under the active key (or --to KEY)\n\nRUN: the runs (default: all, "
        "and the queue's submissions)",
    )
    @store_option
    @click.argument("run_ids", nargs=-1, metavar="[RUN]...")
    @click.option("--to", "to", metavar="KEY", default=None, help="the key id to seal under")
    @click.option("--encrypt", is_flag=True, help="seal plain rows too (a store encrypted in place)")
    @click.option("--batch", type=INT, default=200, metavar="N", help="rows per transaction (default 200)")
    @json_option("one JSON object: key, resealed (rows per table), total, left, vacuumed")
    def _rekey_command(**params: Any) -> int:
        return dispatch("rekey", params)


def check(args: SimpleNamespace) -> None:
    """``runs rekey``'s arguments, before the store is opened."""
    for run_id in args.run_ids:
        check_run_id(run_id, option="RUN")
    require_value("--to", args.to, "a key id of GRAPHFLOW_DURABLE_KEYS")


def rekey(store: Store, args: SimpleNamespace, out: Out) -> int:
    """``runs rekey``: rows re-sealed per table on stdout; exit 0, or :data:`EXIT_LEFT`."""
    if store.codec is None:
        raise CliError(
            "runs rekey needs the store's keys: set GRAPHFLOW_DURABLE_KEYS (the old keys and the new one)", 2
        )
    done = store.rekey(args.run_ids or None, to=args.to, encrypt=args.encrypt, batch=args.batch)
    if args.json:
        out(json.dumps(done.to_json(), sort_keys=True))
    else:
        for table, count in done.resealed.items():
            out(f"{table}: {count} re-sealed")
        vacuumed = "; the database file was vacuumed" if done.vacuumed else ""
        out(f"{done.total} rows re-sealed under key {done.key_id!r}{vacuumed}")
    if done.left:
        sys.stderr.write(
            f"graphflow-durable: {done.left} rows were changed by commits in every sweep and keep their "
            "old key; run 'runs rekey' again\n"
        )
        return EXIT_LEFT
    return 0


def sealing_report(store: Store, run_ids: Sequence[str], decrypt: bool, as_json: bool, out: Out) -> int:
    """The sealing half of ``runs verify``: with ``decrypt``, each sealed value that does not open on
    one line (stdout); a summary on stderr that counts the plain values a sealed store still holds.
    Returns how many values did not open."""
    if decrypt and store.codec is None:
        raise CliError("runs verify --decrypt needs the store's keys: set GRAPHFLOW_DURABLE_KEYS", 2)
    found = store.audit_sealing(run_ids or None, open_values=decrypt)
    for bad in found.unopened:
        out(json.dumps(bad.to_json(), sort_keys=True) if as_json else bad.message)
    if decrypt:
        sys.stderr.write(
            f"graphflow-durable: {found.opened} sealed values opened, {len(found.unopened)} did not\n"
        )
    if found.plain_total and (found.sealed_total or store.codec is not None):
        tables = ", ".join(f"{table} {count}" for table, count in found.plain.items())
        sys.stderr.write(
            f"graphflow-durable: {found.plain_total} content values are plain in a sealed store ({tables}); "
            "seal them with 'graphflow-durable runs rekey --encrypt'\n"
        )
    return len(found.unopened)
