"""A fork that replaces one answer ("B should have said X"): what depended on it runs
again, the rest is kept; refused where the answer decided something the fork would keep."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken

from agents import Scripted, chain, close_stores, durable, loop_agents, loop_graph, stored_transcript
from graphflow_durable.errors import UsageError


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


class Remembering(Scripted):
    """A scripted agent whose saved state holds what it said last (as a model context would)."""

    said = ""

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        response = await super().on_messages(messages, cancellation_token)
        assert isinstance(response.chat_message, TextMessage)
        self.said = response.chat_message.content
        return response

    async def save_state(self) -> Mapping[str, Any]:
        return {"turn": self.turn, "said": self.said}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        self.turn, self.said = int(state["turn"]), str(state["said"])


def _chain(url: str, run_id: str, calls: list[str]) -> Any:
    agents = [Remembering(n, calls=calls) for n in "ABC"]
    return durable(agents, chain(*agents), url, run_id)


async def test_replacing_an_answer_reruns_what_followed_it_and_keeps_what_came_before(store_url: str) -> None:
    calls: list[str] = []
    source = _chain(store_url, "source", calls)
    await source.run(task="go")
    before = stored_transcript(source)
    b_step = next(s.seq for s in source.history() if s.node == "B")
    head = source.run_info().head_seq
    fork = source.fork(head, run_id="edited", replace=(2, TextMessage(content="B says X", source="B")))
    assert fork.head_seq == b_step and fork.status == "interrupted", "cut just after B's answer"
    assert stored_transcript(source) == before, "the source is only read"
    again: list[str] = []
    team = _chain(store_url, "edited", again)
    await team.run()
    after = stored_transcript(team)
    assert again == ["C"], "A and B are not run again; C, which heard B, is"
    assert after[:2] == before[:2] and after[2] == ("B", "B says X")
    assert after[3][0] == "C" and after[3] != before[3], "C answered what B now says"
    state = await team.save_state(at=b_step)
    b = next(v for k, v in state["agent_states"].items() if k == "B")
    assert b["agent_state"] == {"turn": 1, "said": "B says X"}, "B's own memory of its answer is replaced"


async def test_replacing_an_answer_is_refused_where_it_decided_something_or_is_not_a_nodes_answer(
    store_url: str,
) -> None:
    agents = loop_agents([])
    team = durable(agents, loop_graph(agents), store_url, "loop", MaxMessageTermination(60))
    await team.run(task="go")
    head = team.run_info().head_seq
    r_answer = next(s.message_seqs[0] for s in team.history(node="R"))
    with pytest.raises(UsageError, match="node 'R''s edges have conditions"):
        team.fork(head, replace=(r_answer, TextMessage(content="done", source="R")))
    with pytest.raises(UsageError, match="message 0 is not a node's answer"):
        team.fork(head, replace=(0, TextMessage(content="other task", source="user")))
    j_answer = next(s.message_seqs[0] for s in team.history(node="J"))
    with pytest.raises(UsageError, match="the replacement must be a text message whose source is 'J'"):
        team.fork(head, replace=(j_answer, TextMessage(content="x", source="R")))
    with pytest.raises(UsageError, match="message 99 is not in the run at step 3"):
        team.fork(3, replace=(99, TextMessage(content="x", source="J")))
    e_answer = next(s.message_seqs[0] for s in team.history(node="E"))
    with pytest.raises(UsageError, match="ended the round"):
        team.fork(head, replace=(e_answer, TextMessage(content="x", source="E")))
    assert [r.run_id for r in team.store.list_runs()] == ["loop"], "nothing was written"
    # J's edge to R has no condition: its answer can be replaced, and the loop runs again from R
    edited = team.fork(
        head, run_id="j-edited", replace=(j_answer, TextMessage(content="J says X", source="J"))
    )
    fresh = loop_agents([])
    again = durable(fresh, loop_graph(fresh), store_url, "j-edited", MaxMessageTermination(60))
    await again.run()
    thread = stored_transcript(again)
    assert thread[j_answer] == ("J", "J says X") and len(thread) == len(stored_transcript(team))
    assert thread[j_answer + 1][0] == "R" and thread[j_answer + 1] != stored_transcript(team)[j_answer + 1]
    assert again.run_info().status == "finished" and edited.parent_run_id == "loop"
