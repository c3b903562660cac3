"""A run's rows copied as they are: to a new run started at a past step (a fork, ``Store.fork``,
the SQL half of ``_model.history``; the cut itself is read back by ``Store.cut``), or to and from
the JSON document of an export (``_storage.document``: its format and the checks an import
passes), so a run moves between SQLite and PostgreSQL.

Rows are read with every checksum checked (a damaged row is refused, never copied), and written
under their (new) run id with checksums computed afresh: a checksum covers the run id. After the
rows are written, the run is read back in the same transaction by the read path a resume uses
(``reading.read_log``: checksums, agent-state folding), so a run that would not resume is never
left behind. Agent-state bodies are copied as the exact text stored (their splices and message
references stay valid: the messages keep their seqs).

Recorded model and tool calls (``_storage/calls.py``) go with their run: an export carries them all
(a run moved to another store replays its in-flight turn's calls there, as it would have here); a
fork carries those of the turns it copies (completed within the cut: :func:`copied_calls`), not
those of a turn in flight at the cut, which runs again in the fork as a turn of the new run. Under
a new run id, a record's turn key of the run's own shape (``run/node/step``) names the new run
(:func:`rekey_calls`), as the turn itself does there; a key a turn brought from another run keeps it.

Sealed content (``_storage/sealing``) is bound to its run id, so rows copied under another id are
opened with the source's place (:func:`open_rows`) and sealed again for the new one
(:func:`seal_rows`) with the target store's codec; an export keeps them as stored unless asked
to open them (``runs export --decrypt``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.history import check_step, cut_record, cut_status
from graphflow_durable._model.records import RunLog, RunRecord, StepKind, StepRecord, StoredMessage
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import checksum as C
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.calls import checked
from graphflow_durable._storage.lease import owner_gone
from graphflow_durable._storage.reading import read_log
from graphflow_durable._storage.schema import agent_states, call_records, messages, runs, steps
from graphflow_durable._storage.sealing import PLAIN, Sealer, is_sealed, position_of
from graphflow_durable.errors import ConflictError, RunLockedError, UsageError

__all__ = [
    "RunRows",
    "copied_calls",
    "fork_run",
    "open_rows",
    "read_cut",
    "read_rows",
    "rekey_calls",
    "seal_rows",
    "write_rows",
]

_log = logging.getLogger(__name__)

_at = sa.bindparam("p_at", type_=sa.Integer)
_STEPS = (
    sa.select(steps)
    .where(steps.c.run_id == sa.bindparam("p_run_id"), steps.c.seq <= _at)
    .order_by(steps.c.seq)
)
_MESSAGES = (
    sa.select(messages)
    .where(messages.c.run_id == sa.bindparam("p_run_id"), messages.c.step_seq <= _at)
    .order_by(messages.c.seq)
)
_STATES = (
    sa.select(agent_states)
    .where(agent_states.c.run_id == sa.bindparam("p_run_id"), agent_states.c.step_seq <= _at)
    .order_by(agent_states.c.step_seq, agent_states.c.node)
)
_ALL_CALLS = (
    sa.select(call_records)
    .where(call_records.c.run_id == sa.bindparam("p_run_id"))
    .order_by(call_records.c.seq)
)
_CALLS = _ALL_CALLS.where(call_records.c.step <= _at)
#: A call record's columns as a :class:`RunRows` holds them (no run id, no checksum).
CALL_COLUMNS = tuple(c.name for c in call_records.c if c.name not in ("run_id", "checksum"))


@dataclass
class RunRows:
    """A run's stored rows, their JSON as the stored text, without run ids and checksums."""

    run: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def log(self, run: RunRecord) -> RunLog:
        """The rows as a :class:`RunLog` without agent states (enough for ``_model.history``)."""
        last = self.steps[-1] if self.steps else None
        return RunLog(
            run=run,
            steps=[
                StepRecord(s["seq"], StepKind(s["kind"]), s["node"], loads(s["data"]), s["created_at"])
                for s in self.steps
            ],
            messages=[
                StoredMessage(m["seq"], m["step_seq"], loads(m["body"]), bool(m["published"]))
                for m in self.messages
            ],
            scheduler=None if last is None else loads(last["scheduler"]),
            agent_states={},
        )


#: The content of :class:`RunRows` by table: (the attribute holding its rows, its sealed columns).
_CONTENT = (
    ("steps", steps.name, ("data",)),
    ("messages", messages.name, ("body",)),
    ("states", agent_states.name, ("body",)),
    ("calls", call_records.name, ("result",)),
)


def _each(
    rows: RunRows,
    run_id: str,
    change: Callable[[str | None, str, str | int, str, dict[str, Any]], str | None],
) -> RunRows:
    """``rows`` with every content value replaced by ``change(value, table, position, column, row)``."""
    out = RunRows(run=dict(rows.run))
    for column in ("task", "result"):
        out.run[column] = change(rows.run[column], runs.name, "run", column, out.run)
    for attribute, table, columns in _CONTENT:
        copied = []
        for row in getattr(rows, attribute):
            new = dict(row)
            for column in columns:
                position = position_of(table, {**row, "run_id": run_id})
                new[column] = change(row[column], table, position, column, new)
            copied.append(new)
        setattr(out, attribute, copied)
    return out


def open_rows(rows: RunRows, run_id: str, sealer: Sealer) -> RunRows:
    """``rows`` of run ``run_id`` with every sealed value opened (a plain one is kept as it is, as
    the store's reads keep it). Raises StoreConfigError (a key missing) or StoreCorruptError."""

    def opened(
        value: str | None, table: str, position: str | int, column: str, row: dict[str, Any]
    ) -> str | None:
        if not is_sealed(value):
            return value
        seq = row.get("seq", row.get("step_seq"))
        return sealer.open(value, table, run_id, position, column, seq=seq, node=row.get("node"))

    return _each(rows, run_id, opened)


def seal_rows(rows: RunRows, run_id: str, sealer: Sealer) -> RunRows:
    """``rows`` (plain) with every content value sealed for run ``run_id`` (kept without a codec)."""
    if not sealer.on:
        return rows
    return _each(
        rows,
        run_id,
        lambda value, table, position, column, _row: sealer.seal(value, table, run_id, position, column),
    )


def read_rows(
    conn: sa.Connection, run_id: str, url: str, at: int | None = None, sealer: Sealer | None = None
) -> RunRows:
    """The run's rows (up to step ``at``), each checked against its checksum; with ``sealer``,
    every sealed value opened (else as stored).

    Raises RunNotFoundError, or StoreCorruptError naming the first damaged row.
    """
    p: dict[str, Any] = {"p_run_id": run_id}
    found = conn.execute(S.SELECT_RUN, p).mappings().first()
    if found is None:
        raise S.not_found(run_id)
    run = dict(found)
    p["p_at"] = run["head_seq"] if at is None else at
    rows = RunRows(run=run)
    for s in conn.execute(_STEPS, p).mappings():
        if s["checksum"] is not None and s["checksum"] != C.step_sum(
            run_id, s["seq"], s["kind"], s["node"], s["data"], s["scheduler"]
        ):
            raise C.corrupt(C.Damage(run_id, C.STEPS, s["seq"], node=s["node"]), url)
        rows.steps.append({k: s[k] for k in ("seq", "kind", "node", "scheduler", "data", "created_at")})
    for m in conn.execute(_MESSAGES, p).mappings():
        if m["checksum"] is not None and m["checksum"] != C.message_sum(
            run_id, m["seq"], m["step_seq"], m["published"], m["body"]
        ):
            raise C.corrupt(C.Damage(run_id, C.MESSAGES, m["step_seq"], seq=m["seq"]), url)
        rows.messages.append({k: m[k] for k in ("seq", "step_seq", "published", "body")})
    for r in conn.execute(_STATES, p).mappings():
        if r["checksum"] is not None and r["checksum"] != C.state_sum(
            run_id, r["node"], r["step_seq"], r["base_step"], r["body"]
        ):
            raise C.corrupt(C.Damage(run_id, C.STATES, r["step_seq"], node=r["node"]), url)
        rows.states.append({k: r[k] for k in ("node", "step_seq", "base_step", "body")})
    # every record for an export (none left behind), those of the turns dispatched by step ``at`` for a cut
    for c in conn.execute(_ALL_CALLS if at is None else _CALLS, p).mappings():
        checked(c, url)
        rows.calls.append({k: c[k] for k in CALL_COLUMNS})
    return rows if sealer is None else open_rows(rows, run_id, sealer)


def copied_calls(rows: RunRows) -> list[dict[str, Any]]:
    """The call records of the turns ``rows`` (a cut) copies: those of a node's turn dispatched at
    step ``d`` that the node completed at a step after ``d`` within the cut. A turn in flight at the
    cut runs again in a fork, as a turn of the new run (a new idempotency key), so its records stay
    with the source: a record is not a cache, and a fork's turn is not the source's."""
    completed: dict[str, list[int]] = {}
    for s in rows.steps:
        if s["kind"] == StepKind.COMPLETE.value and s["node"] is not None:
            completed.setdefault(s["node"], []).append(s["seq"])
    return [c for c in rows.calls if any(seq > c["step"] for seq in completed.get(c["node"], ()))]


def rekey_calls(calls: Sequence[dict[str, Any]], old_id: str, new_id: str) -> list[dict[str, Any]]:
    """``calls`` of run ``old_id`` as run ``new_id``'s: a turn key ``old_id/node/step`` (the shape
    ``ExecutionContext.idempotency_key`` has) becomes ``new_id/node/step``, the key the turn has in
    the new run; any other key (one a moved turn kept from another run) is kept."""
    if old_id == new_id:
        return list(calls)
    return [
        {**c, "turn_key": f"{new_id}/{c['node']}/{c['step']}"}
        if c["turn_key"] == f"{old_id}/{c['node']}/{c['step']}"
        else c
        for c in calls
    ]


def write_rows(
    conn: sa.Connection, rows: RunRows, run: Mapping[str, Any], url: str, sealer: Sealer
) -> RunLog:
    """Write ``rows`` (their content plain) as the run whose row is ``run`` (its values, JSON as
    text), sealed with ``sealer`` for the run's id (a store without a codec writes them plain), with
    fresh checksums over the stored text, no lease holder and a new fencing token from the store's counter (a driver of a run
    deleted under this id can never commit to it); then read it back as a resume would (the
    caller's transaction is rolled back if that fails). Returns the log read back.

    Raises ConflictError when a run with this id exists already.
    """
    run_id = run["run_id"]
    rows = seal_rows(RunRows(dict(run), rows.steps, rows.messages, rows.states, rows.calls), run_id, sealer)
    values = {
        **rows.run,
        **S.NO_HOLDER,
        "fencing_token": S.next_token(conn),
        "sealed": True if sealer.on else None,
    }
    try:
        with conn.begin_nested():  # a refused row leaves the transaction usable, to ask why
            conn.execute(S.INSERT_RUN, values)
    except sa.exc.IntegrityError as exc:
        if conn.execute(S.SELECT_RUN, {"p_run_id": run_id}).first() is None:
            # not the id: a value the schema refuses (the callers check values first; say so plainly)
            reason = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
            raise UsageError(
                f"run {run_id}: {url} refuses its row ({reason}); nothing was written", run_id=run_id
            ) from exc
        raise ConflictError(
            f"run {run_id} already exists in {url}; choose another id for the new run (--run-id)",
            run_id=run_id,
            url=url,
        ) from exc
    if rows.steps:
        conn.execute(S.INSERT_STEP, [_with_sum(run_id, s, C.step_sum, _STEP_KEYS) for s in rows.steps])
    if rows.messages:
        conn.execute(
            S.INSERT_MESSAGE, [_with_sum(run_id, m, C.message_sum, _MESSAGE_KEYS) for m in rows.messages]
        )
    if rows.states:
        conn.execute(S.INSERT_STATE, [_with_sum(run_id, r, C.state_sum, _STATE_KEYS) for r in rows.states])
    if rows.calls:
        conn.execute(
            sa.insert(call_records),
            [{**c, "run_id": run_id, "checksum": C.call_sum(run_id, c)} for c in rows.calls],
        )
    return read_log(conn, run_id, url, sealer=sealer)


_STEP_KEYS = ("seq", "kind", "node", "data", "scheduler")
_MESSAGE_KEYS = ("seq", "step_seq", "published", "body")
_STATE_KEYS = ("node", "step_seq", "base_step", "body")


def _with_sum(run_id: str, row: Mapping[str, Any], checksum: Any, keys: Sequence[str]) -> dict[str, Any]:
    return {**row, "run_id": run_id, "checksum": checksum(run_id, *(row[k] for k in keys))}


def read_cut(conn: sa.Connection, run_id: str, at: int, url: str, sealer: Sealer = PLAIN) -> RunLog:
    """The run as it stood once step ``at`` was committed (see ``Store.cut``), every row checked
    (and opened by ``sealer``)."""
    run = S.run_row(conn, run_id, sealer)
    log = read_log(conn, run_id, url, check_step(run, at), sealer)
    return dataclasses.replace(log, run=cut_record(run, log, at))


def fork_run(
    conn: sa.Connection,
    run_id: str,
    at: int,
    new_run_id: str | None,
    url: str,
    replace: tuple[int, Mapping[str, Any]] | None = None,
    sealer: Sealer | None = None,
) -> RunRecord:
    """Write a new run holding ``run_id``'s rows up to step ``at`` (see ``Store.fork``); its row."""
    sealer = PLAIN if sealer is None else sealer  # sealed rows: opened, and sealed for the fork
    new_id = check_run_id(new_run_id if new_run_id is not None else f"{run_id}-fork-{uuid.uuid4().hex[:8]}")
    source = S.run_row(conn, run_id, sealer)
    check_step(source, at)
    if replace is not None:
        rows, at = _replaced(conn, source, at, replace, url, sealer)
    else:
        rows = None
    if at == source.head_seq and source.status == "running" and source.lease_owner is not None:
        held = (source.lease_expires_at or 0) >= S.lease_clock(conn, time.time()) and not owner_gone(source)
        if held:
            raise RunLockedError(
                f"run {run_id} is running under {source.lease_owner} and step {at} is its head: its "
                "nodes in flight are running there; fork at an earlier step, or after the run ends",
                run_id=run_id,
                owner=source.lease_owner,
                expires_at=source.lease_expires_at,
            )
    rows = rows or read_rows(conn, run_id, url, at, sealer)
    rows.calls = rekey_calls(copied_calls(rows), run_id, new_id)
    cut = cut_record(source, rows.log(source), at)
    now = time.time()
    values = {
        "run_id": new_id,
        "graph_fingerprint": rows.run["graph_fingerprint"],
        "graph": rows.run["graph"],
        "status": cut.status,
        "head_seq": at,
        "message_count": cut.message_count,
        "task": None if cut.task is None else dumps(cut.task),
        "result": None if cut.result is None else dumps(cut.result),
        "parent_run_id": run_id,
        "created_at": now,
        "updated_at": now,
    }
    forked = write_rows(conn, rows, values, url, sealer).run
    _log.info("run %s: forked at step %d as run %s (%s)", run_id, at, new_id, forked.status)
    return forked


def _replaced(
    conn: sa.Connection,
    source: RunRecord,
    at: int,
    replace: tuple[int, Mapping[str, Any]],
    url: str,
    sealer: Sealer,
) -> tuple[RunRows, int]:
    """The rows of a fork whose message ``replace[0]`` (a node's answer, in the cut at ``at``) says
    ``replace[1]`` instead, cut just after the step that added it; and that step.

    The scheduler state of that step is kept, so the answer's content must not have decided
    anything there: the node's edges have no conditions, and the step did not end the round. The
    node's own state saved at that step has its old answer's text replaced by the new one.
    """
    run_id = source.run_id
    seq, body = replace
    rows = read_rows(conn, run_id, url, at, sealer)
    found = next((m for m in rows.messages if m["seq"] == seq), None)
    if found is None:
        raise _refused(
            source,
            f"message {seq} is not in the run at step {at} (it has messages 0 to {len(rows.messages) - 1})",
        )
    step = rows.steps[found["step_seq"] - 1]
    answers = [m for m in rows.messages if m["step_seq"] == step["seq"] and m["published"]]
    node = step["node"]
    if step["kind"] != StepKind.COMPLETE.value or not answers or answers[-1]["seq"] != seq:
        raise _refused(source, f"message {seq} is not a node's answer (only a node's answer can be replaced)")
    old, new = loads(found["body"]), dict(body)
    if (
        new.get("source") != node
        or not isinstance(new.get("content"), str)
        or not isinstance(old.get("content"), str)
    ):
        raise _refused(
            source,
            f"message {seq} is node {node!r}'s text answer: the replacement must be a text message "
            f"whose source is {node!r}",
        )
    edges = source.graph.get("nodes", {}).get(node, {}).get("edges", [])
    if any(edge.get("condition") is not None for edge in edges):
        raise _refused(
            source,
            f"node {node!r}'s edges have conditions, decided on its answer at step {step['seq']}; "
            f"fork at step {step['seq'] - 1} to let it answer again instead",
        )
    if cut_status(loads(step["scheduler"])) != "interrupted":
        raise _refused(
            source, f"step {step['seq']} ended the round, decided on message {seq}; it cannot be replaced"
        )
    cut = step["seq"]
    state = read_log(conn, run_id, url, cut, sealer).agent_states.get(node)
    saved = any(r["node"] == node and r["step_seq"] == cut for r in rows.states)  # its state at that turn
    rows = RunRows(
        run=rows.run,
        steps=rows.steps[:cut],
        messages=[
            {**m, "body": dumps(new, where="replace")} if m["seq"] == seq else m
            for m in rows.messages
            if m["step_seq"] <= cut
        ],
        states=[
            r for r in rows.states if r["step_seq"] < cut or (r["step_seq"] == cut and r["node"] != node)
        ],
        calls=[c for c in rows.calls if c["step"] <= cut],
    )
    if saved and state is not None:
        text = dumps(state).replace(dumps(old["content"]), dumps(new["content"]))
        rows.states.append({"node": node, "step_seq": cut, "base_step": None, "body": dumps(loads(text))})
    return rows, cut


def _refused(run: RunRecord, why: str) -> UsageError:
    return UsageError(f"run {run.run_id}: {why}; nothing was written", run_id=run.run_id, option="replace")
