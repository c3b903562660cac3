"""Recorded model and tool calls: a turn that runs again replays the calls it made, on SQLite and
PostgreSQL. The model is a scripted ``ChatCompletionClient`` that counts its calls; the tools count
their runs. A "crash" in process is an error at the worst moment -- just after a call's record was
committed, before its result reached the agent -- that fails the turn (the run fails with the node
in flight); a fresh team then resumes the run (attempt 2). (In process, an error inside a tool task
hangs AssistantAgent's streaming tool path; the SIGKILL tests kill real processes.)"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import pytest
from autogen_agentchat.agents import AssistantAgent, SocietyOfMindAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import ModelClientStreamingChunkEvent, ToolCallExecutionEvent
from autogen_agentchat.teams import DiGraphBuilder, RoundRobinGroupChat
from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    RequestUsage,
    UserMessage,
)
from autogen_core.tools import FunctionTool, StaticStreamWorkbench, StaticWorkbench, Tool, ToolSchema
from autogen_ext.models.replay import ReplayChatCompletionClient
from pydantic import BaseModel

from agents import close_stores
from graphflow_durable import (
    DurableGraphFlow,
    LeaseLostError,
    RecordedChatCompletionClient,
    RecordedStreamWorkbench,
    RecordedWorkbench,
    RetryPolicy,
    Store,
    UsageError,
    recorded,
)
from graphflow_durable.recorded import start_recording, stop_recording


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class Crash(RuntimeError):
    """The turn dies here: the run fails with the node in flight (the node's next attempt resumes)."""


# -- a scripted model client and counting tools --------------------------------------------------

#: The model's answers by position in the turn (the number of tool results it has seen so far):
#: a tool call (name, arguments) or the final text.
SCRIPT: list[tuple[str, Mapping[str, Any]] | str] = [
    ("add", {"a": 1, "b": 2}),
    ("charge", {"amount": 7}),
    "all done: charged 7",
]


class ScriptedModel(ChatCompletionClient):
    """Answers from :data:`SCRIPT` by how many tool results the request holds, so a fresh client
    answers a resumed turn as the first one did; ``calls`` counts the calls that reached it."""

    def __init__(
        self, calls: list[int], *, crash_on: int | None = None, error: type[Exception] = RuntimeError
    ) -> None:
        self.calls = calls
        self.crash_on = crash_on  # the position whose first call dies instead of answering
        self.error = error
        self.before: Callable[[int], None] | None = None  # called with the position before answering

    def _answer(self, messages: Sequence[LLMMessage]) -> CreateResult:
        position = sum(isinstance(m, FunctionExecutionResultMessage) for m in messages)
        if position == self.crash_on:
            self.crash_on = None
            raise self.error(f"model call {position}")
        if self.before is not None:
            self.before(position)
        self.calls.append(position)
        answer = SCRIPT[position]
        usage = RequestUsage(prompt_tokens=100 + position, completion_tokens=10 + position)
        if isinstance(answer, str):
            return CreateResult(finish_reason="stop", content=answer, usage=usage, cached=False)
        name, args = answer
        call = FunctionCall(id=f"call-{position}", name=name, arguments=json.dumps(args))
        return CreateResult(finish_reason="function_calls", content=[call], usage=usage, cached=False)

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> CreateResult:
        return self._answer(messages)

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: bool | type[BaseModel] | None = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: CancellationToken | None = None,
    ) -> AsyncGenerator[str | CreateResult, None]:
        result = self._answer(messages)
        if isinstance(result.content, str):  # uneven boundaries: a replay must keep them
            text = result.content
            for cut in (0, 3, 4, 11):
                yield text[cut : {0: 3, 3: 4, 4: 11, 11: len(text)}[cut]]
        yield result

    async def close(self) -> None:
        pass

    def actual_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def total_usage(self) -> RequestUsage:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return 0

    def remaining_tokens(
        self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []
    ) -> int:
        return 1000

    @property
    def capabilities(self) -> Any:
        return self.model_info

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            vision=False, function_calling=True, json_output=False, family="scripted", structured_output=False
        )


class Ran:
    """Counts each tool's runs."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def tools(self) -> list[FunctionTool]:
        async def add(a: int, b: int) -> int:
            """Add two numbers."""
            self.runs.append("add")
            return a + b

        async def charge(amount: int) -> str:
            """Charge a card."""
            self.runs.append("charge")
            return f"charged {amount}"

        return [FunctionTool(add, "Add two numbers."), FunctionTool(charge, "Charge a card.")]


async def crashed(team: DurableGraphFlow, kind: str, ident: str) -> None:
    """Run ``team``; its turn dies just after the record of call (``kind``, ``ident``) is committed."""
    calls = team.store.calls
    record = calls.record

    def then_die(rec: Any, *, fencing_token: int | None) -> Any:
        written = record(rec, fencing_token=fencing_token)
        if (rec.kind, rec.ident) == (kind, ident):
            raise Crash(f"after {kind} call {ident}")
        return written

    calls.record = then_die  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match=f"after {kind} call {ident}"):
            await team.run(task="go")
    finally:
        del calls.record


def assistant(
    calls: list[int],
    ran: Ran,
    *,
    system: str = "You are helpful.",
    stream: bool = False,
    crash_on: int | None = None,
    error: type[Exception] = RuntimeError,
) -> AssistantAgent:
    return AssistantAgent(
        "A",
        model_client=ScriptedModel(calls, crash_on=crash_on, error=error),
        tools=ran.tools(),
        system_message=system,
        max_tool_iterations=5,
        model_client_stream=stream,
    )


OPEN: list[DurableGraphFlow] = []


def team_of(agent: Any, url: str, run_id: str = "run", **kwargs: Any) -> DurableGraphFlow:
    builder = DiGraphBuilder()
    builder.add_node(agent)
    team = DurableGraphFlow(
        [agent],
        builder.build(),
        store=url,
        run_id=run_id,
        record_calls=True,
        interrupt_grace_seconds=0.2,
        **kwargs,
    )
    OPEN.append(team)
    return team


@pytest.fixture(autouse=True)
def _close_teams() -> Iterator[None]:
    yield
    while OPEN:
        store = OPEN.pop()._session.opened_store
        if store is not None:
            store.close()


def rows(team: DurableGraphFlow) -> list[tuple[int, str, str, str, bool]]:
    """(attempt, kind, ident, outcome, discarded) of the run's call records."""
    return [(r.attempt, r.kind, r.ident, r.outcome, r.discarded) for r in team.store.calls.list(team.run_id)]


def final_text(team: DurableGraphFlow) -> str:
    return str(team.store.load(team.run_id).messages[-1].body["content"])


async def uninterrupted(url: str, **kwargs: Any) -> tuple[list[int], list[str], list[Any]]:
    calls: list[int] = []
    ran = Ran()
    team = team_of(assistant(calls, ran, **kwargs), url, run_id="reference")
    result = await team.run(task="go")
    return calls, ran.runs, [(m.source, m.to_text()) for m in result.messages]


# -- replay after a crash --------------------------------------------------------------------------


async def test_a_resumed_turn_replays_its_two_model_calls_and_tool_call_and_calls_only_the_rest(
    store_url: str,
) -> None:
    ref_calls, ref_runs, ref_messages = await uninterrupted(store_url)
    assert ref_calls == [0, 1, 2] and ref_runs == ["add", "charge"]

    calls: list[int] = []
    ran = Ran()  # model 0, add, model 1: then the turn dies, before its result reaches the agent
    await crashed(team_of(assistant(calls, ran), store_url), "model", "1")
    assert calls == [0, 1] and ran.runs == ["add"]

    again: list[int] = []
    fresh_ran = Ran()
    team = team_of(assistant(again, fresh_ran), store_url)
    result = await team.run()
    assert again == [2], "model calls 0 and 1 are replayed: only the last one is made"
    assert fresh_ran.runs == ["charge"], "add is replayed; charge runs for the first time"
    assert [(m.source, m.to_text()) for m in result.messages] == ref_messages
    assert rows(team) == [
        (1, "model", "0", "live", False),
        (1, "tool", "call-0", "live", False),
        (1, "model", "1", "live", False),
        (2, "model", "0", "replayed", False),
        (2, "tool", "call-0", "replayed", False),
        (2, "model", "1", "replayed", False),
        (2, "tool", "call-1", "live", False),
        (2, "model", "2", "live", False),
    ]
    summary = team.store.calls.summary(team.run_id)
    assert (summary.calls_live, summary.calls_replayed) == (5, 3)
    assert summary.tokens_saved == (100 + 10) + (101 + 11)


async def test_a_model_call_that_dies_is_made_again_and_nothing_before_it(store_url: str) -> None:
    calls: list[int] = []
    ran = Ran()
    with pytest.raises(RuntimeError, match="model call 2"):
        await team_of(assistant(calls, ran, crash_on=2), store_url).run(task="go")
    again: list[int] = []
    fresh_ran = Ran()
    team = team_of(assistant(again, fresh_ran), store_url)
    await team.run()
    assert again == [2] and fresh_ran.runs == []
    assert final_text(team) == "all done: charged 7"


async def test_a_replayed_create_result_is_cached_with_the_recorded_usage(store_url: str) -> None:
    await crashed(team_of(assistant([], Ran()), store_url), "model", "1")
    agent = assistant([], Ran())
    client = agent._model_client
    assert isinstance(client, ScriptedModel)
    team = team_of(agent, store_url)
    wrapper = agent._model_client
    assert isinstance(wrapper, RecordedChatCompletionClient) and wrapper.inner is client
    returned: list[CreateResult] = []
    create = wrapper.create

    async def spy(*args: Any, **kwargs: Any) -> CreateResult:
        result = await create(*args, **kwargs)
        returned.append(result)
        return result

    wrapper.create = spy  # type: ignore[method-assign]
    result = await team.run()
    assert [r.cached for r in returned] == [True, True, False]
    assert [(r.usage.prompt_tokens, r.usage.completion_tokens) for r in returned] == [
        (100, 10),
        (101, 11),
        (102, 12),
    ]
    ref = await team_of(assistant([], Ran()), store_url, "reference").run(task="go")
    usage = [m.models_usage for m in result.messages if m.source == "A"]
    assert usage == [m.models_usage for m in ref.messages if m.source == "A"], "models_usage is unchanged"


async def test_a_replayed_stream_yields_the_recorded_chunks_with_their_boundaries(store_url: str) -> None:
    ref_team = team_of(assistant([], Ran(), stream=True), store_url, run_id="reference")
    ref_chunks = [
        e.content
        async for e in ref_team.run_stream(task="go")
        if isinstance(e, ModelClientStreamingChunkEvent)
    ]
    assert ref_chunks == ["all", " ", "done: c", "harged 7"]

    # the final model call dies after it was recorded: its stream must come back from the record
    await crashed(team_of(assistant([], Ran(), stream=True), store_url), "model", "2")
    again: list[int] = []
    team = team_of(assistant(again, Ran(), stream=True), store_url)
    chunks = [e.content async for e in team.run_stream() if isinstance(e, ModelClientStreamingChunkEvent)]
    assert again == [], "every model call of the turn is replayed"
    assert chunks == ref_chunks


async def test_a_retried_attempt_replays_the_calls_before_the_failed_one_and_makes_it_again(
    store_url: str,
) -> None:
    calls: list[int] = []
    ran = Ran()
    agent = assistant(calls, ran, crash_on=2, error=ConnectionError)  # retryable, once
    team = team_of(agent, store_url, retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False))
    await team.run(task="go")
    assert calls == [0, 1, 2], "calls 0 and 1 are made once: the retry replays them"
    assert ran.runs == ["add", "charge"]
    assert [(a, k, i, o) for a, k, i, o, _ in rows(team)] == [
        (1, "model", "0", "live"),
        (1, "tool", "call-0", "live"),
        (1, "model", "1", "live"),
        (1, "tool", "call-1", "live"),
        (2, "model", "0", "replayed"),
        (2, "tool", "call-0", "replayed"),
        (2, "model", "1", "replayed"),
        (2, "tool", "call-1", "replayed"),
        (2, "model", "2", "live"),
    ]


async def test_a_tool_error_result_is_recorded_and_replayed_as_an_error(store_url: str) -> None:
    calls: list[int] = []
    runs: list[str] = []

    async def charge(amount: int) -> str:
        """Charge a card (declined)."""
        runs.append("charge")
        raise ValueError("card declined")

    async def add(a: int, b: int) -> int:
        """Add two numbers."""
        runs.append("add")
        return a + b

    def agent(model_calls: list[int]) -> AssistantAgent:
        return AssistantAgent(
            "A",
            model_client=ScriptedModel(model_calls),
            tools=[FunctionTool(add, "Add."), FunctionTool(charge, "Charge.")],
            max_tool_iterations=5,
        )

    await crashed(team_of(agent(calls), store_url), "model", "2")
    team = team_of(agent([]), store_url)
    result = await team.run()
    assert runs == ["add", "charge"], "the failed charge is replayed, not tried again"
    errors = [
        c for m in result.messages if isinstance(m, ToolCallExecutionEvent) for c in m.content if c.is_error
    ]
    assert [e.content for e in errors] == ["card declined"]


# -- divergence, identity, opt-outs -----------------------------------------------------------


async def test_a_changed_system_message_diverges_the_first_model_call_and_discards_the_later_model_records(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await crashed(team_of(assistant([], Ran()), store_url), "model", "1")
    again: list[int] = []
    ran = Ran()
    team = team_of(assistant(again, ran, system="You are terse."), store_url)
    with caplog.at_level(logging.INFO, logger="graphflow_durable.flow"):
        await team.run()
    assert again == [0, 1, 2], "no model call recorded under the old system message is returned"
    assert ran.runs == ["charge"], "the tool record (same id, name and arguments) is still replayed"
    diverged = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert len(diverged) == 1
    assert "A's turn" in diverged[0] and "attempt 2" in diverged[0] and "model call 0" in diverged[0]
    assert rows(team) == [
        (1, "model", "0", "live", True),
        (1, "tool", "call-0", "live", False),
        (1, "model", "1", "live", True),
        (2, "model", "0", "live", False),
        (2, "tool", "call-0", "replayed", False),
        (2, "model", "1", "live", False),
        (2, "tool", "call-1", "live", False),
        (2, "model", "2", "live", False),
    ]


async def test_two_turns_with_identical_requests_each_call_the_model(store_url: str) -> None:
    calls: list[int] = []
    client = ScriptedModel(calls)  # two start nodes, one client: the same request in two turns
    a, b = (AssistantAgent(n, model_client=client, system_message="same") for n in ("A", "B"))
    builder = DiGraphBuilder()
    builder.add_node(a).add_node(b)
    team = DurableGraphFlow([a, b], builder.build(), store=store_url, run_id="twice", record_calls=True)
    OPEN.append(team)
    await team.run(task="hello")
    assert calls == [0, 0], "a record is not a cache: each turn calls the model"
    records = team.store.calls.list("twice")
    assert [(r.node, r.outcome) for r in sorted(records, key=lambda r: r.node)] == [
        ("A", "live"),
        ("B", "live"),
    ]
    assert records[0].fingerprint == records[1].fingerprint


async def test_rerun_tools_always_run_and_are_recorded_live_each_time(store_url: str) -> None:
    agent = assistant([], Ran(), crash_on=2)
    agent._workbench = [recorded(w, rerun={"add"}) for w in agent._workbench]
    with pytest.raises(RuntimeError, match="model call 2"):
        await team_of(agent, store_url).run(task="go")
    ran = Ran()
    agent = assistant([], ran)
    agent._workbench = [recorded(w, rerun={"add"}) for w in agent._workbench]
    team = team_of(agent, store_url)
    await team.run()
    assert ran.runs == ["add"], "add always runs; charge is replayed"
    assert [r for r in rows(team) if r[1] == "tool"] == [
        (1, "tool", "call-0", "live", False),
        (1, "tool", "call-1", "live", False),
        (2, "tool", "call-0", "live", False),
        (2, "tool", "call-1", "replayed", False),
    ]


# -- outside a durable turn, components, wiring ---------------------------------------------------


async def test_outside_a_durable_turn_the_wrappers_call_straight_through(sqlite_url: str) -> None:
    calls: list[int] = []
    client = recorded(ScriptedModel(calls))
    first = await client.create([UserMessage(content="hi", source="u")])
    second = await client.create([UserMessage(content="hi", source="u")])
    assert calls == [0, 0] and not first.cached and not second.cached
    ran = Ran()
    bench = recorded(StaticStreamWorkbench(ran.tools()))
    await bench.call_tool("add", {"a": 1, "b": 1}, call_id="x")
    await bench.call_tool("add", {"a": 1, "b": 1}, call_id="x")
    assert ran.runs == ["add", "add"]
    # a link without an execution context (no durable turn): still straight through
    store = Store(sqlite_url)
    try:
        token = start_recording(_Link(store))
        try:
            await client.create([UserMessage(content="hi", source="u")])
        finally:
            stop_recording(token)
        assert calls == [0, 0, 0]
    finally:
        store.close()


class _Link:
    run_id = "nothing"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fencing_token = 0

    def replayed(self, tokens: int) -> None:
        """Telemetry of a replayed call: none here."""


def test_recorded_wrappers_round_trip_as_components_with_the_inner_nested() -> None:
    inner = ReplayChatCompletionClient(["one", "two"])
    client = recorded(inner)
    dumped = client.dump_component()
    assert dumped.provider == "graphflow_durable.recorded.RecordedChatCompletionClient"
    assert dumped.config["client"]["provider"] == "autogen_ext.models.replay.ReplayChatCompletionClient"
    loaded = ChatCompletionClient.load_component(dumped)
    assert isinstance(loaded, RecordedChatCompletionClient)
    assert loaded.inner.dump_component() == inner.dump_component()

    # (tool-less: loading a FunctionTool from a config warns, by design)
    stream_bench = recorded(StaticStreamWorkbench([]), rerun={"add"})
    assert isinstance(stream_bench, StaticStreamWorkbench) and isinstance(
        stream_bench, RecordedStreamWorkbench
    )
    again = RecordedStreamWorkbench.load_component(stream_bench.dump_component())
    assert isinstance(again, RecordedStreamWorkbench) and again.rerun == {"add"}
    assert again.dump_component() == stream_bench.dump_component()

    plain = recorded(StaticWorkbench([]))
    assert type(plain) is RecordedWorkbench
    assert type(RecordedWorkbench.load_component(plain.dump_component())) is RecordedWorkbench
    assert recorded(client) is client and recorded(plain) is plain, "never wrapped twice"


async def test_a_team_with_record_calls_dumps_and_loads_with_the_setting(sqlite_url: str) -> None:
    agent = AssistantAgent(
        "A", model_client=ReplayChatCompletionClient(["hi"]), workbench=StaticStreamWorkbench([])
    )
    team = team_of(agent, sqlite_url)
    config = team.dump_component()
    assert config.config["record_calls"] is True
    loaded = DurableGraphFlow.load_component(config)
    OPEN.append(loaded)
    participant = loaded._participants[0]
    assert isinstance(participant, AssistantAgent)
    assert type(participant._model_client) is RecordedChatCompletionClient
    assert isinstance(participant._model_client.inner, ReplayChatCompletionClient), "not wrapped twice"
    assert [type(w) for w in participant._workbench] == [RecordedStreamWorkbench]
    assert loaded.dump_component() == config
    builder = DiGraphBuilder()
    builder.add_node(agent2 := AssistantAgent("B", model_client=ReplayChatCompletionClient(["hi"])))
    off = DurableGraphFlow([agent2], builder.build(), store=sqlite_url)
    OPEN.append(off)
    assert off.dump_component().config["record_calls"] is False
    assert type(DurableGraphFlow.load_component(off.dump_component())._participants[0]._model_client) is (
        ReplayChatCompletionClient
    )


class Assistant2(AssistantAgent):
    """A user's AssistantAgent subclass."""


def test_record_calls_wraps_assistants_subclasses_and_the_agents_of_nested_teams(sqlite_url: str) -> None:
    plain = AssistantAgent("P", model_client=ScriptedModel([]), tools=Ran().tools())
    sub = Assistant2("S", model_client=ScriptedModel([]))
    inner_a = AssistantAgent("IA", model_client=ScriptedModel([]))
    deep = AssistantAgent("D", model_client=ScriptedModel([]))
    inner_team = RoundRobinGroupChat(
        [inner_a, RoundRobinGroupChat([deep], termination_condition=MaxMessageTermination(2), name="deep")],
        termination_condition=MaxMessageTermination(3),
    )
    mind = SocietyOfMindAgent("M", team=inner_team, model_client=ScriptedModel([]))
    builder = DiGraphBuilder()
    for p in (plain, sub, mind):
        builder.add_node(p)
    team = DurableGraphFlow([plain, sub, mind], builder.build(), store=sqlite_url, record_calls=True)
    OPEN.append(team)
    for agent in (plain, sub, mind, inner_a, deep):
        assert isinstance(agent._model_client, RecordedChatCompletionClient), agent.name  # type: ignore[attr-defined]
    assert isinstance(plain._workbench[0], RecordedStreamWorkbench)
    # a second team over the same agents does not wrap them again
    again = DiGraphBuilder()
    again.add_node(plain)
    OPEN.append(DurableGraphFlow([plain], again.build(), store=sqlite_url, record_calls=True))
    assert isinstance(plain._model_client.inner, ScriptedModel)
    assert isinstance(plain._workbench[0].inner, StaticStreamWorkbench)


async def test_with_record_calls_off_nothing_is_wrapped_and_no_record_is_written(store_url: str) -> None:
    calls: list[int] = []
    agent = assistant(calls, Ran())
    client = agent._model_client
    builder = DiGraphBuilder()
    builder.add_node(agent)
    team = DurableGraphFlow([agent], builder.build(), store=store_url, run_id="off")
    OPEN.append(team)
    await team.run(task="go")
    assert agent._model_client is client and type(agent._workbench[0]) is StaticStreamWorkbench
    assert calls == [0, 1, 2]
    assert team.store.calls.list("off") == []


def test_a_record_calls_that_is_not_a_bool_is_refused_with_one_clear_line(sqlite_url: str) -> None:
    agent = AssistantAgent("A", model_client=ScriptedModel([]))
    builder = DiGraphBuilder()
    builder.add_node(agent)
    with pytest.raises(UsageError, match="record_calls must be True or False, not 'yes'") as raised:
        DurableGraphFlow([agent], builder.build(), store=sqlite_url, record_calls="yes")  # type: ignore[arg-type]
    assert raised.value.option == "record_calls"
    assert type(agent._model_client) is ScriptedModel


def test_recorded_refuses_what_it_cannot_wrap_with_one_clear_line() -> None:
    with pytest.raises(
        UsageError, match="recorded\\(\\) takes a ChatCompletionClient or a Workbench, not str"
    ):
        recorded("gpt-4o")  # type: ignore[call-overload]
    with pytest.raises(UsageError, match="rerun= names tools of a workbench"):
        recorded(ScriptedModel([]), rerun={"add"})  # type: ignore[call-overload]
    with pytest.raises(UsageError, match="rerun= is a set of tool names, not the string 'add'"):
        recorded(StaticWorkbench([]), rerun="add")


async def test_a_nested_durable_team_inside_a_society_of_mind_agent_replays_its_inner_turn(
    store_url: str,
) -> None:
    def outer(calls: list[int], ran: Ran) -> DurableGraphFlow:
        inner_agent = assistant(calls, ran)
        inner_graph = DiGraphBuilder()
        inner_graph.add_node(inner_agent)
        inner = DurableGraphFlow([inner_agent], inner_graph.build(), name="inner")
        mind = SocietyOfMindAgent("M", team=inner, model_client=ReplayChatCompletionClient(["summary"]))
        return team_of(mind, store_url)

    calls: list[int] = []
    ran = Ran()
    await crashed(outer(calls, ran), "model", "1")
    assert calls == [0, 1] and ran.runs == ["add"]
    again: list[int] = []
    fresh_ran = Ran()
    team = outer(again, fresh_ran)
    await team.run()
    assert again == [2] and fresh_ran.runs == ["charge"], "the inner turn replays what it recorded"
    assert final_text(team) == "summary"
    inner_runs = {r.run_id for r in team.store.calls.list(team.run_id)} | {
        run.run_id for run in team.store.list_runs() if run.run_id != team.run_id
    }
    replayed = [r for run_id in inner_runs for r in team.store.calls.list(run_id) if r.outcome == "replayed"]
    assert [(r.node, r.kind, r.ident) for r in replayed] == [
        ("A", "model", "0"),
        ("A", "tool", "call-0"),
        ("A", "model", "1"),
    ]


async def test_a_driver_that_lost_its_lease_writes_no_record(store_url: str) -> None:
    calls: list[int] = []
    agent = assistant(calls, Ran())
    model = agent._model_client
    assert isinstance(model, ScriptedModel)

    def frozen_then_taken_over(position: int) -> None:
        if position == 1:
            time.sleep(0.5)  # the process is frozen past its lease (as under SIGSTOP)...
            team.store._driver.acquire_lease("run", "another-driver", lease_seconds=30)  # ...and taken over

    model.before = frozen_then_taken_over
    team = team_of(agent, store_url, lease_seconds=0.2)
    with pytest.raises(LeaseLostError):
        await team.run(task="go")
    assert calls == [0, 1], "model call 1 was made by the stale driver..."
    assert [(r.kind, r.ident) for r in team.store.calls.list("run")] == [
        ("model", "0"),
        ("tool", "call-0"),
    ], "...and not recorded"
