"""Runs a page at a time, newest first, for the console (``Store.list_runs_page``), and the open
requests for human input of every run (``Store.open_requests``).

A page is keyset-paginated: its cursor is the last row's ``(created_at, run_id)``, and the next page
reads the rows strictly before it in that order, so a page costs the same on the 100,000th run as on
the first (no ``OFFSET``), and runs created meanwhile never shift a page. Everything a page shows of
its runs (their queue rows, pending requests, rounds) is read in the same transaction, in one
statement per kind for the whole page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from graphflow_durable._model.codec import loads
from graphflow_durable._model.human import InputRequest
from graphflow_durable._model.records import RUN_STATUSES, RunRecord, turn_counts
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.requests import _pending, _request
from graphflow_durable._storage.schema import input_requests, queue, runs, steps
from graphflow_durable._storage.sealing import PLAIN, Sealer
from graphflow_durable._storage.workqueue import Submission, submission
from graphflow_durable.errors import UsageError

__all__ = ["MAX_PAGE", "RunPage", "open_requests", "page", "parse_cursor", "status_counts"]

#: The most rows one page may ask for.
MAX_PAGE = 500

_R = runs.c


@dataclass(frozen=True)
class RunPage:
    """One page of runs, newest first, with what a listing shows of each.

    Attributes:
        runs: the runs, newest first (``created_at``, then ``run_id``, descending).
        submissions: the queue row of each run that has one.
        pending: each waiting run's pending requests for human input, oldest first.
        rounds: how many rounds each run began.
        in_flight: each running run's nodes in flight at its head (dispatched, not answered).
        next: the cursor of the next page (give it as ``after``), ``None`` on the last page.
    """

    runs: list[RunRecord]
    submissions: dict[str, Submission] = field(default_factory=dict)
    pending: dict[str, list[InputRequest]] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, list[str]] = field(default_factory=dict)
    next: str | None = None


def parse_cursor(after: str) -> tuple[float, str]:
    """A page cursor (``"<created_at>:<run_id>"``) as its parts; a malformed one is a
    :class:`UsageError`."""
    stamp, sep, run_id = after.partition(":")
    try:
        created = float(stamp)
    except ValueError:
        created = float("nan")
    if not sep or not run_id or created != created:
        raise UsageError(
            f"after={after!r} is not a page cursor; give the 'next' value of the page before",
            option="after",
        )
    return created, run_id


def page(
    conn: sa.Connection,
    *,
    status: Sequence[str] | None,
    text: str | None,
    parent: str | None = None,
    after: str | None,
    limit: int,
    sealer: Sealer = PLAIN,
) -> RunPage:
    """The page of runs after cursor ``after`` (first page: ``None``), of the statuses given (all:
    ``None``), whose run id contains ``text`` (case as given), at most ``limit`` of them."""
    if not 1 <= limit <= MAX_PAGE:
        raise UsageError(f"limit={limit} is out of range; give 1 to {MAX_PAGE}", option="limit")
    if status is not None and (bad := [s for s in status if s not in RUN_STATUSES]):
        raise UsageError(
            f"status={bad[0]!r} is not a run status; give one of {', '.join(RUN_STATUSES)}", option="status"
        )
    query = sa.select(runs).order_by(_R.created_at.desc(), _R.run_id.desc()).limit(limit + 1)
    if status is not None:
        query = query.where(_R.status.in_(list(status)))
    if parent is not None:
        query = query.where(_R.parent_run_id == parent)
    if text:
        query = query.where(_R.run_id.contains(text, autoescape=True))
    if after is not None:
        created, run_id = parse_cursor(after)
        query = query.where(
            sa.or_(_R.created_at < created, sa.and_(_R.created_at == created, _R.run_id < run_id))
        )
    found = [S.run_record(row, sealer, mark=True) for row in conn.execute(query).mappings()]
    more = len(found) > limit
    found = found[:limit]
    ids = [run.run_id for run in found]
    if not ids:
        return RunPage([])
    subs = {
        row["run_id"]: submission(row, sealer, mark=True)
        for row in conn.execute(sa.select(queue).where(queue.c.run_id.in_(ids))).mappings()
    }
    pending: dict[str, list[InputRequest]] = {}
    # what a run waits for is content: not read for a run whose keys the store does not hold
    waiting = [run.run_id for run in found if run.status == "waiting" and run.sealed_with is None]
    for request in _pending(conn, waiting, sealer) if waiting else []:
        pending.setdefault(request.run_id, []).append(request)
    counted = conn.execute(
        sa.select(steps.c.run_id, sa.func.count())
        .where(steps.c.run_id.in_(ids), steps.c.kind == "start")
        .group_by(steps.c.run_id)
    )
    rounds = {run_id: int(n) for run_id, n in counted}
    in_flight: dict[str, list[str]] = {}
    if running := [run.run_id for run in found if run.status == "running"]:
        heads = sa.select(steps.c.run_id, steps.c.scheduler).join(
            runs, sa.and_(_R.run_id == steps.c.run_id, _R.head_seq == steps.c.seq)
        )
        for run_id, cursor in conn.execute(heads.where(steps.c.run_id.in_(running))):
            in_flight[run_id] = sorted(turn_counts(_cursor(cursor)))
    last = found[-1]
    cursor = f"{last.created_at!r}:{last.run_id}" if more else None
    return RunPage(found, subs, pending, rounds, in_flight, cursor)


def _cursor(text: object) -> object:
    """A head step's stored cursor, or ``None`` when it cannot be read (``verify`` reports damage)."""
    try:
        return loads(text) if isinstance(text, str) else None
    except (ValueError, TypeError):
        return None


def status_counts(conn: sa.Connection) -> dict[str, int]:
    """Runs per status, every status (0 included), from the status index."""
    counts: dict[str, int] = dict.fromkeys(RUN_STATUSES, 0)
    for status, n in conn.execute(sa.select(_R.status, sa.func.count()).group_by(_R.status)):
        counts[str(status)] = int(n)
    return counts


def open_requests(conn: sa.Connection, limit: int, sealer: Sealer = PLAIN) -> list[InputRequest]:
    """The pending requests for human input of every run, oldest first, at most ``limit``."""
    query = (
        sa.select(input_requests)
        .where(input_requests.c.status == "pending")
        .order_by(input_requests.c.created_at, input_requests.c.run_id, input_requests.c.request_id)
        .limit(limit)
    )
    return [_request(row, sealer) for row in conn.execute(query).mappings()]
