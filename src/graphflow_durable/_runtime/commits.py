"""The write path of a run session: its transitions handed to the store's writer, and their outcomes.

:class:`Commits` is held by the :class:`~graphflow_durable._runtime.session.RunSession` and is the
one owner of the commits handed over and not waited for yet (a parallel batch's answers). It moves
the session's head as the store's writer answers; :meth:`RunSession.write` is its one caller
while a run is under way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from graphflow_durable.errors import LeaseLostError
from graphflow_durable.store import AgentStateRecord, MessageRecord, RunUpdate, Step

if TYPE_CHECKING:  # the session holds its write path
    from graphflow_durable._runtime.session import RunSession

__all__ = ["Commits"]

#: The write path acts for DurableGraphFlow: it logs as the flow does, so log filters keep working.
logger = logging.getLogger("graphflow_durable.flow")


class Commits:
    """A session's commits: each at the expected head under the session's fencing token."""

    def __init__(self, session: RunSession) -> None:
        self._session = session
        # Commits handed over and not waited for yet (a batch's answers), with their expected heads.
        self._unsettled: list[tuple[int, asyncio.Future[int]]] = []

    async def write(
        self,
        step: Step,
        messages: Sequence[MessageRecord],
        states: Sequence[AgentStateRecord],
        update: RunUpdate | None,
        *,
        wait: bool = True,
    ) -> int:
        """Commit one transition at the expected head under the session's fencing token.

        The event loop runs on while the store's writer thread commits. A cancellation that arrives
        meanwhile waits for the commit's outcome before it is raised, so the session's head always
        says what is in the store.

        ``wait=False`` hands the commit over and returns the head it will make without waiting:
        for an answer of a parallel batch that is not its last, on which nothing is dispatched or
        reported, so that the batch's other answers join it in the writer's next group. Commits
        stay in order; the next waiting write (or :meth:`settle`) waits for it as well and raises
        its failure, the first in order, rather than its own refusal that followed from it.
        """
        session = self._session
        try:
            future = session.store.submit_commit(
                session.run_id,
                expected_head=session.head,
                fencing_token=session.lease.token,
                step=step,
                messages=messages,
                agent_states=session.states.encode(states, messages, session.head + 1),
                update=update,
            )
        except BaseException:
            session.states.clear()  # it remembered this commit's states: write the next ones whole
            raise
        self._unsettled.append((session.head, future))
        if not wait:
            session.head += 1
            return session.head
        await self.settle()
        if update is not None and update.release_lease:
            session.lease.released = True
        return session.head

    async def settle(self) -> None:
        """Wait for every commit handed over (through cancellations: one is raised afterwards), set
        the session's head to the last one written, and raise the first failure."""
        session = self._session
        unsettled, self._unsettled = self._unsettled, []
        cancelled = False
        for _, future in unsettled:
            cancelled = await _settled(future) or cancelled
        failure = None
        for expected, future in unsettled:
            error = future.exception()  # read even after a failure: none is logged as never retrieved
            if failure is None:  # the ones after a failure were refused because of it
                failure = error
                session.head = expected if error is not None else future.result()
        if failure is not None:
            session.states.clear()  # it remembered the failed commits' states: write the next ones whole
            raise failure
        if cancelled:
            raise asyncio.CancelledError

    async def settle_at_end(self) -> None:
        """As a run ends: wait for the commits still handed over (an interrupted batch's answers).
        The error that ended the run is the one the caller sees: a failure here is logged (a lost
        lease as :meth:`RunSession.lost` says it) and the team is marked out of step with the store."""
        session = self._session
        try:
            await self.settle()
        except LeaseLostError as exc:
            session.synced = False
            session.lost(exc)
        except Exception as exc:  # noqa: BLE001 -- logged; the run's own end is what the caller sees
            session.synced = False
            logger.warning(
                "run %s: an answer of the interrupted batch was not recorded (%s); it runs again on resume",
                session.run_id,
                exc,
            )


async def _settled(future: asyncio.Future[int]) -> bool:
    """Wait until ``future`` is done, through any number of cancellations; whether one arrived (the
    caller raises it once everything it waits for settled)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled
