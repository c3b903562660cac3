"""One attempt of one durable turn's recorded calls: the records it may replay, read once and
checked whole; its model calls' ordinal; its tool calls' identities (call id, request, and the
position among calls sharing both); what a failure keeps for the turn's next call. Every wrapper
of :mod:`graphflow_durable.recorded` the turn calls through shares it; the container of a durable
team sets it (:func:`start_recording`) while a node's agent runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar, Token
from typing import Any, Protocol, TypeVar

import pydantic_core
from autogen_core.models import (
    RequestUsage,
)

from graphflow_durable._model import codec
from graphflow_durable.context import ExecutionContext, current_execution
from graphflow_durable.errors import (
    ConflictError,
    GraphflowDurableError,
    LeaseLostError,
    SchemaVersionError,
    StoreCorruptError,
    StoreError,
    UsageError,
)
from graphflow_durable.store import CallRecord, Store

__all__ = [
    "CallLink",
    "TurnCalls",
    "current_turn",
    "database_fault",
    "digest",
    "raise_kept",
    "start_recording",
    "stop_recording",
]

logger = logging.getLogger("graphflow_durable.flow")

_T = TypeVar("_T")
_Fails = Callable[[Exception], bool] | None


class CallLink(Protocol):
    """What a wrapper needs of the durable run whose turn is running (the run session gives it)."""

    run_id: str

    @property
    def store(self) -> Store: ...

    @property
    def fencing_token(self) -> int: ...

    #: Live records a database fault kept out of the store (this process only): written before the
    #: next attempt of their turn reads its records, so that a call made is not paid for twice.
    unwritten: list[CallRecord]

    def fail(self, exc: BaseException) -> None: ...

    def replayed(self, tokens: int) -> None:
        """A recorded call was replayed instead of made (``tokens``: its model tokens; telemetry)."""


def database_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the database failing (an outage, a lock, a full disk), not the data."""
    return isinstance(exc, StoreError) and not isinstance(
        exc, (ConflictError, StoreCorruptError, SchemaVersionError, UsageError)
    )


class TurnCalls:
    """One attempt of one turn's recorded calls, shared by every wrapper the turn calls through:
    the records it may replay (read once), its model-call ordinal, its tool calls' occurrences,
    whether its model calls diverged."""

    def __init__(self, link: CallLink, ctx: ExecutionContext, fails_turn: _Fails) -> None:
        self.link, self.ctx = link, ctx
        self.fails_turn = fails_turn  # a tool exception the node's retry policy retries
        self.key = ctx.idempotency_key
        self._models: dict[str, CallRecord] | None = None  # by ordinal
        self._tools: dict[tuple[str, str], CallRecord] = {}  # by (call id, fingerprint), unreplayed
        self._dropped: dict[tuple[str, str], CallRecord] = {}  # discarded tool records, same key
        self._loading = asyncio.Lock()
        self._ordinal = 0
        self._seen: dict[tuple[str, str], int] = {}  # tool calls of this attempt, per request
        self.diverged = False
        # What ends the attempt at its next call, kept by a tool call (see kept()): its record's
        # failure, or the tool's own exception that the node's retry policy retries.
        self.failure: Exception | None = None

    def check(self) -> None:
        """Raise the failure a tool call of this attempt kept: the turn ends at its next call."""
        if self.failure is not None:
            raise self.failure

    def keep(self, exc: Exception) -> None:  # the first one kept wins
        self.failure = self.failure or exc

    async def kept(self, step: Awaitable[_T]) -> _T | None:
        """A tool call's record read or write: its error is kept, not raised (``None`` returned).
        AssistantAgent waits forever for tool calls of which one raised (their end is never put on
        its event queue), so a tool call ends with an error result instead, and the turn's next call
        through a wrapper (its next model call), or the end of the attempt, raises the kept error."""
        try:
            return await step
        except GraphflowDurableError as exc:  # the store's (a lost lease, an outage...), an encoding's
            self.keep(exc)
            return None

    def next_ordinal(self) -> int:
        """The next model call's ordinal in this attempt (0, 1, 2...), taken before it awaits."""
        ordinal, self._ordinal = self._ordinal, self._ordinal + 1
        return ordinal

    def tool_fingerprint(self, call_id: str, name: str, arguments: Mapping[str, Any] | None) -> str:
        """A tool call's fingerprint, taken as the call begins (before it awaits, so in the order
        the agent makes its calls): its name and arguments, and, for the n-th call (n >= 1) of this
        attempt with the same call id, name and arguments, n. Calls that share all three (one id
        given to several calls) thus replay their records in the order they were first made."""
        # The arguments as the model gave them (``5`` too); NotSerializableError: a lone surrogate.
        given = dict(arguments or {}) if arguments is None or isinstance(arguments, Mapping) else arguments
        request = {"name": name, "arguments": given}
        base = digest(request)
        occurrence = self._seen.get((call_id, base), 0)
        self._seen[call_id, base] = occurrence + 1
        return base if occurrence == 0 else digest({**request, "occurrence": occurrence})

    async def _fenced(self, write: Callable[..., _T], *args: Any, **how: Any) -> _T:
        """``write(*args)`` in a thread, fenced as the driver's commits are: a driver that lost its
        lease writes nothing, and its run ends with the LeaseLostError (GraphFlow would pass an
        agent's error on only as text). Only the run the driver drives is fenced."""
        token = self.link.fencing_token if self.ctx.run_id == self.link.run_id else None
        try:
            return await asyncio.to_thread(write, *args, fencing_token=token, **how)
        except StoreError as exc:
            # A lost lease, or the database failing (the run ends interrupted, not failed, as on a
            # commit's fault): the run ends with it, whatever the agent makes of the error.
            if isinstance(exc, LeaseLostError) or database_fault(exc):
                self.link.fail(exc)
            raise

    async def _write_unwritten(self) -> None:
        """Write this turn's records a database fault kept out of the store (oldest first)."""
        unwritten = self.link.unwritten
        for record in [r for r in unwritten if (r.run_id, r.turn_key) == (self.ctx.run_id, self.key)]:
            await self._fenced(self.link.store.calls.record, record)
            unwritten.remove(record)

    async def _load(self) -> dict[str, CallRecord]:
        """The turn's records, read once per attempt (every row checked before any is filtered: a
        damaged one ends the run with the store's :class:`StoreCorruptError`)."""
        if self._models is None:
            if self.link.unwritten:
                await self._write_unwritten()
            try:
                found = await asyncio.to_thread(self.link.store.calls.turn, self.ctx.run_id, self.key)
            except StoreCorruptError as damaged:  # the run ends with it, as a damaged commit does
                self.link.fail(damaged)
                raise
            models: dict[str, CallRecord] = {}
            for r in found:  # seq order: of records with one identity, the first written wins
                if r.outcome != "live":
                    continue
                if r.kind == "model" and not r.discarded:
                    models.setdefault(r.ident, r)
                elif r.kind == "tool":
                    (self._dropped if r.discarded else self._tools).setdefault((r.ident, r.fingerprint), r)
            self._models = models
        return self._models

    async def replayable_tool(self, call_id: str, fingerprint: str) -> CallRecord | None:
        """The live record this tool call replays (each at most once an attempt), or ``None``.
        A model divergence earlier in the turn does not discard tool records: a call whose id,
        name and arguments match a record replays it."""
        async with self._loading:
            await self._load()
            return self._tools.pop((call_id, fingerprint), None)

    def acting_again(self, name: str, call_id: str, fingerprint: str) -> None:
        """A tool call goes live: log a WARNING naming the tool when a record of this turn says it
        acted already under this call id (a discarded record of the same request, or a record of
        the same tool with other arguments)."""
        if (call_id, fingerprint) in self._dropped:
            why = "its recorded call with these arguments was discarded"
        elif any(k[0] == call_id and r.name == name for k, r in self._tools.items()):
            why = "the recorded call with this id has other arguments"
        else:
            return
        ctx = self.ctx
        logger.warning(
            "run %s: %s's turn (step %d, attempt %d): tool %s (call id %r) acts again: %s",
            ctx.run_id,
            ctx.node,
            ctx.step,
            ctx.attempt,
            name,
            call_id,
            why,
        )

    async def replayable(self, kind: str, ident: str, fingerprint: str) -> CallRecord | None:
        """The live record this model call replays, or ``None`` (it goes live). A record of the
        same ordinal and another fingerprint is a divergence: it and every later model record of
        the turn are discarded, and no model call is replayed any more in this attempt (tool
        records are kept: see :meth:`replayable_tool`)."""
        async with self._loading:
            models = await self._load()
            if self.diverged:
                return None
            record = models.get(ident)
            if record is None:
                return None
            if record.fingerprint == fingerprint:
                return record
            self.diverged = True
            models.clear()
            calls = self.link.store.calls
            discarded = await self._fenced(
                calls.discard_from, self.ctx.run_id, self.key, record.seq, kind=kind
            )
        ctx = self.ctx
        logger.info(
            "run %s: %s's turn (step %d, attempt %d) diverged at %s call %s: the request differs from the "
            "recorded one; %d recorded model call(s) discarded, this and later model calls go live",
            ctx.run_id,
            ctx.node,
            ctx.step,
            ctx.attempt,
            kind,
            ident,
            discarded,
        )
        return None

    async def write(
        self,
        kind: str,
        name: str,
        ident: str,
        fingerprint: str,
        *,
        result: str | None,
        usage: RequestUsage | None,
    ) -> None:
        """Commit one record (``result`` ``None``: a replay) before the call's result goes on."""
        ctx = self.ctx
        outcome = "live" if result is not None else "replayed"
        prompt, completion = (None, None) if usage is None else (usage.prompt_tokens, usage.completion_tokens)
        identity = (ctx.run_id, self.key, ctx.node, ctx.step, ctx.attempt, kind, name, ident)
        record = CallRecord(*identity, fingerprint, outcome, result, prompt, completion, time.time())
        try:
            await self._fenced(self.link.store.calls.record, record)
        except StoreError as exc:
            if result is not None and database_fault(exc):
                self.link.unwritten.append(record)  # the call was made: the next attempt replays it
            raise
        if result is None:
            self.link.replayed((prompt or 0) + (completion or 0))


class _Scope:
    """The link a container set while a node's agent runs, and that attempt's calls (made on the
    first recorded call, for the execution context current then)."""

    def __init__(self, link: CallLink, fails_turn: _Fails) -> None:
        self.link, self.fails_turn = link, fails_turn
        self._turn: TurnCalls | None = None

    def turn(self, ctx: ExecutionContext) -> TurnCalls:
        turn = self._turn
        if turn is None or turn.ctx != ctx:
            turn = self._turn = TurnCalls(self.link, ctx, self.fails_turn)
        return turn


_scope: ContextVar[_Scope | None] = ContextVar("graphflow_durable_recorded_calls", default=None)


def start_recording(link: CallLink, fails_turn: _Fails = None) -> Token[_Scope | None]:
    """From here until :func:`stop_recording` (the container's ``running(node)``, while a node's
    agent runs): the wrappers it calls through record in ``link``'s store. Each start is one
    attempt (its ordinals start at 0). Two functions, not a context manager, so that the
    container's own context manager sets it without a second generator per turn.
    ``fails_turn``: a tool's exceptions that fail the attempt (its retry policy retries them; see
    ``_ToolCall``)."""
    return _scope.set(_Scope(link, fails_turn))


def stop_recording(token: Token[_Scope | None]) -> None:
    """End what :func:`start_recording` began (``token`` is what it returned)."""
    _scope.reset(token)


def raise_kept() -> None:
    """At the end of an attempt that made no further call: raise what a tool call of it kept (a
    record that could not be written, a tool exception its retry policy retries), if anything."""
    scope = _scope.get()
    if scope is not None and scope._turn is not None:
        scope._turn.check()


def current_turn() -> TurnCalls | None:
    """The calls of the durable turn running in this task, or ``None`` (calls pass straight through)."""
    scope, ctx = _scope.get(), current_execution()
    if scope is None or ctx is None:
        return None
    return scope.turn(ctx)


# -- fingerprints and encodings -----------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` as plain JSON types (pydantic models and dataclasses dumped); what JSON cannot hold
    is its type's name, so such a request never matches by accident of its ``repr``."""
    return pydantic_core.to_jsonable_python(value, fallback=lambda v: f"<{type(v).__qualname__}>")


def digest(value: Any) -> str:
    return codec.digest(codec.dumps(_plain(value), where="request"))
