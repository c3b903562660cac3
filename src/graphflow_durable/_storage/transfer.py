"""A run's rows copied as they are: to a new run (a fork), to a JSON document (export) and back into
a store (import), so a run moves between SQLite and PostgreSQL.

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

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.records import (
    RUN_STATUSES,
    RunLog,
    RunRecord,
    StepKind,
    StepRecord,
    StoredMessage,
)
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.admin import not_found
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
from graphflow_durable._storage.schema import agent_states, messages, steps
from graphflow_durable.errors import ConflictError, UsageError

__all__ = ["EXPORT_FORMAT", "RunRows", "read_rows", "write_rows"]

#: The ``format`` of an export document; its ``version`` is 1.
EXPORT_FORMAT = "graphflow-durable-run"
_VERSION = 1

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
_RUN_FIELDS = (
    "graph_fingerprint",
    "status",
    "head_seq",
    "message_count",
    "parent_run_id",
    "created_at",
    "updated_at",
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

    # -- the export document -------------------------------------------------------------------

    def document(self, schema_version: int) -> dict[str, Any]:
        """The rows as one JSON document (JSON columns decoded; agent-state bodies as their text)."""
        run = {k: self.run[k] for k in ("run_id", *_RUN_FIELDS)}
        run.update({k: _decoded(self.run[k]) for k in ("graph", "task", "result")})
        return {
            "format": EXPORT_FORMAT,
            "version": _VERSION,
            "schema_version": schema_version,
            "run": run,
            "steps": [
                {**s, "scheduler": loads(s["scheduler"]), "data": loads(s["data"])} for s in self.steps
            ],
            "messages": [
                {**m, "published": bool(m["published"]), "body": loads(m["body"])} for m in self.messages
            ],
            "agent_states": list(self.states),
        }

    @classmethod
    def from_document(cls, doc: Any, where: str, run_id: str | None = None) -> RunRows:
        """The rows of an export document (as run ``run_id`` if given; a run exported while
        ``running``, or ``waiting`` for a person, becomes ``interrupted``: its requests for human
        input are not exported, so a waiting node asks again); :class:`UsageError` naming what is
        wrong with it."""
        try:
            if not isinstance(doc, Mapping) or doc.get("format") != EXPORT_FORMAT:
                raise ValueError(f'it is not a graphflow-durable run export (no "format": "{EXPORT_FORMAT}")')
            if doc.get("version") != _VERSION:
                raise ValueError(
                    f"its version {doc.get('version')!r} is not {_VERSION}; use a matching release"
                )
            src = doc["run"]
            run = {k: src[k] for k in ("run_id", *_RUN_FIELDS)}
            run["run_id"] = check_run_id(run["run_id"] if run_id is None else run_id, option="run_id")
            run["status"] = "interrupted" if run["status"] in ("running", "waiting") else run["status"]
            run.update(
                {
                    k: None if src[k] is None else dumps(src[k], where=f"run/{k}")
                    for k in ("graph", "task", "result")
                }
            )
            rows = cls(
                run=run,
                steps=[
                    {
                        "seq": int(s["seq"]),
                        "kind": StepKind(s["kind"]).value,
                        "node": s["node"],
                        "scheduler": dumps(s["scheduler"], where="steps/scheduler"),
                        "data": dumps(s["data"], where="steps/data"),
                        "created_at": float(s["created_at"]),
                    }
                    for s in doc["steps"]
                ],
                messages=[
                    {
                        "seq": int(m["seq"]),
                        "step_seq": int(m["step_seq"]),
                        "published": bool(m["published"]),
                        "body": dumps(m["body"], where=f"messages/{m['seq']}/body"),
                    }
                    for m in doc["messages"]
                ],
                states=[
                    {
                        "node": str(r["node"]),
                        "step_seq": int(r["step_seq"]),
                        "base_step": None if r["base_step"] is None else int(r["base_step"]),
                        "body": _text(r["body"]),
                    }
                    for r in doc["agent_states"]
                ],
            )
            rows.check()
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"a field {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else str(exc)
            raise UsageError(f"{where}: {problem}; nothing was imported", option="document") from None
        return rows

    def check(self) -> None:
        """Refuse rows that do not make a run (``ValueError``): numbering, references, status."""
        run = self.run
        if run["status"] not in RUN_STATUSES:
            raise ValueError(f"run status {run['status']!r} is not one of {list(RUN_STATUSES)}")
        seqs = [s["seq"] for s in self.steps]
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != run["head_seq"]:
            raise ValueError(f"its steps are not numbered 1 to its head {run['head_seq']}")
        if [m["seq"] for m in self.messages] != list(range(run["message_count"])):
            raise ValueError(f"its messages are not numbered 0 to {run['message_count'] - 1}")
        for row in (*self.messages, *self.states):
            if not 1 <= row["step_seq"] <= len(seqs):
                raise ValueError(f"a row refers to step {row['step_seq']}, which it does not hold")


def _decoded(text: str | None) -> Any:
    return None if text is None else loads(text)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("an agent-state body is not the stored text")
    return value


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
        "lease_owner": None,
        "lease_host": None,
        "lease_pid": None,
        "lease_expires_at": None,
        "lease_process": None,
        "fencing_token": S.next_token(conn),
    }
    try:
        conn.execute(S.INSERT_RUN, values)
    except sa.exc.IntegrityError as exc:
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
