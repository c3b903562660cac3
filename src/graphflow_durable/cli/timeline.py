"""``graphflow-durable runs history | transcript | follow | export | import | fork``, for :mod:`.runs`.

Thin shells over :meth:`Store.history` (``--calls``: :meth:`Store.call_history`),
:meth:`Store.transcript`, :meth:`Store.follow`, :meth:`Store.export_run`, :meth:`Store.import_run`
and :meth:`Store.fork`. Data on stdout (a table or text, or with ``--json``
one JSON object per line; ``export`` always writes its JSON document), errors as one line on stderr
with the exit codes of :mod:`.runs`: 2 for an unknown run, a step out of range or a bad document,
3 when the new run's id is taken or the run is driven by a live process at the step asked for.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage.document import MAX_DEPTH
from graphflow_durable._storage.lease import iso
from graphflow_durable.cli._common import (
    INT,
    CliError,
    json_option,
    load_json,
    store_option,
    table,
    write_atomically,
)
from graphflow_durable.errors import StoreError
from graphflow_durable.store import RunRecord, Store, StoredMessage
from graphflow_durable.views import EXPIRED, GONE, lease_state, message_json

__all__ = ["COMMANDS", "EPILOG", "EXIT_CONFLICT", "add_commands", "check", "run"]

#: The ``runs`` sub-commands this module answers.
COMMANDS = ("history", "transcript", "follow", "export", "import", "fork")

#: Exit code: the new run's id is taken, or the run is driven by a live process (``runs fork``); the
#: exit-code map of :mod:`.runs` gives it for ``ConflictError`` and ``RunLockedError`` here.
EXIT_CONFLICT = 3

EPILOG = """\
  runs history RUN [--round N] [--node NODE]     the run's steps: seq, round, kind, node, attempt,
                                                 time, the messages each added, what it dispatched;
                                                 a failed attempt: its error and how long it ran;
                                                 an answer written by 'runs supply': "supplied"
  runs history RUN --calls [--round N] [--node NODE]
                                                 the run's recorded model and tool calls: step,
                                                 node, attempt, kind, name, ordinal or call id,
                                                 live or replayed ("discarded" when a divergence
                                                 voided it), prompt and completion tokens, time
  runs transcript RUN [--round N] [--node NODE]  the run's messages in order
  runs follow RUN [--after SEQ]                  the run's messages (after message SEQ), then each
                                                 new one as it is committed (like tail -f), until
                                                 the round ends or the run parks; Ctrl+C exits 0
  runs export RUN [--output FILE] [--decrypt]    the run as one JSON document (run, steps, messages,
                                                 agent states, call records) on stdout, or in FILE;
                                                 sealed rows as stored, or opened with --decrypt
  runs import FILE [--run-id NEW]                write an exported run (FILE '-': stdin) into --store;
                                                 a run exported while running arrives 'interrupted';
                                                 the whole FILE is checked first (an edited export
                                                 is refused by its checksums); sealed with the
                                                 store's keys (GRAPHFLOW_DURABLE_KEYS), if any
  runs fork RUN --at STEP [--run-id NEW]         a new run starting from the run's state at STEP
                                                 (the source is only read); resume it with run()
"""


def add_commands(runs: click.Group, dispatch: Callable[[str, dict[str, Any]], int]) -> None:
    """Add the sub-commands to the ``runs`` group; each runs through ``dispatch``."""

    def command(name: str, help: str, *params: Callable[[Any], Any]) -> None:
        def body(**given: Any) -> int:
            return dispatch(name, given)

        for param in reversed(params):
            body = param(body)
        runs.command(name, help=help)(store_option(json_option("JSON output (one object per line)")(body)))

    run_arg = click.argument("run_id", metavar="RUN")
    round_option = click.option("--round", type=INT, default=None, help="only this round (1, 2, ...)")
    node_option = click.option("--node", default=None, help="only this node's steps / answers / calls")
    calls = click.option("--calls", is_flag=True, help="list the recorded model and tool calls instead")
    command(
        "history",
        "list a run's steps (--calls: its recorded calls)",
        run_arg,
        round_option,
        node_option,
        calls,
    )
    command("transcript", "print a run's messages", run_arg, round_option, node_option)
    command(
        "follow",
        "print a run's messages as they are committed, until its round ends",
        click.argument("run_id", metavar="RUN"),
        click.option(
            "--after", type=INT, default=None, metavar="SEQ", help="only the messages after seq SEQ"
        ),
    )
    command(
        "export",
        "write a run as one JSON document",
        click.argument("run_id", metavar="RUN"),
        click.option("--output", "-o", default=None, metavar="FILE", help="write it to FILE, not stdout"),
        click.option(
            "--decrypt", is_flag=True, help="write sealed rows opened (needs GRAPHFLOW_DURABLE_KEYS)"
        ),
    )
    command(
        "import",
        "read a run exported by 'runs export' into --store\n\nFILE: the exported document ('-': stdin)",
        click.argument("file", metavar="FILE"),
        click.option(
            "--run-id", "new_run_id", default=None, metavar="NEW", help="import it under this run id"
        ),
    )
    command(
        "fork",
        "start a new run from a run's state at a past step",
        click.argument("run_id", metavar="RUN"),
        click.option("--at", type=INT, required=True, metavar="STEP", help="the step (see 'runs history')"),
        click.option("--run-id", "new_run_id", default=None, metavar="NEW", help="the new run's id"),
    )


def check(args: SimpleNamespace) -> None:
    """Refuse bad run ids before the store is opened (exit 2)."""
    if getattr(args, "run_id", None) is not None:
        check_run_id(args.run_id, option="RUN")
    if getattr(args, "new_run_id", None) is not None:
        check_run_id(args.new_run_id, option="--run-id")
    if getattr(args, "after", None) is not None and args.after < 0:
        raise CliError(
            f"argument --after: {args.after} is not a message seq; give a whole number >= 0 (the task is 0)",
            2,
        )


def run(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    """Run one of :data:`COMMANDS`; returns the exit code."""
    return _COMMANDS[args.runs_command](store, args, out)


def _history(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    if args.calls:
        return _calls(store, args, out)
    steps = store.history(args.run_id, round=args.round, node=args.node)
    if args.json:
        for step in steps:
            out(json.dumps(step.as_dict(), sort_keys=True))
        return 0
    columns = [("STEP", -4), ("ROUND", -5), ("KIND", 9), ("NODE", 12), ("TRY", -3), ("TIME", 25)]
    cells = [
        [
            str(s.seq),
            str(s.round),
            s.kind,
            s.node or "-",
            "-" if s.attempt is None else str(s.attempt),
            iso(s.time),
            ",".join(map(str, s.message_seqs)) or "-",
            ",".join(s.dispatched) or "-",
        ]
        for s in steps
    ]
    header, *lines = table([*columns, ("MESSAGES", 9), ("NEXT", 0)], cells)
    out(header)
    for s, line in zip(steps, lines, strict=True):
        if s.error_type is not None:  # a failed attempt: what it raised, and how long it ran
            first = (s.error or "").strip().splitlines()
            error = f"{s.error_type}: {first[0]}" if first else s.error_type
            line += f"  {error} (after {s.elapsed or 0:.2f} s)"
        if s.supplied:  # an operator's answer (runs supply), not the node's
            line += "  supplied"
        out(line)
    return 0


def _calls(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    """``runs history RUN --calls``: one row per recorded call; a discarded one (a divergence of its
    turn voided it) is marked after its row."""
    records = store.call_history(args.run_id, round=args.round, node=args.node)
    if args.json:
        for record in records:
            out(json.dumps(record.as_dict(), sort_keys=True))
        return 0
    columns = [("SEQ", -4), ("STEP", -4), ("NODE", 12), ("TRY", -3), ("KIND", 5), ("NAME", 20), ("IDENT", 12)]
    cells = [
        [
            *(str(r.seq), str(r.step), r.node, str(r.attempt), r.kind, r.name, r.ident, r.outcome),
            *("-" if n is None else str(n) for n in (r.prompt_tokens, r.completion_tokens)),
            iso(r.created_at),
        ]
        for r in records
    ]
    header, *lines = table([*columns, ("OUTCOME", 8), ("PROMPT", -6), ("COMPL", -6), ("TIME", 0)], cells)
    out(header)
    for r, line in zip(records, lines, strict=True):
        out(line + ("  discarded" if r.discarded else ""))
    return 0


def _transcript(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    for m in store.transcript(args.run_id, round=args.round, node=args.node):
        out(_message_line(m, args.json))
    return 0


def _message_line(m: StoredMessage, as_json: bool) -> str:
    """A message as ``runs transcript`` and ``runs follow`` print it."""
    if as_json:
        return json.dumps(message_json(m))
    content = m.body.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return f"[{m.seq}] {m.body.get('source')}: {text}"


#: ``runs follow``: how often it looks whether the run's driver is still there (seconds).
DRIVER_CHECK = 2.0


def _driver_gone(store: Store, run_id: str) -> str | None:
    """Why nobody drives ``run_id``, which is ``running`` (its driver died, or its lease ran out or
    was given up without recording an end); ``None`` while a live driver holds it, or the run is
    not ``running`` (or not there: the follower itself says so)."""
    run = store.get_run(run_id)
    if run is None or run.status != "running":
        return None
    state = lease_state(run, store.lease_clock())
    if run.lease_owner is None:
        return "nobody holds its lease"
    if state == GONE:
        return f"its driver {run.lease_owner} (pid {run.lease_pid} on {run.lease_host}) is gone"
    if state == EXPIRED:
        return f"the lease of its driver {run.lease_owner} expired at {iso(run.lease_expires_at)}"
    return None


async def _say_when_driver_gone(store: Store, run_id: str) -> None:
    """While following: say once on stderr when the run's driver is gone (it waits for a takeover),
    once more only if a driver took it over and is gone in turn. A read that fails is left to the
    follower, which reads the same store."""
    said = False
    while True:
        try:
            why = await asyncio.to_thread(_driver_gone, store, run_id)
        except StoreError:
            why = None
        if why is not None and not said:
            sys.stderr.write(
                f"graphflow-durable: run {run_id} is running but {why}; waiting for a driver to take "
                "it over (a worker's claim, or run() with no task)\n"
            )
            sys.stderr.flush()
        said = why is not None
        await asyncio.sleep(DRIVER_CHECK)


def _follow(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    """Print the messages as they are committed (each line flushed by ``out``); stop at the round's
    end, on Ctrl+C (exit 0: the user stopped watching) and once stdout's reader is gone. Say once
    on stderr when the run's driver is gone (nothing comes until another takes it over)."""

    async def watch() -> RunRecord | None:
        follow = store.follow(args.run_id, args.after)
        driver = asyncio.ensure_future(_say_when_driver_gone(store, args.run_id))
        try:
            async for m in follow:
                out(_message_line(m, args.json))
                if getattr(sys.stdout, "reader_gone", False):  # | head -3 had what it wanted
                    return None
        finally:
            driver.cancel()
            await follow.aclose()
        return follow.run

    try:
        run = asyncio.run(watch())
    except KeyboardInterrupt:
        return 0
    if run is not None:
        result = run.result if isinstance(run.result, dict) else {}
        reason = result.get("stop_reason")
        sys.stderr.write(
            f"graphflow-durable: run {run.run_id} {run.status}{f': {reason}' if reason else ''}\n"
        )
    return 0


def _export(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    text = json.dumps(store.export_run(args.run_id, decrypt=args.decrypt), sort_keys=True)
    if args.output is None:
        out(text)
        return 0
    try:
        write_atomically(Path(args.output), text + "\n")  # a failed write keeps FILE as it was
    except OSError as exc:
        raise CliError(f"--output {args.output}: cannot write it ({exc.strerror or exc})", 1) from None
    sys.stderr.write(f"graphflow-durable: run {args.run_id} exported to {args.output}\n")
    return 0


def _import(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(
            f"FILE {args.file}: cannot read it ({getattr(exc, 'strerror', None) or exc})", 2
        ) from None
    try:
        # The store's own limit, so a document the store would take is not refused here.
        document = load_json(text, where=f"FILE {args.file}", what="run export", limit=MAX_DEPTH)
    except ValueError as exc:
        raise CliError(
            f"FILE {args.file}: not JSON ({exc}); give a file written by 'runs export'", 2
        ) from None
    run = store.import_run(document, run_id=args.new_run_id)
    _said(out, args.json, run, f"imported run {run.run_id}")
    return 0


def _fork(store: Store, args: SimpleNamespace, out: Callable[[str], None]) -> int:
    run = store.fork(args.run_id, args.at, new_run_id=args.new_run_id)
    _said(out, args.json, run, f"forked run {args.run_id} at step {args.at} as run {run.run_id}")
    return 0


def _said(out: Callable[[str], None], as_json: bool, run: Any, what: str) -> None:
    if as_json:
        out(
            json.dumps(
                {
                    "run_id": run.run_id,
                    "status": run.status,
                    "head": run.head_seq,
                    "messages": run.message_count,
                    "parent_run_id": run.parent_run_id,
                },
                sort_keys=True,
            )
        )
    else:
        out(f"{what}: {run.status}, head {run.head_seq}, {run.message_count} messages")


_COMMANDS: dict[str, Callable[[Store, SimpleNamespace, Callable[[str], None]], int]] = {
    "history": _history,
    "transcript": _transcript,
    "follow": _follow,
    "export": _export,
    "import": _import,
    "fork": _fork,
}
