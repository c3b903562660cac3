"""Store methods: the hot path, one step appended atomically (blocking or for a coroutine), through
the store's writer thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager

from graphflow_durable._agentstate.writer import state_row
from graphflow_durable._model.records import AgentStateRecord, AgentStateRow, MessageRecord, RunUpdate, Step
from graphflow_durable._storage.commit import CommitParams, encode_commit
from graphflow_durable._store.base import StoreBase

__all__ = ["CommitMethods"]


class CommitMethods(StoreBase):
    """The hot path: :meth:`commit`, :meth:`submit_commit`, and several handed over :meth:`together`."""

    def commit(
        self,
        run_id: str,
        *,
        expected_head: int,
        fencing_token: int,
        step: Step,
        messages: Sequence[MessageRecord] = (),
        agent_states: Sequence[AgentStateRecord | AgentStateRow] = (),
        update: RunUpdate | None = None,
    ) -> int:
        """Append one step atomically; return the new head (``expected_head + 1``).

        One transaction: moves the run's head from ``expected_head`` (guarded by the fencing token),
        applies ``update``, and appends the step, its messages (whose ``seq`` must continue the
        thread without gaps) and the agent states. On any error nothing is written. An agent state
        is a record (its body a JSON value, encoded here) or a row made by the flow's agent-state
        writer (its body already JSON text, written as it is).

        The store's writer thread writes it, with whatever other commits (of any run) are waiting
        at that moment, in one transaction; this call blocks until it is durable. From a coroutine
        use :meth:`submit_commit`, which leaves the event loop free meanwhile.

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: ``fencing_token`` is no longer the run's token (another worker took over).
            ConflictError: the run's head is not ``expected_head``, or the messages do not start at
                the run's message count / are not contiguous.
            NotSerializableError: a value is not JSON (raised before touching the database).
            StoreError: the database failed (nothing of this commit was written).
        """
        params = self._encode(run_id, expected_head, fencing_token, step, messages, agent_states, update)
        head: int = self._writer.submit(params).result()
        return head

    def submit_commit(
        self,
        run_id: str,
        *,
        expected_head: int,
        fencing_token: int,
        step: Step,
        messages: Sequence[MessageRecord] = (),
        agent_states: Sequence[AgentStateRecord | AgentStateRow] = (),
        update: RunUpdate | None = None,
    ) -> asyncio.Future[int]:
        """:meth:`commit` for coroutines: hand the commit to the writer thread and return at once.

        Call it from a running event loop. The returned future gives the new head once the commit
        is durable, or raises what :meth:`commit` raises; a value that is not JSON raises
        :class:`NotSerializableError` here, before anything is handed over. Cancelling the future
        (or the task awaiting it) does not stop the commit: it lands or fails all the same (await
        ``asyncio.shield(future)`` to learn which after a cancellation).
        """
        params = self._encode(run_id, expected_head, fencing_token, step, messages, agent_states, update)
        return self._writer.submit_async(params, asyncio.get_running_loop())

    def together(self) -> AbstractContextManager[None]:
        """A block whose :meth:`submit_commit` and :meth:`submit_create_run` calls (from this thread)
        are handed to the writer together when it ends, and written in one transaction: one fsync
        (SQLite), one ``COMMIT`` (PostgreSQL). Each is still written or refused on its own, except
        that one after a failed one of the same run is not written and fails with that error: a run
        created together with its first commit never gets that commit on a run it did not create.
        The commits of a run handed over after its creation in the block are written under the
        fencing token the creation draws (whatever token they name, which cannot be known yet:
        the creation's record gives it, for the commits after the block).

        Nothing is handed over before the block ends: awaiting one of its futures inside it would
        wait forever, and the blocking :meth:`commit` and :meth:`create_run` raise
        :class:`UsageError` there.
        """
        return self._writer.together()

    def _encode(
        self,
        run_id: str,
        expected_head: int,
        fencing_token: int,
        step: Step,
        messages: Sequence[MessageRecord],
        agent_states: Sequence[AgentStateRecord | AgentStateRow],
        update: RunUpdate | None,
    ) -> CommitParams:
        rows = [state if isinstance(state, AgentStateRow) else state_row(state) for state in agent_states]
        return encode_commit(run_id, expected_head, fencing_token, time.time(), step, messages, rows, update)
