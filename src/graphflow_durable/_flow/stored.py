"""DurableGraphFlow's public methods over its stored run outside a run: the run's id and store,
its record, the answer to its pending request for human input, its history, transcript and fork.

:class:`StoredRunMethods` is a base of :class:`~graphflow_durable.flow.DurableGraphFlow` (public
methods and their docstrings must be the public class's); each method is one call into the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace as _replace
from typing import TYPE_CHECKING

from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage, MessageFactory

from graphflow_durable._model.human import InputRequest
from graphflow_durable.store import RunRecord, StepInfo, Store

if TYPE_CHECKING:  # the flow holds its session
    from graphflow_durable._runtime.session import RunSession

__all__ = ["StoredRunMethods"]


class StoredRunMethods:
    """The stored run, read and answered: a base of DurableGraphFlow (see there)."""

    _session: RunSession
    _message_factory: MessageFactory

    @property
    def run_id(self) -> str:
        """The id of the run this team drives (generated when not given)."""
        return self._session.run_id

    @property
    def store(self) -> Store:
        """The store this team commits to (opened on first use)."""
        return self._session.store

    def run_info(self) -> RunRecord | None:
        """The stored run's record (status, head, lease..., its pending requests for human input in
        ``pending``), or ``None`` before the first run."""
        run = self.store.get_run(self.run_id)
        return run if run is None else _replace(run, pending=tuple(self.store.pending_requests(self.run_id)))

    async def respond(
        self, answer: str, *, node: str | None = None, request_id: str | None = None
    ) -> InputRequest:
        """Answer the run's pending request for human input (``node`` or ``request_id`` names it when
        several are pending); the next :meth:`run` (or a worker of a pool) resumes the run, and the
        asking node's turn gets ``answer`` as if the person had typed it. See :meth:`Store.respond`.

        Raises:
            NotWaitingError: (a ``UsageError``) nothing pending to answer, several and none named,
                or the run is cancelled (resumed, it asks again).
        """
        return await asyncio.to_thread(
            self.store.respond, self.run_id, answer, node=node, request_id=request_id
        )

    # -- history, time travel and fork ---------------------------------------------------------

    def history(self, *, round: int | None = None, node: str | None = None) -> list[StepInfo]:
        """The stored run's steps in order (see :meth:`Store.history`), only round ``round`` and/or
        node ``node`` if given.

        Raises:
            RunNotFoundError: the run is not in the store (before the first run).
        """
        return self.store.history(self.run_id, round=round, node=node)

    def transcript(
        self, *, round: int | None = None, node: str | None = None
    ) -> list[BaseAgentEvent | BaseChatMessage]:
        """The stored run's thread as AutoGen message objects, in order; only round ``round`` and/or
        the answers of node ``node`` if given (see :meth:`Store.transcript`).

        Raises:
            RunNotFoundError: the run is not in the store (before the first run).
        """
        create = self._message_factory.create
        return [create(m.body) for m in self.store.transcript(self.run_id, round=round, node=node)]

    def fork(
        self, at: int, *, run_id: str | None = None, replace: tuple[int, BaseChatMessage] | None = None
    ) -> RunRecord:
        """Start a new run from this run's step ``at`` (see :meth:`Store.fork`); the stored run is
        only read. Drive the new run with a team built like this one with ``run_id=`` its id:
        ``run()`` with no task continues it from that step. ``replace=(seq, message)``: message
        ``seq`` (a node's text answer) is ``message`` instead, and what followed it runs again.

        Raises:
            RunNotFoundError, UsageError, RunLockedError, ConflictError: as :meth:`Store.fork`.
        """
        edit = None if replace is None else (replace[0], replace[1].dump())
        return self.store.fork(self.run_id, at, new_run_id=run_id, replace=edit)
