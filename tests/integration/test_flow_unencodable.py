"""Content the encoder cannot take (a lone surrogate, a value nested thousands of
levels deep) is refused with a NotSerializableError naming the node and where in the value, before
anything of the turn is written; a fixed agent resumes the run to the end."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken

from agents import Scripted, chain, close_stores, durable, stored_transcript, text
from graphflow_durable import NotSerializableError


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


class Poisoned(Scripted):
    """A Scripted agent whose turns produce what JSON text in UTF-8 cannot hold."""

    def __init__(self, name: str, poison: str) -> None:
        super().__init__(name)
        self.poison = poison

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        response = await super().on_messages(messages, cancellation_token)
        if self.poison == "surrogate":
            return Response(chat_message=TextMessage(content="half a pair: \ud800", source=self.name))
        return response

    async def save_state(self) -> Mapping[str, Any]:
        state = dict(await super().save_state())
        if self.poison == "deep" and self.turn > 0:
            state["notes"] = _deep(5000)
        return state


@pytest.mark.parametrize(
    ("poison", "pointer"),
    [("surrogate", "messages/2/body/content"), ("deep", "agent_states/B/notes/0/0/0")],
)
async def test_unencodable_answer_or_state_is_refused_naming_the_node_and_the_run_resumes(
    store_url: str, poison: str, pointer: str
) -> None:
    reference_agents = [Scripted(n) for n in "ABC"]
    reference = text(
        (await durable(reference_agents, chain(*reference_agents), store_url, "ref").run(task="go")).messages
    )

    agents = [Scripted("A"), Poisoned("B", poison), Scripted("C")]
    team = durable(agents, chain(*agents), store_url, "run")
    with pytest.raises(NotSerializableError) as raised:
        await team.run(task="go")
    assert raised.value.node == "B"
    assert raised.value.where is not None and raised.value.where.startswith(pointer)
    assert "node 'B'" in str(raised.value)
    assert ("surrogate" if poison == "surrogate" else "5001 levels deep") in str(raised.value)
    # nothing of B's turn was written: the thread ends with A, B is still in flight
    assert [source for source, _ in stored_transcript(team)] == ["user", "A"]
    assert team.store.load("run").scheduler["s"]["in_flight"] == ["B"]

    calls: list[str] = []
    fixed = [Scripted(n, calls=calls) for n in "ABC"]
    resumed = durable(fixed, chain(*fixed), store_url, "run")
    await resumed.run()
    assert calls == ["B", "C"]
    assert stored_transcript(resumed) == reference
    assert resumed.run_info().status == "finished"
