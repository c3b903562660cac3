"""The store's SQL statements, built once at import.

Building a statement once lets SQLAlchemy's compiled cache serve every later execution, so the hot
path (:meth:`Store.commit`) only binds parameters. Bind parameter names start with ``p_`` because
SQLAlchemy reserves column names for the values of INSERT/UPDATE. Only ``store.py`` executes them.
"""

from __future__ import annotations

import sqlalchemy as sa

from ._schema import agent_states, messages, runs, steps

__all__ = [
    "INSERT_MESSAGE",
    "INSERT_RUN",
    "INSERT_STATE",
    "INSERT_STEP",
    "RELEASE_LEASE",
    "RENEW_LEASE",
    "SELECT_LATEST_STATES",
    "SELECT_LEASE",
    "SELECT_MESSAGES",
    "SELECT_RUN",
    "SELECT_SCHEDULER",
    "SELECT_STEPS",
    "UPDATE_HEAD",
    "UPDATE_HEAD_MSGS",
    "UPDATE_LEASE",
]

_R = runs.c
_run_id = sa.bindparam("p_run_id", type_=sa.String)


def _keep_unless_given(name: str, column: sa.Column[str]) -> sa.ColumnElement[str]:
    """``COALESCE(:name, column)``: a NULL parameter keeps the stored value."""
    return sa.func.coalesce(sa.bindparam(name, type_=column.type), column)


_head_guard = (
    _R.run_id == _run_id,
    _R.head_seq == sa.bindparam("p_expected", type_=sa.Integer),
    _R.fencing_token == sa.bindparam("p_token", type_=sa.Integer),
)
_head_values = {
    "head_seq": sa.bindparam("p_new_head", type_=sa.Integer),
    "updated_at": sa.bindparam("p_now", type_=sa.Double),
    "status": _keep_unless_given("p_status", _R.status),
    "task": _keep_unless_given("p_task", _R.task),
    "result": _keep_unless_given("p_result", _R.result),
}

#: Move the head of a run (commit without messages).
UPDATE_HEAD = sa.update(runs).where(*_head_guard).values(**_head_values)

#: Move the head of a run and append messages (their first seq must be the message count).
UPDATE_HEAD_MSGS = (
    sa.update(runs)
    .where(*_head_guard, _R.message_count == sa.bindparam("p_first_seq", type_=sa.Integer))
    .values(**_head_values, message_count=sa.bindparam("p_message_count", type_=sa.Integer))
)

INSERT_RUN = sa.insert(runs)
INSERT_STEP = sa.insert(steps)
INSERT_MESSAGE = sa.insert(messages)
INSERT_STATE = sa.insert(agent_states)

SELECT_RUN = sa.select(runs).where(_R.run_id == _run_id)
SELECT_LEASE = sa.select(
    _R.run_id,
    _R.head_seq,
    _R.message_count,
    _R.fencing_token,
    _R.lease_owner,
    _R.lease_host,
    _R.lease_pid,
    _R.lease_expires_at,
).where(_R.run_id == _run_id)

SELECT_STEPS = (
    sa.select(steps.c.seq, steps.c.kind, steps.c.node, steps.c.data, steps.c.created_at)
    .where(steps.c.run_id == _run_id)
    .order_by(steps.c.seq)
)
SELECT_SCHEDULER = sa.select(steps.c.scheduler).where(
    steps.c.run_id == _run_id, steps.c.seq == sa.bindparam("p_seq", type_=sa.Integer)
)
SELECT_MESSAGES = (
    sa.select(messages.c.seq, messages.c.step_seq, messages.c.published, messages.c.body)
    .where(messages.c.run_id == _run_id)
    .order_by(messages.c.seq)
)

_latest = (
    sa.select(agent_states.c.node, sa.func.max(agent_states.c.step_seq).label("step_seq"))
    .where(agent_states.c.run_id == _run_id)
    .group_by(agent_states.c.node)
    .subquery("latest")
)
#: The latest saved state of every node of a run.
SELECT_LATEST_STATES = (
    sa.select(agent_states.c.node, agent_states.c.body)
    .join(
        _latest,
        sa.and_(agent_states.c.node == _latest.c.node, agent_states.c.step_seq == _latest.c.step_seq),
    )
    .where(agent_states.c.run_id == _run_id)
    .order_by(agent_states.c.node)
)

_lease_values = {
    "lease_owner": sa.bindparam("p_owner", type_=sa.String),
    "lease_host": sa.bindparam("p_host", type_=sa.String),
    "lease_pid": sa.bindparam("p_pid", type_=sa.Integer),
    "lease_expires_at": sa.bindparam("p_expires", type_=sa.Double),
}
#: Hand the lease to a new owner (guarded by the token read under the write lock).
UPDATE_LEASE = (
    sa.update(runs)
    .where(_R.run_id == _run_id, _R.fencing_token == sa.bindparam("p_old_token", type_=sa.Integer))
    .values(**_lease_values, fencing_token=sa.bindparam("p_token", type_=sa.Integer))
)
RENEW_LEASE = (
    sa.update(runs)
    .where(
        _R.run_id == _run_id,
        _R.fencing_token == sa.bindparam("p_token", type_=sa.Integer),
        _R.lease_owner == sa.bindparam("p_owner", type_=sa.String),
    )
    .values(lease_expires_at=sa.bindparam("p_expires", type_=sa.Double))
)
RELEASE_LEASE = (
    sa.update(runs)
    .where(
        _R.run_id == _run_id,
        _R.fencing_token == sa.bindparam("p_token", type_=sa.Integer),
        _R.lease_owner.is_not(None),
    )
    .values(lease_owner=None, lease_host=None, lease_pid=None, lease_expires_at=None)
)
