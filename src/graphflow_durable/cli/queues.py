"""``graphflow-durable queues set|list|clear``: the named queues of a worker pool and their settings.

A thin shell over :meth:`WorkQueue.configure`, :meth:`WorkQueue.clear` and :meth:`WorkQueue.stats`
(``store.queue``), for :mod:`.runs`: it adds the ``queues`` group and prints what the store says
(a table; ``--json``: one JSON object per queue).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import click

from graphflow_durable.cli._common import INT, Choice, json_option, store_option, table
from graphflow_durable.store import QueueSettings, Store

__all__ = ["EPILOG", "add_commands", "run"]

Out = Callable[[str], None]
#: What runs a ``queues`` sub-command once Click parsed it: ``(name, parameters) -> exit code``.
Dispatch = Callable[[str, dict[str, Any]], int]

_SETTINGS = ("concurrency", "worker-concurrency", "partition-concurrency", "rate")

EPILOG = """\
  queues set NAME [--concurrency N] [--worker-concurrency N] [--partition-concurrency N]
             [--rate N/PERIOD] [--json]
                                     set a queue's caps for every worker: runs driven at once
                                     across the pool, per worker, per partition key (default 1),
                                     run starts per period (100/60s; PERIOD like 1s, 60s, 1m, 1h)
  queues list [--json]               each queue: settings, queued, claimable now, active, waiting
                                     for a person, backing off, scheduled, oldest queued age
  queues clear NAME SETTING [--json] remove one setting (concurrency, worker-concurrency,
                                     partition-concurrency, rate): no such limit
"""


def add_commands(cli: click.Group, dispatch: Dispatch) -> None:
    """Add the ``queues`` group and its sub-commands to ``cli``; each runs through ``dispatch``."""

    @cli.group("queues", help="named queues: caps, partitions and rates of the worker pool")
    def queues() -> None:
        """The ``queues`` group."""

    @queues.command("set", help="set a queue's settings (the others are left as they are)")
    @store_option
    @click.argument("name", metavar="NAME")
    @click.option("--concurrency", type=INT, default=None, help="runs driven at once across all workers")
    @click.option("--worker-concurrency", type=INT, default=None, help="runs driven at once by one worker")
    @click.option(
        "--partition-concurrency", type=INT, default=None, help="runs driven at once per partition key"
    )
    @click.option("--rate", default=None, metavar="N/PERIOD", help="run starts per period, e.g. 100/60s")
    @json_option("the queue's settings as one JSON object")
    def _set(**params: Any) -> int:
        return dispatch("set", params)

    @queues.command("list", help="list the queues, their settings and what they hold")
    @store_option
    @json_option("one JSON object per queue")
    def _list(**params: Any) -> int:
        return dispatch("list", params)

    @queues.command("clear", help="remove one setting of a queue (no such limit)")
    @store_option
    @click.argument("name", metavar="NAME")
    @click.argument("setting", metavar="SETTING", type=Choice(_SETTINGS))
    @json_option("the queue's settings as one JSON object")
    def _clear(**params: Any) -> int:
        return dispatch("clear", params)


def run(store: Store, args: SimpleNamespace, out: Out) -> int:
    """Run ``queues`` ``args.runs_command``; its exit code (errors raise)."""
    if args.runs_command == "list":
        rows = store.queue.stats()
        if args.json:
            for row in rows:
                out(json.dumps(row))
            return 0
        for line in table(
            [
                ("QUEUE", 16),
                ("CONC", 5),
                ("WORKER", 6),
                ("PART", 5),
                ("RATE", 10),
                ("QUEUED", 7),
                ("CLAIMABLE", 9),
                ("ACTIVE", 7),
                ("WAITING", 7),
                ("BACKOFF", 7),
                ("OLDEST", 8),
            ],
            (_cells(row) for row in rows),
        ):
            out(line)
        return 0
    if args.runs_command == "set":
        done = store.queue.configure(
            args.name,
            concurrency=args.concurrency,
            worker_concurrency=args.worker_concurrency,
            partition_concurrency=args.partition_concurrency,
            rate=args.rate,
        )
    else:
        done = store.queue.clear(args.name, args.setting.replace("-", "_"))
    out(json.dumps(done.to_json()) if args.json else _said(done))
    return 0


def _cells(row: dict[str, Any]) -> list[str]:
    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    age = row["oldest_queued_age"]
    return [
        row["queue"],
        shown(row["concurrency"]),
        shown(row["worker_concurrency"]),
        shown(row["partition_concurrency"]),
        shown(row["rate"]),
        str(row["queued"]),
        str(row["claimable"]),
        str(row["active"]),
        str(row["waiting"]),
        str(row["backing_off"]),
        "-" if age is None else f"{age:.0f}s",
    ]


def _said(settings: QueueSettings) -> str:
    given = {k: v for k, v in settings.to_json().items() if k != "queue" and v is not None}
    limits = ", ".join(f"{k} {v}" for k, v in given.items()) or "no limits"
    return f"queue {settings.queue}: {limits}"
