"""A run's rows copied as they are: to a new run (a fork), or to and from the JSON document of an
export (``_storage.document``: its format and the checks an import passes), so a run moves between
SQLite and PostgreSQL.

Rows are read with every checksum checked (a damaged row is refused, never copied), and written
under their (new) run id with checksums computed afresh: a checksum covers the run id. After the
rows are written, the run is read back in the same transaction by the read path a resume uses
(``reading.read_log``: checksums, agent-state folding), so a run that would not resume is never
left behind. Agent-state bodies are copied as the exact text stored (their splices and message
references stay valid: the messages keep their seqs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import loads
from graphflow_durable._model.records import (
    RunLog,
    RunRecord,
    StepKind,
    StepRecord,
    StoredMessage,
)
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.checksum import (
    MESSAGES,
    STATES,
    STEPS,
    Damage,
    corrupt,
    message_sum,
    state_sum,
    step_sum,
)
from graphflow_durable._storage.reading import read_log
from graphflow_durable._storage.rows import not_found
from graphflow_durable._storage.schema import agent_states, messages, steps
from graphflow_durable.errors import ConflictError, UsageError

__all__ = ["RunRows", "read_rows", "write_rows"]

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


@dataclass
class RunRows:
    """A run's stored rows, their JSON as the stored text, without run ids and checksums."""

    run: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)

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


def read_rows(conn: sa.Connection, run_id: str, url: str, at: int | None = None) -> RunRows:
    """The run's rows (up to step ``at``), each checked against its checksum.

    Raises RunNotFoundError, or StoreCorruptError naming the first damaged row.
    """
    p: dict[str, Any] = {"p_run_id": run_id}
    found = conn.execute(S.SELECT_RUN, p).mappings().first()
    if found is None:
        raise not_found(run_id)
    run = dict(found)
    p["p_at"] = run["head_seq"] if at is None else at
    rows = RunRows(run=run)
    for s in conn.execute(_STEPS, p).mappings():
        if s["checksum"] is not None and s["checksum"] != step_sum(
            run_id, s["seq"], s["kind"], s["node"], s["data"], s["scheduler"]
        ):
            raise corrupt(Damage(run_id, STEPS, s["seq"], node=s["node"]), url)
        rows.steps.append({k: s[k] for k in ("seq", "kind", "node", "scheduler", "data", "created_at")})
    for m in conn.execute(_MESSAGES, p).mappings():
        if m["checksum"] is not None and m["checksum"] != message_sum(
            run_id, m["seq"], m["step_seq"], m["published"], m["body"]
        ):
            raise corrupt(Damage(run_id, MESSAGES, m["step_seq"], seq=m["seq"]), url)
        rows.messages.append({k: m[k] for k in ("seq", "step_seq", "published", "body")})
    for r in conn.execute(_STATES, p).mappings():
        if r["checksum"] is not None and r["checksum"] != state_sum(
            run_id, r["node"], r["step_seq"], r["base_step"], r["body"]
        ):
            raise corrupt(Damage(run_id, STATES, r["step_seq"], node=r["node"]), url)
        rows.states.append({k: r[k] for k in ("node", "step_seq", "base_step", "body")})
    return rows


def write_rows(conn: sa.Connection, rows: RunRows, run: Mapping[str, Any], url: str) -> RunLog:
    """Write ``rows`` as the run whose row is ``run`` (its stored values, JSON as text), with fresh
    checksums, no lease holder and a new fencing token from the store's counter (a driver of a run
    deleted under this id can never commit to it); then read it back as a resume would (the
    caller's transaction is rolled back if that fails). Returns the log read back.

    Raises ConflictError when a run with this id exists already.
    """
    run_id = run["run_id"]
    values = {
        **run,
        **S.NO_HOLDER,
        "fencing_token": S.next_token(conn),
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
        conn.execute(S.INSERT_STEP, [_with_sum(run_id, s, step_sum, _STEP_KEYS) for s in rows.steps])
    if rows.messages:
        conn.execute(
            S.INSERT_MESSAGE, [_with_sum(run_id, m, message_sum, _MESSAGE_KEYS) for m in rows.messages]
        )
    if rows.states:
        conn.execute(S.INSERT_STATE, [_with_sum(run_id, r, state_sum, _STATE_KEYS) for r in rows.states])
    return read_log(conn, run_id, url)


_STEP_KEYS = ("seq", "kind", "node", "data", "scheduler")
_MESSAGE_KEYS = ("seq", "step_seq", "published", "body")
_STATE_KEYS = ("node", "step_seq", "base_step", "body")


def _with_sum(run_id: str, row: Mapping[str, Any], checksum: Any, keys: Sequence[str]) -> dict[str, Any]:
    return {**row, "run_id": run_id, "checksum": checksum(run_id, *(row[k] for k in keys))}
