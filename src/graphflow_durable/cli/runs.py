"""``graphflow-durable``: list and verify runs, submit runs, and run a worker of a worker pool.

A thin shell over :class:`graphflow_durable.store.Store` and :class:`graphflow_durable.worker.Worker`.
Data goes to stdout, diagnostics (logging) to stderr. Run ``graphflow-durable --help`` (or ``python
-m graphflow_durable.cli.runs --help``) for the usage and exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from graphflow_durable._model.runid import check_run_id
from graphflow_durable.cli import _inspect, history, manage
from graphflow_durable.cli._common import (
    CliError,
    OneLineParser,
    import_attribute,
    prepare_streams,
    require_value,
    run_command,
)
from graphflow_durable.cli._inspect import SUBMITTED, list_rows, print_rows, verify
from graphflow_durable.errors import (
    GraphflowDurableError,
    NotWaitingError,
    RunExistsError,
    RunLockedError,
    RunStateError,
    StoreConfigError,
    UsageError,
)
from graphflow_durable.flow import DEFAULT_STORE_ENV, default_store_url
from graphflow_durable.store import RUN_STATUSES, Store
from graphflow_durable.worker import TeamFactory, Worker, check_options

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_DAMAGED",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "entry",
    "main",
]

EXIT_OK = 0
"""Done: listed, shown, cancelled, retried, deleted, pruned (also when nothing was left to prune),
submitted (or already submitted with the same task), or the worker stopped cleanly."""
EXIT_ERROR = 1
"""The store could not be opened or used, or a team factory could not be imported."""
EXIT_USAGE = 2
"""Usage error (argparse, a bad option value), a store URL that is malformed or carries an unknown
or bad option, or no store at the URL for a command that needs one (all but ``worker``, ``submit``
and ``runs import``, which create it)."""
EXIT_CONFLICT = 3
"""``submit``: the run id was already submitted with another task or team, or exists unsubmitted."""
EXIT_DAMAGED = _inspect.EXIT_DAMAGED
"""``runs verify``: rows that do not match their checksums, or gaps in a run's log (a step or message
row missing, a head moved back), were found (one line each on stdout)."""
EXIT_REFUSED = manage.EXIT_REFUSED
"""The run's state does not allow it: ``delete``/``prune`` of a running run without ``--force``,
``retry`` of a run a live driver holds, ``cancel``/``retry`` of a stopped or finished run."""

_STATUSES = (*RUN_STATUSES, SUBMITTED)

EPILOG = f"""\
commands:
  worker   claim runs and drive them until SIGTERM/SIGINT (a second signal halts in-flight runs)
  runs list [--status S] [--json]    list runs (and submissions not started yet: status 'submitted');
                                     a run whose driver died shows 'running (owner gone)' or
                                     'running (lease expired)'
  runs verify [RUN ...] [--json]     check every step, message and agent-state row of the runs
                                     (default: all) against its checksum, and that none is missing;
                                     one line per damaged row or gap
{history.EPILOG}  runs show RUN [--json]             status, round, head, lease owner and expiry, last error
  runs cancel RUN [--json]           stop a run: its driver stops within one lease period and
                                     leaves it cancelled (run() with no task resumes it)
  runs retry RUN [--json]            queue a failed, cancelled or interrupted run for workers again
  runs delete RUN [--force] [--dry-run] [--json]
                                     delete a run, its rows and its nested runs
  runs prune --older-than AGE [--status S ...] [--force] [--dry-run] [--json]
                                     delete runs of status S (default finished) last updated more
                                     than AGE (30d, 12h, 45m, 90s, 2w) ago; --dry-run lists them
  runs stats [--json]                runs per status, rows and bytes per table
  runs respond RUN ANSWER [--node N | --request ID] [--json]
                                     answer a waiting run's request for human input; the run
                                     becomes resumable (a worker of the pool picks it up)
  submit RUN_ID TASK [--team KEY]    queue a run for the pool (idempotent per RUN_ID)

--team for the worker: KEY=module:factory claims runs submitted with --team KEY (repeatable);
module:factory alone claims every run (one kind of team per database). The factory is called as
factory(run_id, store=..., lease_owner=..., lease_seconds=...) and returns a DurableGraphFlow.

the store: --store URL, else ${DEFAULT_STORE_ENV}, else ./.graphflow_durable/runs.db
  options go in the URL's query: sqlite:///runs.db?synchronous=NORMAL,
  postgresql://app@db/agents?connect_timeout=5&application_name=worker (see docs/store-urls.md)

exit codes:
  0  done (listed; shown, cancelled, retried, deleted, pruned, also when nothing was left to
     prune; submitted or already submitted with the same task; worker stopped cleanly)
  1  the store failed, or a team factory could not be imported
  2  usage error (including a bad store URL or an unknown option in it, or a bad option value;
     a RUN that does not exist, a STEP out of range, a FILE that is not a run export or fails
     its checks: the line names its first bad field, e.g. steps[3].node); no store at the URL:
     every command but worker, submit and runs import (which create the store) needs an
     existing one and creates nothing (a mistyped --store is no new, empty store)
  3  submit: RUN_ID was submitted with another task/team, or exists without a submission;
     runs import / fork: the new run's id is taken; runs fork: the run is driven by a live
     process and STEP is its head; runs respond: nothing to answer (the run is not waiting or is
     cancelled, the request was already answered, or several are pending and none was named);
     nothing was changed
  4  runs verify: damaged or missing rows were found (each printed on one line)
  5  refused by the run's state: delete/prune of a running run without --force, retry of a run
     a live worker drives, cancel/retry of a stopped or finished run (nothing was changed)
"""

#: How the library's errors end the command (first match wins: subclasses first).
_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (RunExistsError, EXIT_CONFLICT),
    (NotWaitingError, EXIT_CONFLICT),
    (RunStateError, EXIT_REFUSED),
    (RunLockedError, EXIT_REFUSED),
    (UsageError, EXIT_USAGE),  # StoreConfigError (a bad store URL) included
    (GraphflowDurableError, EXIT_ERROR),
)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="graphflow-durable",
        description="Inspect and submit durable GraphFlow runs; run a worker of a worker pool.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", help="database URL (sqlite:///runs.db, postgresql://...)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True)

    worker = commands.add_parser("worker", help="claim and drive runs until stopped")
    worker.add_argument("--store", dest="store_sub", help="database URL")
    worker.add_argument(
        "--team", action="append", required=True, metavar="[KEY=]module:factory", help="team factory"
    )
    worker.add_argument("--concurrency", type=int, default=1, help="runs driven at once (default 1)")
    worker.add_argument("--lease-seconds", type=float, default=30.0, help="lease length (default 30)")
    worker.add_argument("--poll-interval", type=float, default=0.5, help="idle poll period (default 0.5)")
    worker.add_argument(
        "--grace-seconds", type=float, default=30.0, help="on SIGTERM, let runs finish this long (30)"
    )
    worker.add_argument("--until-idle", action="store_true", help="exit when nothing is left to claim")

    runs = commands.add_parser("runs", help="inspect runs")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True)
    listing = runs_commands.add_parser("list", help="list runs")
    listing.add_argument("--store", dest="store_sub", help="database URL")
    listing.add_argument("--status", action="append", choices=_STATUSES, help="only these (repeatable)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    checking = runs_commands.add_parser(
        "verify", help="check every stored row against its checksum, and for gaps"
    )
    checking.add_argument("--store", dest="store_sub", help="database URL")
    checking.add_argument("run_ids", nargs="*", metavar="RUN", help="the runs to check (default: all)")
    checking.add_argument("--json", action="store_true", help="one JSON object per damaged row or gap")
    history.add_commands(runs_commands)  # history, transcript, export, import, fork
    manage.add_parsers(runs_commands)
    answer = runs_commands.add_parser("respond", help="answer a waiting run's request for human input")
    answer.add_argument("--store", dest="store_sub", help="database URL")
    answer.add_argument("run_id", metavar="RUN")
    answer.add_argument("answer", metavar="ANSWER")
    which = answer.add_mutually_exclusive_group()
    which.add_argument("--node", help="the node whose request this answers (when several wait)")
    which.add_argument("--request", help="the request id this answers (runs list shows them)")
    answer.add_argument("--json", action="store_true", help="the answered request as one JSON object")

    submit = commands.add_parser("submit", help="queue a run for the worker pool")
    submit.add_argument("--store", dest="store_sub", help="database URL")
    submit.add_argument("run_id")
    submit.add_argument("task")
    submit.add_argument("--team", default=None, help="the team key workers claim it by")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (see the module's ``EXIT_*`` constants)."""
    return run_command("graphflow-durable", lambda: _main(argv), codes=_CODES, usage_code=EXIT_USAGE)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2) if args.command != "worker" else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.verbose < 2:  # AutoGen logs every message delivery at INFO
        for name in ("autogen_core", "autogen_agentchat"):
            logging.getLogger(name).setLevel(logging.WARNING)
    given = getattr(args, "store_sub", None)
    given = require_value("--store", given if given is not None else args.store, "a database URL")
    # Only the commands that write a new run may create the store; the others need one to exist.
    creating = args.command in ("worker", "submit") or args.runs_command == "import"
    url = given if given is not None else default_store_url(make_directory=creating)
    if args.command == "submit":
        check_run_id(args.run_id, option="RUN_ID")  # before the store is opened
    if args.command == "worker":
        return _worker(args, url)
    if args.command == "runs" and args.runs_command == "verify":
        for run_id in args.run_ids:
            check_run_id(run_id, option="RUN")
    if args.command == "runs" and args.runs_command in history.COMMANDS:
        history.check(args)
    managing = args.command == "runs" and args.runs_command in manage.COMMANDS
    if managing:
        manage.check(args)  # before the store is opened
    if args.command == "runs" and args.runs_command == "respond":
        check_run_id(args.run_id, option="RUN")
    with _open_store(url, create=creating, given=given is not None) as store:
        if args.command == "submit":
            return _submit(store, args)
        if args.runs_command in history.COMMANDS:
            return history.run(store, args, _out)
        if args.runs_command == "verify":
            return verify(store, args.run_ids, args.json, _out)
        if managing:
            return manage.run(store, args, _out)
        if args.runs_command == "respond":
            return _respond(store, args)
        return _list(store, args)


def entry() -> None:
    """Console-script entry point."""
    prepare_streams()
    sys.exit(main())


def _open_store(url: str, *, create: bool, given: bool) -> Store:
    """The store at ``url``; unless ``create``, a URL with no store there is a usage error that says
    where the URL came from (nothing is created)."""
    try:
        return Store(url, create=create)
    except StoreConfigError as exc:
        if exc.option != "create":
            raise
        if given:
            hint = "check --store"
        elif os.environ.get(DEFAULT_STORE_ENV):
            hint = f"check {DEFAULT_STORE_ENV}"
        else:
            hint = f"give --store or set {DEFAULT_STORE_ENV}"
        raise CliError(f"{exc}; {hint}", EXIT_USAGE) from None


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _submit(store: Store, args: argparse.Namespace) -> int:
    for what, value in (("RUN_ID", args.run_id), ("TASK", args.task), ("--team", args.team)):
        _not_utf8(what, value)
    sub = store.queue.submit(args.run_id, task=args.task, team=args.team)  # RunExistsError: exit 3
    _out(json.dumps({"run_id": sub.run_id, "team": sub.team, "status": sub.status}))
    return EXIT_OK


def _not_utf8(what: str, value: str | None) -> None:
    """Refuse an argument that was not UTF-8: Python hands its bad bytes over as lone surrogates
    (U+DC80..U+DCFF), which no store can hold. Exit 2 naming the first byte."""
    bad = next((i for i, c in enumerate(value or "") if "\udc80" <= c <= "\udcff"), None)
    if value is not None and bad is not None:
        raise CliError(
            f"{what} is not UTF-8 text: byte 0x{ord(value[bad]) - 0xDC00:02x} at character {bad}; give "
            "it as UTF-8 (check the encoding of the terminal or the calling program); nothing was changed",
            EXIT_USAGE,
        )


def _respond(store: Store, args: argparse.Namespace) -> int:
    for what, value in (
        ("RUN", args.run_id),
        ("ANSWER", args.answer),
        ("--node", args.node),
        ("--request", args.request),
    ):
        _not_utf8(what, value)
    done = store.respond(args.run_id, args.answer, node=args.node, request_id=args.request)  # exit 3
    status = store.get_run(args.run_id)
    row = {"run_id": args.run_id, **done.to_json(), "run_status": None if status is None else status.status}
    _out(
        json.dumps(row)
        if args.json
        else f"{args.run_id}: answered {done.request_id} ({done.node}); run {row['run_status']}"
    )
    return EXIT_OK


def _list(store: Store, args: argparse.Namespace) -> int:
    print_rows(list_rows(store, set(args.status or _STATUSES)), args.json, _out)
    return EXIT_OK


def _load_factory(spec: str) -> TeamFactory:
    factory = import_attribute(spec, flag="--team", example="myapp.teams:make_team", code=EXIT_ERROR)
    if not callable(factory):
        raise CliError(
            f"--team {spec!r}: {type(factory).__name__} is not callable, expected a team factory", EXIT_ERROR
        )
    return factory  # type: ignore[no-any-return]


def _worker(args: argparse.Namespace, url: str) -> int:
    check_options(**_worker_options(args))  # UsageError, exit 2: before any team module is imported
    specs: list[str] = args.team
    keyed = {spec.partition("=")[0]: spec.partition("=")[2] for spec in specs if "=" in spec}
    plain = [spec for spec in specs if "=" not in spec]
    if plain and (keyed or len(plain) > 1):
        raise CliError(
            "--team module:factory (any run) cannot be combined with other --team options", EXIT_USAGE
        )
    if plain:
        worker = Worker(url, team=_load_factory(plain[0]), **_worker_options(args))
    else:
        factories = {key: _load_factory(spec) for key, spec in keyed.items()}
        worker = Worker(url, factories, **_worker_options(args))

    async def go() -> None:
        worker.install_signal_handlers()
        # The first line on stdout says the worker is up and handles SIGTERM gracefully.
        _out(json.dumps({"worker": worker.owner, "teams": worker.teams, "store": worker.url}))
        if args.until_idle:
            await worker.run_until_idle()
        else:
            await worker.run_forever()

    try:
        asyncio.run(go())
    finally:
        # The worker has stopped and the process only exits now. The interpreter resets Python
        # signal handlers to the default action (killed: exit 143) early in its finalization, which
        # can take a while after that; a signal that arrives then has nothing left to stop.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
    return EXIT_OK


def _worker_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "concurrency": args.concurrency,
        "lease_seconds": args.lease_seconds,
        "poll_interval": args.poll_interval,
        "grace_seconds": args.grace_seconds,
    }


if __name__ == "__main__":
    entry()
