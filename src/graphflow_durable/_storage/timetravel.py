"""A run at a past step: the cut read back (``Store.cut``) and a new run started from it
(``Store.fork``). The SQL half of ``_model.history``; the rows move through ``transfer``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from graphflow_durable._model.codec import dumps, loads
from graphflow_durable._model.history import check_step, cut_record, cut_status
from graphflow_durable._model.records import RunLog, RunRecord, StepKind
from graphflow_durable._model.runid import check_run_id
from graphflow_durable._storage import statements as S
from graphflow_durable._storage.lease import owner_gone
from graphflow_durable._storage.reading import read_log
from graphflow_durable._storage.rows import run_row
from graphflow_durable._storage.transfer import RunRows, read_rows, write_rows
from graphflow_durable.errors import RunLockedError, UsageError

__all__ = ["fork_run", "read_cut"]

_log = logging.getLogger(__name__)


def read_cut(conn: sa.Connection, run_id: str, at: int, url: str) -> RunLog:
    """The run as it stood once step ``at`` was committed (see ``Store.cut``), every row checked."""
    run = run_row(conn, run_id)
    log = read_log(conn, run_id, url, check_step(run, at))
    return dataclasses.replace(log, run=cut_record(run, log, at))


def fork_run(
    conn: sa.Connection,
    run_id: str,
    at: int,
    new_run_id: str | None,
    url: str,
    replace: tuple[int, Mapping[str, Any]] | None = None,
) -> RunRecord:
    """Write a new run holding ``run_id``'s rows up to step ``at`` (see ``Store.fork``); its row."""
    new_id = check_run_id(new_run_id if new_run_id is not None else f"{run_id}-fork-{uuid.uuid4().hex[:8]}")
    source = run_row(conn, run_id)
    check_step(source, at)
    if replace is not None:
        rows, at = _replaced(conn, source, at, replace, url)
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
    rows = rows or read_rows(conn, run_id, url, at)
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
    forked = write_rows(conn, rows, values, url).run
    _log.info("run %s: forked at step %d as run %s (%s)", run_id, at, new_id, forked.status)
    return forked


def _replaced(
    conn: sa.Connection, source: RunRecord, at: int, replace: tuple[int, Mapping[str, Any]], url: str
) -> tuple[RunRows, int]:
    """The rows of a fork whose message ``replace[0]`` (a node's answer, in the cut at ``at``) says
    ``replace[1]`` instead, cut just after the step that added it; and that step.

    The scheduler state of that step is kept, so the answer's content must not have decided
    anything there: the node's edges have no conditions, and the step did not end the round. The
    node's own state saved at that step has its old answer's text replaced by the new one.
    """
    run_id = source.run_id
    seq, body = replace
    rows = read_rows(conn, run_id, url, at)
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
    state = read_log(conn, run_id, url, cut).agent_states.get(node)
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
    )
    if saved and state is not None:
        text = dumps(state).replace(dumps(old["content"]), dumps(new["content"]))
        rows.states.append({"node": node, "step_seq": cut, "base_step": None, "body": dumps(loads(text))})
    return rows, cut


def _refused(run: RunRecord, why: str) -> UsageError:
    return UsageError(f"run {run.run_id}: {why}; nothing was written", run_id=run.run_id, option="replace")
