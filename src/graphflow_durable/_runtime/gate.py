"""Human input in a durable run: the input functions of ``UserProxyAgent`` participants, intercepted.

:class:`HumanGate` replaces each ``UserProxyAgent``'s input function by one that, inside a durable
turn, looks the request up in the store first (``"{node}/{step}"``: equal on every attempt of the
turn), so an answered request is never asked again:

- ``inline``: not answered yet, the original input function is called and its answer recorded at
  once (a crash before the turn's commit does not ask again);
- ``wait``: the request is recorded ``pending`` and :class:`InputPending` (a ``BaseException``, so
  no agent's ``except Exception`` turns it into an error) ends the turn; the participant container
  tells the manager (:class:`GroupChatInputPending`), which parks the run once nothing else runs.
  After an answer the turn runs again (attempt + 1, same idempotency key) and the input function
  returns the answer.

Outside a durable turn (the agent used on its own) the original function is called unchanged.
Inside a nested durable team, ``wait`` is refused (the inner run cannot park its outer run): the
turn fails with a :class:`UsageError` naming the fix (``inline``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.base import ChatAgent, Team
from autogen_core import CancellationToken
from pydantic import BaseModel

from graphflow_durable._model.human import HumanInput, InputRequest, parked_on, request_id
from graphflow_durable._turncalls import CallLink
from graphflow_durable.context import current_execution
from graphflow_durable.errors import InputDeadlineError, NotWaitingError, UsageError
from graphflow_durable.store import RunRecord, Store

__all__ = ["GateLink", "GroupChatInputPending", "HumanGate", "InputPending", "answer_text", "on_waiting_run"]

logger = logging.getLogger("graphflow_durable.flow")


class InputPending(BaseException):
    """A ``wait`` input function's request is recorded and unanswered: the turn stops here."""

    def __init__(self, request: InputRequest) -> None:
        super().__init__(request.request_id)
        self.request = request


class GroupChatInputPending(BaseModel):
    """From a participant container to the manager: ``name``'s turn waits for ``request_id``."""

    name: str
    request_id: str
    prompt: str


class GateLink(CallLink, Protocol):
    """What the gate needs of the team's run (the run session gives it): what a recorded call
    needs, and whether the run is a nested team's."""

    nested: bool

    def answer_used(self, request: InputRequest) -> None:
        """A turn takes ``request``'s answer (telemetry: who answered, how long it waited)."""


class HumanGate:
    """The team's input-function interception: settings per node, the turn's request counters."""

    def __init__(self, session: GateLink, default: HumanInput, per_node: Mapping[str, HumanInput]) -> None:
        self._session = session
        self.default = default
        self.per_node = dict(per_node)
        self._turn: dict[str, tuple[tuple[str, int], int]] = {}  # node -> ((key, attempt), calls so far)

    def install(self, participants: Sequence[ChatAgent | Team]) -> None:
        """Route every ``UserProxyAgent`` participant's input function through the gate.

        Raises:
            UsageError: a per-node setting names a participant that is not a ``UserProxyAgent``
                (only those ask for input: the setting would do nothing).
        """
        for agent in participants:
            if agent.name in self.per_node and not isinstance(agent, UserProxyAgent):
                raise UsageError(
                    f"human_input names {agent.name!r}, a {type(agent).__name__}, not a UserProxyAgent: "
                    "only a UserProxyAgent asks for input; name a UserProxyAgent participant or use '*'",
                    option="human_input",
                )
        for agent in participants:
            if isinstance(agent, UserProxyAgent):
                self._wrap(agent)

    def _wrap(self, agent: UserProxyAgent) -> None:
        original: Any = getattr(agent.input_func, "__graphflow_durable_original__", agent.input_func)
        is_async = inspect.iscoroutinefunction(original)

        async def durable_input(prompt: str, cancellation_token: CancellationToken | None = None) -> str:
            async def ask() -> str:
                if is_async:
                    return str(await original(prompt, cancellation_token))
                return str(await asyncio.get_running_loop().run_in_executor(None, original, prompt))

            return await self.ask(agent.name, prompt, ask)

        durable_input.__graphflow_durable_original__ = original  # type: ignore[attr-defined]
        agent.input_func = durable_input
        agent._is_async = True  # UserProxyAgent awaits it with the cancellation token

    def setting(self, node: str) -> HumanInput:
        """The node's setting (its own, else the team's)."""
        return self.per_node.get(node, self.default)

    async def ask(self, node: str, prompt: str, original: Callable[[], Awaitable[str]]) -> str:
        """The input function of ``node``: the stored answer, a recorded new one, or a park."""
        ctx = current_execution()
        if ctx is None or ctx.node != node:
            return await original()
        store, run_id = self._session.store, ctx.run_id
        # The driver's writes are fenced as its commits are: a stale one records nothing.
        token = self._session.fencing_token if run_id == self._session.run_id else None
        turn, count = self._turn.get(node, (None, 0))
        index = count + 1 if turn == (ctx.idempotency_key, ctx.attempt) else 1
        self._turn[node] = ((ctx.idempotency_key, ctx.attempt), index)
        rid = request_id(node, ctx.step, index)
        setting = self.setting(node)
        now = time.time()
        request = InputRequest(
            run_id, rid, node, prompt, ctx.idempotency_key, "pending", None, None, now, None,
            None if setting.timeout is None else now + setting.timeout, setting.default,
        )  # fmt: skip
        if setting.mode == "inline":
            found = await asyncio.to_thread(store.requests.get, run_id, rid)
            if found is None or found.status != "answered":
                answer = await original()  # the person answers; recorded before the turn goes on
                if found is None:
                    answered = replace(request, status="answered", answer=answer, answered_by="inline",
                                       answered_at=time.time(), deadline=None, default=None)  # fmt: skip
                    found = await asyncio.to_thread(
                        store.requests.open, run_id, answered, fencing_token=token
                    )
                else:  # left pending by a "wait" setting before: this answer answers it
                    found = await asyncio.to_thread(
                        store.requests.answer,
                        run_id,
                        answer,
                        node=None,
                        request_id=rid,
                        by="inline",
                        fencing_token=token,
                    )
        else:
            if self._session.nested:
                raise UsageError(
                    f"run {run_id}: {node} asks for input with human_input='wait' inside a nested team, "
                    "which cannot park its outer run; use human_input='inline' for the inner team",
                    run_id=run_id,
                    option="human_input",
                )
            found = await asyncio.to_thread(store.requests.open, run_id, request, fencing_token=token)
        if found.status == "answered" and found.answer is not None:
            if ctx.attempt > 1 or found.answered_by != "inline":
                logger.info(
                    "run %s: %s's request %s was answered: the answer is used, not asked again",
                    run_id,
                    node,
                    rid,
                )
            self._session.answer_used(found)
            return found.answer
        if found.deadline is not None and time.time() >= found.deadline:
            return await self._late(found, token)
        raise InputPending(found)

    async def _late(self, request: InputRequest, token: int | None) -> str:
        """A pending request past its deadline: its default answer, or the turn fails."""
        store, run_id, rid = self._session.store, request.run_id, request.request_id
        if request.default is None:
            error = InputDeadlineError(
                f"run {run_id}: request {rid} ({request.node} asked {request.prompt!r}) passed its deadline "
                "unanswered and no default answer is configured (HumanInput(default=...)); answer it "
                "(respond(), 'graphflow-durable runs respond') and run the team again, or ask again with a "
                "new deadline ('graphflow-durable runs retry')",
                run_id=run_id,
                request_id=rid,
                deadline=request.deadline or 0.0,
            )
            # UserProxyAgent wraps it in a RuntimeError, which GraphFlow passes on only as text: the
            # session keeps it, so that run() raises it with its attributes.
            self._session.fail(error)
            raise error
        try:
            await asyncio.to_thread(
                store.requests.answer,
                run_id,
                request.default,
                node=None,
                request_id=rid,
                by="default",
                fencing_token=token,
            )
            logger.warning("run %s: request %s passed its deadline: the default answer is taken", run_id, rid)
            self._session.answer_used(replace(request, answered_by="default", answered_at=time.time()))
            return request.default
        except NotWaitingError:  # answered meanwhile: that answer wins
            found = await asyncio.to_thread(store.requests.get, run_id, rid)
            return request.default if found is None or found.answer is None else found.answer


def answer_text(run_id: str, messages: Sequence[Any]) -> str:
    """The answer a task given to a waiting run carries: one text message's content."""
    contents = [getattr(m, "content", None) for m in messages]
    if len(contents) != 1 or not isinstance(contents[0], str):
        raise NotWaitingError(
            f"run {run_id} is waiting for input: give run() one text as the answer (a string or one "
            f"TextMessage), not {len(contents)} message(s); nothing was changed",
            run_id=run_id,
        )
    return contents[0]


async def on_waiting_run(store: Store, run: RunRecord, messages: Sequence[Any] | None) -> bool:
    """``run()`` on a ``waiting`` run (``messages``: its task, unless it is the run's own): a task is
    the answer to its pending request (the run resumes). Without one, returns whether the run stays
    parked (none of its requests answered, no deadline passed): the caller returns the stored
    result. One answered while another person's request is pending: the run resumes (that node
    takes its answer) and parks again on the other."""
    run_id = run.run_id
    if messages is not None:
        await asyncio.to_thread(store.respond, run_id, answer_text(run_id, messages))
        return False
    pending = await asyncio.to_thread(store.pending_requests, run_id)
    now = time.time()
    late = [r for r in pending if r.deadline is not None and r.deadline <= now]
    open_ids = {r.request_id for r in pending}
    answered = [i for i in parked_on(run.result) or () if i not in open_ids]
    if pending and not late and not answered:
        logger.info(
            "run %s is waiting for input (%s): returning without running anything; answer with respond()",
            run_id,
            ", ".join(r.request_id for r in pending),
        )
    return bool(pending) and not late and not answered
