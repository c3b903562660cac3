"""``graphflow-durable runs show|cancel|retry|supply|delete|prune|stats``: looking at and managing runs.

A thin shell over the store's management calls (:meth:`Store.cancel_run`, :meth:`Store.retry_run`,
:meth:`Store.supply_output`, :meth:`Store.delete_run`, :meth:`Store.prune`, :meth:`Store.stats`), for :mod:`.runs`: it adds the
sub-commands to the ``runs`` group, checks their arguments before the store is opened, and prints
their results (a table or sentences; ``--json``: one JSON object).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import click

from graphflow_durable._model.records import CallSummary, RunRecord
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage.lease import iso
from graphflow_durable._storage.statements import not_found
from graphflow_durable.cli._common import Choice, json_option, store_option, table
from graphflow_durable.store import RUN_STATUSES, Removal, Store
from graphflow_durable.views import run_show, submitted_show

__all__ = ["COMMANDS", "EXIT_REFUSED", "add_commands", "check", "older_than", "run"]

#: The run's state does not allow it: ``delete``/``prune`` of a running run without ``--force``,
#: ``retry`` of a run a live driver holds, ``cancel``/``retry`` of a stopped or finished run,
#: ``supply`` to a run that did not fail on a node's spent budget.
EXIT_REFUSED = 5

COMMANDS = ("show", "cancel", "retry", "supply", "delete", "prune", "stats")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")

Out = Callable[[str], None]
#: What runs a ``runs`` sub-command once Click parsed it: ``(name, parameters) -> exit code``.
Dispatch = Callable[[str, dict[str, Any]], int]


def older_than(text: str) -> float:
    """``--older-than`` as seconds: a number and a unit, ``s``/``m``/``h``/``d``/``w`` (``30d``).

    Raises:
        ValueError: ``text`` is no such age (the message says what to give).
    """
    found = _AGE.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not an age; give a number and a unit: 90s, 45m, 12h, 30d or 2w")
    return float(found.group(1)) * _UNITS[found.group(2)]


class _Age(click.ParamType):  # type: ignore[type-arg]
    name = "age"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return older_than(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def add_commands(runs: click.Group, dispatch: Dispatch) -> None:
    """Add the sub-commands to the ``runs`` group; each runs through ``dispatch``."""

    def add(name: str, help: str, *options: Callable[[Any], Any], run: bool = True) -> None:
        def command(**params: Any) -> int:
            return dispatch(name, params)

        for option in reversed(options):
            command = option(command)
        if run:
            command = click.argument("run_id", metavar="RUN")(command)
        runs.command(name, help=help)(store_option(json_option("print one JSON object")(command)))

    add("show", "a run's status, round, head, lease and last error")
    add("cancel", "stop a run (its driver stops before its next dispatch); run() resumes it")
    add(
        "retry",
        "make a failed, cancelled or interrupted run resumable: a worker or the next run() resumes it",
    )
    add(
        "supply",
        "write the answer of the node a failed run failed on; the run continues without it\n\n"
        "NODE: the node the run failed on ('runs show' names it); TEXT: its answer",
        click.argument("node", metavar="NODE"),
        click.argument("text", metavar="TEXT"),
    )
    add(
        "delete",
        "delete a run, its rows and its nested runs",
        click.option("--force", is_flag=True, help="delete it even if it is running"),
        click.option("--dry-run", is_flag=True, help="count what would go, delete nothing"),
    )
    add(
        "prune",
        "delete old runs of some statuses (retention)",
        click.option(
            "--status",
            multiple=True,
            type=Choice(RUN_STATUSES),
            help="runs of this status (repeatable; default finished)",
        ),
        click.option(
            "--older-than", type=_Age(), required=True, metavar="AGE", help="last updated before: 30d, 12h..."
        ),
        click.option("--force", is_flag=True, help="prune running runs (and held ones) too"),
        click.option("--dry-run", is_flag=True, help="list what would go, delete nothing"),
        run=False,
    )
    add("stats", "runs per status, rows and bytes per table", run=False)


def check(args: SimpleNamespace) -> None:
    """Refuse a bad RUN before the store is opened (a usage error)."""
    if getattr(args, "run_id", None) is not None:
        check_run_id(args.run_id, option="RUN")


def run(store: Store, args: SimpleNamespace, out: Out) -> int:
    """Run the sub-command ``args.runs_command``; its exit code."""
    command: Callable[[Store, SimpleNamespace, Out], None] = {
        "show": _show,
        "cancel": _cancel,
        "retry": _retry,
        "supply": _supply,
        "delete": _delete,
        "prune": _prune,
        "stats": _stats,
    }[args.runs_command]
    command(store, args, out)
    return 0


def _placed(shown: dict[str, Any]) -> str:
    part = "" if shown["partition"] is None else f", partition {shown['partition']}"
    return f"{shown['queue']} (priority {shown['priority']}{part})"


def _show(store: Store, args: SimpleNamespace, out: Out) -> None:
    run = store.get_run(args.run_id)
    if run is None and (waiting := store.queue.get_submission(args.run_id)) is not None:
        pending = submitted_show(store, waiting, store.lease_clock())
        if args.json:
            out(json.dumps(pending, sort_keys=True))
            return
        for key, value in pending.items():
            out(
                f"{'run' if key == 'run_id' else key.replace('_', ' '):<11} {'-' if value is None else value}"
            )
        return
    if run is None:
        raise not_found(args.run_id)  # the words of every command on an unknown run
    seen = run_show(store, run)
    shown, at, failure, calls, asked = seen.fields, seen.progress, seen.failure, seen.calls, seen.requests
    parked = run.status == "waiting"
    if args.json:
        out(json.dumps(shown, sort_keys=True))
        return
    step = "-" if at.head_kind is None else f"{at.head_kind}{f' {at.head_node}' if at.head_node else ''}"
    lease = "-"
    if run.lease_owner is not None:
        where = f"pid {run.lease_pid} on {run.lease_host}"
        lease = f"{run.lease_owner} ({where}; {shown['lease_state']}, until {iso(run.lease_expires_at)})"
    lines = [
        ("run", run.run_id),
        *([] if run.parent_run_id is None else [("parent", run.parent_run_id)]),
        ("status", run.status),
        ("round", str(at.rounds)),
        ("head", f"{run.head_seq} ({step} at {iso(at.head_at)})" if at.head_at is not None else "0"),
        ("messages", str(run.message_count)),
        *(
            []
            if shown["content"] is None
            else [("content", f"<sealed with key {shown['content']['sealed']!r}>")]
        ),
        ("lease", lease),
        ("cancel", _cancel_words(run)),
        ("team", shown["team"] or "-"),
        ("queue", _placed(shown)),
        *([] if shown["not_starting"] is None else [("not starting", shown["not_starting"])]),
        ("attempts", str(shown["attempts"])),
        ("last error", shown["last_error"] or "-"),
        *(
            (
                "in flight",
                f"{node}: attempt {c['attempts']}, {c['failures']} failed, {c['crashes']} died with the process",
            )
            for node, c in at.turns.items()
        ),
        *(
            []
            if at.next_attempt_at is None
            else [("next retry", f"{iso(at.next_attempt_at)} ({_from_now(at.next_attempt_at)})")]
        ),
        *(
            []
            if failure is None
            else [
                (
                    "failed",
                    f"node {failure.node} after {failure.attempts} attempt{'s' if failure.attempts != 1 else ''}"
                    f" ({failure.cause}): {failure.error_type}: {failure.error}; "
                    f"'graphflow-durable runs retry {run.run_id}' gives it a fresh budget, "
                    f"'graphflow-durable runs supply {run.run_id} {failure.node} TEXT' its answer",
                )
            ]
        ),
        *(
            (
                "waits for" if parked else "asked",
                f"{r.request_id}: {r.node} asks {r.prompt!r}"
                + ("" if r.deadline is None else f" (deadline {iso(r.deadline)})")
                + _open_request_hint(run.status),
            )
            for r in asked
        ),
        ("calls", _calls(calls)),
        ("created", iso(run.created_at)),
        ("updated", iso(run.updated_at)),
    ]
    for key, value in lines:
        out(f"{key:<11} {value}")


def _cancel_words(run: RunRecord) -> str:
    """The run's cancel request in words: none, pending, or one the round ended before."""
    if run.cancel_requested_at is None:
        return "-"
    asked = f"requested at {iso(run.cancel_requested_at)}"
    if run.ended_before_cancel:
        return f"{asked}; {run.status} before the cancel took effect (its last turn was already dispatched)"
    return asked


def _calls(calls: CallSummary) -> str:
    """A run's (or the store's) recorded model and tool calls in words."""
    return f"{calls.calls_live} made, {calls.calls_replayed} replayed ({calls.tokens_saved} tokens saved)"


def _from_now(at: float) -> str:
    """``at`` (epoch seconds) from now by this process's clock: "in 12 s", or "due" once past."""
    left = at - time.time()
    return f"in {left:.0f} s" if left >= 0.5 else "due"


def _open_request_hint(status: str) -> str:
    """What to do with a request a run that does not wait asked."""
    if status == "waiting":
        return ""
    if status == "failed":  # on its deadline: an answer makes it resumable, a retry asks again
        return " (open; answer it with 'runs respond', or ask again with a new deadline: 'runs retry')"
    # A cancelled run refuses an answer until the resumed run asks again (and waits).
    return " (open; answer it once the run is resumed and waits again)"


def _cancel(store: Store, args: SimpleNamespace, out: Out) -> None:
    done = store.cancel_run(args.run_id)
    if args.json:
        out(json.dumps({**done.__dict__}, sort_keys=True))
    elif done.outcome == "requested":
        out(
            f"run {done.run_id}: cancel requested; its driver {done.owner} (lease until "
            f"{iso(done.lease_expires_at)}) stops before its next dispatch and leaves it cancelled, unless "
            "its last turn is already dispatched: the run then ends on its own, and 'runs show' says it "
            "finished before the cancel took effect"
        )
    elif done.outcome == "cancelled":
        out(f"run {done.run_id}: cancelled (nobody was driving it); run() with no task resumes it")
    else:
        out(f"run {done.run_id}: already cancelled")


def _retry(store: Store, args: SimpleNamespace, out: Out) -> None:
    done = store.retry_run(args.run_id)
    if args.json:
        out(json.dumps({**done.__dict__}, sort_keys=True))
        return
    who = f"--team {done.team}=module:factory" if done.team is not None else "--team module:factory"
    was = "submitted, not started" if done.previous_status is None else done.previous_status
    now = done.status or "submitted"
    again = f"; asks again with a new deadline: {', '.join(done.asked_again)}" if done.asked_again else ""
    out(
        f"run {done.run_id}: queued again, {now} (was {was}); a worker started with {who} or the next "
        f"run() resumes it{again}"
    )


def _supply(store: Store, args: SimpleNamespace, out: Out) -> None:
    done = store.supply_output(args.run_id, args.node, args.text)
    if args.json:
        out(json.dumps(done.as_dict(), sort_keys=True))
        return
    then = f"with {', '.join(done.next)}" if done.next else "where its batch stands"
    out(
        f"run {done.run_id}: node {done.node}'s answer supplied (step {done.step}, message {done.message_seq}); "
        f"{done.status}: run() with no task, or a worker, continues it {then}"
    )


def _rows(removal: Removal) -> str:
    counts = {name.removeprefix("graphflow_").replace("_", " "): n for name, n in removal.rows.items()}
    return ", ".join(f"{n} {name}" for name, n in counts.items())


def _delete(store: Store, args: SimpleNamespace, out: Out) -> None:
    gone = store.delete_run(args.run_id, force=args.force, dry_run=args.dry_run)
    if args.json:
        out(json.dumps(gone.as_dict(), sort_keys=True))
        return
    verb = "would delete" if gone.dry_run else "deleted"
    nested = f" and {len(gone.run_ids) - 1} nested runs" if len(gone.run_ids) > 1 else ""
    out(f"run {args.run_id}{nested}: {verb} rows: {_rows(gone)}")


def _prune(store: Store, args: SimpleNamespace, out: Out) -> None:
    statuses = list(args.status) or ["finished"]
    gone = store.prune(older_than=args.older_than, status=statuses, dry_run=args.dry_run, force=args.force)
    if args.json:
        out(json.dumps(gone.as_dict(), sort_keys=True))
        return
    which = f"{'/'.join(statuses)} runs last updated more than {_age(args.older_than)} ago"
    if not gone.run_ids:
        out(f"nothing to prune: no {which}")
    else:
        verb = "would prune" if gone.dry_run else "pruned"
        out(f"{verb} {len(gone.run_ids)} {which} ({', '.join(gone.run_ids)}); rows: {_rows(gone)}")
    if gone.skipped:
        out(f"skipped {len(gone.skipped)} being driven (--force to prune them): {', '.join(gone.skipped)}")


def _age(seconds: float) -> str:
    for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1]):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _stats(store: Store, args: SimpleNamespace, out: Out) -> None:
    stats = store.stats()
    if args.json:
        out(json.dumps(stats.as_dict(), sort_keys=True))
        return
    total = sum(stats.runs.values())
    per = ", ".join(f"{status} {n}" for status, n in stats.runs.items() if n)
    out(f"runs: {total}{f' ({per})' if per else ''}; submissions waiting: {stats.submissions}")
    sizes = {name: "-" if size is None else str(size) for name, size in stats.bytes.items()}
    cells = [[name, str(rows), sizes[name]] for name, rows in stats.rows.items()]
    for line in table([("TABLE", 24), ("ROWS", -8), ("BYTES", -12)], cells):
        out(line)
    out(f"recorded calls: {_calls(stats.calls)}")
