"""``graphflow-durable``: list and verify runs, submit runs, and run a worker of a worker pool;
check stored runs against the current code before a deploy.

A thin shell over :class:`graphflow_durable.store.Store` and :class:`graphflow_durable.worker.Worker`.
Data goes to stdout, diagnostics (logging) to stderr. Run ``graphflow-durable --help`` (or ``python
-m graphflow_durable.cli.runs --help``) for the usage and exit codes.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import click

from graphflow_durable._model.runid import check_run_id
from graphflow_durable.cli import _inspect, console, keys, manage, queues, timeline
from graphflow_durable.cli._common import (
    FLOAT,
    INT,
    STORE,
    Choice,
    CliError,
    Group,
    allow_plaintext,
    exclusive,
    import_attribute,
    json_option,
    open_store,
    prepare_streams,
    require_value,
    run_command,
    store_codec,
    store_option,
    table,
)
from graphflow_durable.cli._inspect import print_rows, verify
from graphflow_durable.errors import (
    ConflictError,
    GraphflowDurableError,
    NotWaitingError,
    RunExistsError,
    RunLockedError,
    RunStateError,
    UsageError,
)
from graphflow_durable.flow import DEFAULT_STORE_ENV, default_store_url
from graphflow_durable.preflight import check_runs, runs_to_check
from graphflow_durable.store import DEFAULT_QUEUE, RUN_STATUSES, RunRecord, Store, check_queue_name
from graphflow_durable.views import SUBMITTED, list_rows
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
"""The store could not be opened or used, or the worker's team factory could not be imported;
``ui``: the ``ui`` extra is not installed, or the port is taken."""
EXIT_USAGE = 2
"""Usage error (an unknown option, a missing argument, a bad option value), a store URL that is
malformed or carries an unknown or bad option, or no store at the URL for a command that needs one
(all but ``worker``, ``submit`` and ``runs import``, which create it); ``check``: a ``--team`` it
cannot import or call, or a store at an older schema version (``check`` migrates nothing); ``ui``:
a ``--host`` that is not loopback without a token."""
EXIT_CONFLICT = 3
"""``submit``: the run id was already submitted with another task or team, or exists unsubmitted."""
EXIT_DAMAGED = _inspect.EXIT_DAMAGED
"""``runs verify``: rows that do not match their checksums, or gaps in a run's log (a step or message
row missing, a head moved back), were found (one line each on stdout); ``check``: a stored run the
current code would not resume as it is (one line per problem on stdout)."""
EXIT_REFUSED = manage.EXIT_REFUSED
"""The run's state does not allow it: ``delete``/``prune`` of a running run without ``--force``,
``retry`` of a run a live driver holds, ``cancel``/``retry`` of a stopped or finished run."""

_STATUSES = (*RUN_STATUSES, SUBMITTED)


class _Time(click.ParamType):  # type: ignore[type-arg]
    """``--at``: ISO 8601 (UTC when it has no offset) or unix seconds, as epoch seconds."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:
            at = datetime.datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{value!r} is not a time: give ISO 8601 (2026-03-01T09:00:00Z) or unix seconds", param, ctx
            )
        if at.tzinfo is None:
            at = at.replace(tzinfo=datetime.timezone.utc)
        return at.timestamp()


_TIME = _Time()

EPILOG = f"""\
commands:
  worker   claim runs and drive them until SIGTERM/SIGINT (a second signal halts in-flight runs);
           --queue Q (repeatable): only from these named queues (default: all)
  runs list [--status S] [--queue Q] [--json]
                                     list runs (and submissions not started yet: status 'submitted');
                                     a run whose driver died shows 'running (owner gone)' or
                                     'running (lease expired)'
  runs verify [RUN ...] [--decrypt] [--json]
                                     check every step, message, agent-state and call-record row
                                     of the runs (default: all) against its checksum, and that none
                                     is missing; one line per damaged row or gap; --decrypt: also
                                     open every sealed row (one line per row that does not open)
{keys.EPILOG}{timeline.EPILOG}{queues.EPILOG}  runs show RUN [--json]             status, round, head, lease owner and expiry, last error,
                                     recorded calls made and replayed, tokens saved
  runs cancel RUN [--json]           stop a run: its driver stops before its next dispatch and
                                     leaves it cancelled (run() with no task resumes it); a run
                                     whose last turn was dispatched ends on its own, and runs show
                                     says it finished before the cancel took effect
  runs retry RUN [--json]            make a failed, cancelled or interrupted run resumable again (a
                                     worker or the next run() resumes it)
  runs supply RUN NODE TEXT [--json] write TEXT as the answer of NODE, the node a failed run failed
                                     on (its retries or crashes spent): recorded as NODE's
                                     completion ('runs history' prints "supplied"); the run becomes
                                     interrupted and run() (or a worker) continues it
  runs delete RUN [--force] [--dry-run] [--json]
                                     delete a run, its rows and its nested runs
  runs prune --older-than AGE [--status S ...] [--force] [--dry-run] [--json]
                                     delete runs of status S (default finished) last updated more
                                     than AGE (30d, 12h, 45m, 90s, 2w) ago; --dry-run lists them
  runs stats [--json]                runs per status, rows and bytes per table, recorded calls
                                     made and replayed, tokens saved
  runs respond RUN ANSWER [--node N | --request ID] [--json]
                                     answer a waiting run's request for human input; the run
                                     becomes resumable (a worker or the next run() resumes it)
  submit RUN_ID TASK [--team KEY] [--queue Q] [--priority N] [--partition KEY] [--at TIME] [--json]
                                     queue a run for the pool (idempotent per RUN_ID): in queue Q
                                     (default 'default'), lower priority first, at most one run of a
                                     partition KEY at a time, not before TIME (ISO 8601, UTC
                                     without an offset, or unix seconds)
{console.EPILOG}  check --team [KEY=]module:factory [RUN ...] [--json]
                                     the pre-deploy check: load the stored runs (default: every
                                     run not finished or cancelled) into fresh teams of the current
                                     code, running no agent; one line per problem: a changed graph,
                                     an agent state load_state refuses, a scheduler replay that
                                     diverges (docs/operations.md)

--team for the worker: KEY=module:factory claims runs submitted with --team KEY (repeatable);
module:factory alone claims every run (one kind of team per database). The factory is called as
factory(run_id, store=..., lease_owner=..., lease_seconds=...) and returns a DurableGraphFlow;
check calls it as factory(run_id, store=...), and takes --team as the worker does.

the store: --store URL, else ${DEFAULT_STORE_ENV}, else ./.graphflow_durable/runs.db
  options go in the URL's query: sqlite:///runs.db?synchronous=NORMAL,
  postgresql://app@db/agents?connect_timeout=5&application_name=worker (see docs/store-urls.md)
the keys: GRAPHFLOW_DURABLE_KEYS=k1=<base64 of 32 bytes>,k2=... seals and opens the store's content
  (the active key: GRAPHFLOW_DURABLE_ACTIVE_KEY, else the last listed; see docs/encryption.md);
  GRAPHFLOW_DURABLE_ALLOW_PLAINTEXT=1 reads plain rows too while a store is being encrypted

exit codes:
  0  done (listed; shown, cancelled, retried, supplied, deleted, pruned, also when nothing was left to
     prune; submitted or already submitted with the same task; worker stopped cleanly)
  1  the store failed, or the worker's team factory could not be imported; ui: the ui extra is not
     installed, or the port is taken
  2  usage error (including a bad store URL or an unknown option in it, or a bad option value;
     a RUN that does not exist, a STEP out of range, a FILE that is not a run export or fails
     its checks: the line names its first bad field, e.g. steps[3].node); no store at the URL:
     every command but worker, submit and runs import (which create the store) needs an
     existing one and creates nothing (a mistyped --store is no new, empty store); check: a
     --team it cannot import or call, a store at an older schema version (check migrates nothing);
     ui: a --host that is not loopback without a token (--token or GRAPHFLOW_DURABLE_UI_TOKEN);
     GRAPHFLOW_DURABLE_KEYS malformed, or a row sealed with a key it lacks or holds other material for
  3  submit: RUN_ID was submitted with another task/team, or exists without a submission;
     runs import / fork: the new run's id is taken; runs rekey: rows changed by commits in every
     sweep keep their old key (run it again); runs fork: the run is driven by a live
     process and STEP is its head; runs respond: nothing to answer (the run is not waiting or is
     cancelled, the request was already answered, or several are pending and none was named);
     nothing was changed
  4  runs verify: damaged or missing rows were found, or (--decrypt) sealed rows that do not open
     (each printed on one line); check: problems were found (each printed on one line)
  5  refused by the run's state: delete/prune of a running run without --force, retry of a run
     a live worker drives, cancel/retry of a stopped or finished run, supply to a run that did
     not fail on a node's spent budget (nothing was changed)
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
#: The same for ``runs history|transcript|export|import|fork``: there a taken id (``import``,
#: ``fork --run-id``) or a live driver at the step asked for (``fork``) is a conflict.
_HISTORY_CODES = ((ConflictError, EXIT_CONFLICT), (RunLockedError, EXIT_CONFLICT), *_CODES)

#: Where the group keeps ``-v``'s count (the root context's ``meta``).
_VERBOSE = "graphflow_durable.verbose"


def _exit_code(exc: BaseException, command: str) -> int | None:
    """The exit code for the library's error ``exc`` raised by ``command`` (``runs fork``); the one
    exception -> exit-code map of ``graphflow-durable`` (``None``: not foreseen, exit 1)."""
    _, _, sub = command.partition("runs ")
    codes = _HISTORY_CODES if sub in timeline.COMMANDS else _CODES
    return next((code for kind, code in codes if isinstance(exc, kind)), None)


@click.group(
    "graphflow-durable",
    cls=Group,
    help="Inspect and submit durable GraphFlow runs; run a worker of a worker pool.",
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@store_option
@click.option("-v", "--verbose", count=True, help="more logging on stderr")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """The ``graphflow-durable`` command (Click group); :func:`main` runs it."""
    ctx.meta[_VERBOSE] = verbose


@cli.command("worker", help="claim and drive runs until stopped")
@store_option
@click.option("--team", multiple=True, required=True, metavar="[KEY=]module:factory", help="team factory")
@click.option("--concurrency", type=INT, default=1, help="runs driven at once (default 1)")
@click.option("--lease-seconds", type=FLOAT, default=30.0, help="lease length (default 30)")
@click.option("--poll-interval", type=FLOAT, default=0.5, help="idle poll period (default 0.5)")
@click.option("--grace-seconds", type=FLOAT, default=30.0, help="on SIGTERM, let runs finish this long (30)")
@click.option("--until-idle", is_flag=True, help="exit when nothing is left to claim")
@click.option(
    "--queue", "queues", multiple=True, metavar="Q", help="claim only from queue Q (repeatable; default all)"
)
def _worker_command(**params: Any) -> int:
    return _main("worker", None, params)


@cli.group("runs", help="inspect runs")
def _runs() -> None:
    pass


@_runs.command("list", help="list runs")
@store_option
@click.option("--status", multiple=True, type=Choice(_STATUSES), help="only these (repeatable)")
@click.option("--queue", "queues", multiple=True, metavar="Q", help="only runs of queue Q (repeatable)")
@json_option("one JSON object per line")
def _list_command(**params: Any) -> int:
    return _main("runs", "list", params)


@_runs.command(
    "verify",
    help="check every stored row against its checksum, and for gaps\n\nRUN: the runs to check (default: all)",
)
@store_option
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--decrypt", is_flag=True, help="also open every sealed row (needs GRAPHFLOW_DURABLE_KEYS)")
@json_option("one JSON object per damaged row or gap")
def _verify_command(**params: Any) -> int:
    return _main("runs", "verify", params)


@cli.command(
    "check",
    help="load stored runs into fresh teams of the current code, running no agent; one line per "
    "problem\n\nRUN: the runs to check (default: every run not finished or cancelled)",
)
@store_option
@click.option(
    "--team",
    multiple=True,
    required=True,
    metavar="[KEY=]module:factory",
    help="team factory, called as factory(run_id, store=...); KEY=: for runs submitted with --team KEY",
)
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@json_option("one JSON object per problem: run_id, kind, subject, message")
def _check_command(**params: Any) -> int:
    return _main("check", None, params)


def _dispatch(runs_command: str, params: dict[str, Any]) -> int:
    return _main("runs", runs_command, params)


timeline.add_commands(_runs, _dispatch)  # history, transcript, export, import, fork
manage.add_commands(_runs, _dispatch)
keys.add_command(_runs, _dispatch)
queues.add_commands(cli, lambda name, params: _main("queues", name, params))
console.add_command(cli, lambda command, params: _main(command, None, params))


@_runs.command("respond", help="answer a waiting run's request for human input")
@store_option
@click.argument("run_id", metavar="RUN")
@click.argument("answer", metavar="ANSWER")
@click.option("--node", help="the node whose request this answers (when several wait)")
@click.option("--request", help="the request id this answers (runs list shows them)")
@json_option("the answered request as one JSON object")
@click.pass_context
def _respond_command(ctx: click.Context, /, **params: Any) -> int:
    exclusive(ctx, ("--node", params["node"]), ("--request", params["request"]))
    return _main("runs", "respond", params)


@cli.group("limits", help="model-provider rate limits shared by every process")
def _limits() -> None:
    pass


@_limits.command("list", help="each key's limits, use in the current minute, next free turn and pause")
@store_option
@json_option("one JSON object per key")
def _limits_list_command(**params: Any) -> int:
    return _main("limits", "list", params)


@cli.command("submit", help="queue a run for the worker pool")
@store_option
@click.argument("run_id", metavar="RUN_ID")
@click.argument("task", metavar="TASK")
@click.option("--team", default=None, help="the team key workers claim it by")
@click.option("--queue", default=DEFAULT_QUEUE, help="the named queue whose caps bound it (default: default)")
@click.option("--priority", type=INT, default=0, help="lower first (default 0)")
@click.option(
    "--partition", default=None, metavar="KEY", help="its partition (e.g. a customer): 1 driven at a time"
)
@click.option(
    "--at",
    "not_before",
    type=_TIME,
    default=None,
    metavar="TIME",
    help="start no earlier than TIME: ISO 8601 (2026-03-01T09:00:00+01:00; UTC without an offset) or unix seconds",
)
@json_option(
    "the submission as one JSON object: run_id, team, status, queue, priority, partition, not_before"
)
def _submit_command(**params: Any) -> int:
    return _main("submit", None, params)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (see the module's ``EXIT_*`` constants)."""
    return run_command("graphflow-durable", cli, argv, codes=_exit_code, usage_code=EXIT_USAGE)


def _main(command: str, runs_command: str | None, params: dict[str, Any]) -> int:
    """Run ``command`` (``runs_command``) with the ``params`` Click parsed; its exit code."""
    meta = click.get_current_context().meta
    args = SimpleNamespace(
        command=command, runs_command=runs_command, verbose=meta.get(_VERBOSE, 0), **params
    )
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2) if args.command != "worker" else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.verbose < 2:  # AutoGen logs every message delivery at INFO
        for name in ("autogen_core", "autogen_agentchat"):
            logging.getLogger(name).setLevel(logging.WARNING)
    given = require_value("--store", meta.get(STORE), "a database URL")
    # Only the commands that write a new run may create the store; the others need one to exist.
    creating = args.command in ("worker", "submit") or args.runs_command == "import"
    creating = creating or (args.command == "queues" and args.runs_command == "set")
    url = given if given is not None else default_store_url(make_directory=creating)
    if args.command == "submit":
        check_run_id(args.run_id, option="RUN_ID")  # before the store is opened
    if args.command == "worker":
        return _worker(args, url)
    token = console.check(args) if args.command == "ui" else None  # before the store is opened
    factory = None
    if args.command == "check":
        for run_id in args.run_ids:
            check_run_id(run_id, option="RUN")
        factory = _team_factories(args.team, code=EXIT_USAGE)  # before the store is opened
    if args.command == "runs" and args.runs_command == "rekey":
        keys.check(args)
    if args.command == "runs" and args.runs_command == "verify":
        for run_id in args.run_ids:
            check_run_id(run_id, option="RUN")
    if args.command == "runs" and args.runs_command in timeline.COMMANDS:
        timeline.check(args)
    managing = args.command == "runs" and args.runs_command in manage.COMMANDS
    if managing:
        manage.check(args)  # before the store is opened
    if args.command == "runs" and args.runs_command == "respond":
        check_run_id(args.run_id, option="RUN")
    # check changes nothing: not even the schema, which the old workers still use before the deploy.
    if args.command == "queues" and args.runs_command != "list":
        check_queue_name(args.name, "NAME")  # before the store is opened
    with open_store(url, create=creating, given=given is not None, migrate=factory is None) as store:
        if args.command == "submit":
            return _submit(store, args)
        if args.command == "queues":
            return queues.run(store, args, _out)
        if args.command == "limits":
            return _limits_list(store, args)
        if args.command == "ui":
            return console.serve(store, args, token, _out)
        if factory is not None:
            return _check(store, args, factory)
        if args.runs_command in timeline.COMMANDS:
            return timeline.run(store, args, _out)
        if args.runs_command == "verify":
            damaged = verify(store, args.run_ids, args.json, _out)
            unopened = keys.sealing_report(store, args.run_ids, args.decrypt, args.json, _out)
            return EXIT_DAMAGED if damaged or unopened else EXIT_OK
        if args.runs_command == "rekey":
            return keys.rekey(store, args, _out)
        if managing:
            return manage.run(store, args, _out)
        if args.runs_command == "respond":
            return _respond(store, args)
        return _list(store, args)


def entry() -> None:
    """Console-script entry point."""
    prepare_streams()
    sys.exit(main())


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _submit(store: Store, args: SimpleNamespace) -> int:
    for what, value in (("RUN_ID", args.run_id), ("TASK", args.task), ("--team", args.team)):
        _not_utf8(what, value)
    for what, value in (("--queue", args.queue), ("--partition", args.partition)):
        _not_utf8(what, value)
    sub = store.queue.submit(  # RunExistsError: exit 3
        args.run_id,
        task=args.task,
        team=args.team,
        queue=args.queue,
        priority=args.priority,
        partition=args.partition,
        not_before=args.not_before,
    )
    if args.json:
        placed = {"queue": sub.queue, "priority": sub.priority, "partition": sub.partition}
        row = {
            "run_id": sub.run_id,
            "team": sub.team,
            "status": sub.status,
            **placed,
            "not_before": sub.not_before,
        }
        _out(json.dumps(row))
        return EXIT_OK
    who = "--team module:factory" if sub.team is None else f"--team {sub.team}=module:factory"
    again = "" if sub.status == "pending" else f" (already submitted: {sub.status})"
    _out(f"run {sub.run_id}: submitted{again}; a worker started with {who} claims it")
    return EXIT_OK


def _limits_list(store: Store, args: SimpleNamespace) -> int:
    rows = [state.to_json() for state in store.limits.list()]
    if args.json:
        for row in rows:
            _out(json.dumps(row))
        return EXIT_OK

    def per_minute(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    def paused(until: float | None) -> str:
        return "" if until is None else f"paused {until - time.time():.1f} s more"

    columns = [
        ("KEY", 0),
        ("REQ/MIN", -7),
        ("TOK/MIN", -7),
        ("REQ", -3),
        ("TOKENS", -6),
        ("NEXT", -5),
        ("PAUSE", 0),
    ]
    for line in table(
        columns,
        (
            [
                r["key"],
                per_minute(r["requests_per_minute"]),
                per_minute(r["tokens_per_minute"]),
                str(r["requests_in_window"]),
                str(r["tokens_in_window"]),
                f"{r['next_free_in_s']:g}s",
                paused(r["paused_until"]),
            ]
            for r in rows
        ),
    ):
        _out(line)
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


def _respond(store: Store, args: SimpleNamespace) -> int:
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
    if args.json:
        _out(json.dumps(row))
        return EXIT_OK
    then = {
        "interrupted": ": a worker or the next run() resumes it",
        "waiting": ": it still waits for another answer ('runs show' lists its requests)",
    }.get(str(row["run_status"]), "")
    _out(f"{args.run_id}: answered {done.request_id} ({done.node}); run {row['run_status']}{then}")
    return EXIT_OK


def _list(store: Store, args: SimpleNamespace) -> int:
    print_rows(list_rows(store, set(args.status or _STATUSES), queues=args.queues or None), args.json, _out)
    return EXIT_OK


def _load_factory(spec: str, code: int = EXIT_ERROR) -> TeamFactory:
    """The factory ``spec`` names; ``code``: the exit code when it cannot be imported or called."""
    factory = import_attribute(spec, flag="--team", example="myapp.teams:make_team", code=code)
    if not callable(factory):
        raise CliError(
            f"--team {spec!r}: {type(factory).__name__} is not callable, expected a team factory", code
        )
    return factory  # type: ignore[no-any-return]


def _team_factories(specs: Sequence[str], code: int = EXIT_ERROR) -> TeamFactory | dict[str, TeamFactory]:
    """``--team``'s values: one factory for every run (``module:factory``), or one per team key
    (``KEY=module:factory``, repeatable); ``code``: the exit code for one that cannot be imported."""
    keyed = {spec.partition("=")[0]: spec.partition("=")[2] for spec in specs if "=" in spec}
    plain = [spec for spec in specs if "=" not in spec]
    if plain and (keyed or len(plain) > 1):
        raise CliError(
            "--team module:factory (any run) cannot be combined with other --team options", EXIT_USAGE
        )
    if plain:
        return _load_factory(plain[0], code)
    return {key: _load_factory(spec, code) for key, spec in keyed.items()}


def _check(store: Store, args: SimpleNamespace, factories: TeamFactory | dict[str, TeamFactory]) -> int:
    """``check``: each problem on one line (stdout), a summary on stderr; 0 clean, 4 problems. With
    team keys, a run is checked with the factory of the key it was submitted with; by default the
    runs of other keys (or none) are left out, as the worker's claims leave them."""
    runs = runs_to_check(store, args.run_ids)  # an unknown RUN: exit 2, before any team is built
    groups: dict[str | None, list[RunRecord]] = {}
    for run in runs:
        submitted = None if callable(factories) else store.queue.get_submission(run.run_id)
        groups.setdefault(None if submitted is None else submitted.team, []).append(run)
    if isinstance(factories, dict) and args.run_ids and (other := set(groups) - set(factories)):
        named = next(r.run_id for key in other for r in groups[key])
        raise CliError(
            f"run {named} was not submitted with any --team KEY given ({', '.join(sorted(factories))}); "
            "give --team KEY=module:factory for its key, or module:factory for every run",
            EXIT_USAGE,
        )
    problems, checked = [], 0
    # Each factory given is called, with no run of its own too (a factory that cannot build a team
    # fails the check even when nothing is resumable).
    if callable(factories):
        work = [(factories, list(runs))]
    else:
        keyed: dict[str, list[RunRecord]] = {}
        for key, group in groups.items():
            keyed.setdefault(key or "", []).extend(group)
        work = [(factory, keyed.get(key, [])) for key, factory in factories.items()]
    for factory, group in work:
        # The worker's factory type; check_runs calls it as factory(run_id, store=...) only,
        # and checks first that its signature allows that.
        problems += asyncio.run(check_runs(factory, store, group))  # type: ignore[arg-type]
        checked += len(group)
    for problem in problems:
        _out(json.dumps(problem.to_json(), sort_keys=True) if args.json else str(problem))
    left = f" ({len(runs) - checked} of other teams left out)" if checked < len(runs) else ""
    sys.stderr.write(f"graphflow-durable: {checked} runs checked{left}, {len(problems)} problems\n")
    return EXIT_DAMAGED if problems else EXIT_OK


def _worker(args: SimpleNamespace, url: str) -> int:
    check_options(**_worker_options(args))  # UsageError, exit 2: before any team module is imported
    codec = store_codec()  # a malformed GRAPHFLOW_DURABLE_KEYS: exit 2, before any team is imported
    factories = _team_factories(args.team)
    options = {
        **_worker_options(args),
        "queues": _worker_queues(args),
        "codec": codec,
        "allow_plaintext": allow_plaintext(),
    }
    if callable(factories):
        worker = Worker(url, team=factories, **options)
    else:
        worker = Worker(url, factories, **options)

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


def _worker_options(args: SimpleNamespace) -> dict[str, Any]:
    return {
        "concurrency": args.concurrency,
        "lease_seconds": args.lease_seconds,
        "poll_interval": args.poll_interval,
        "grace_seconds": args.grace_seconds,
    }


def _worker_queues(args: SimpleNamespace) -> list[str] | None:
    return list(args.queues) or None


if __name__ == "__main__":
    entry()
