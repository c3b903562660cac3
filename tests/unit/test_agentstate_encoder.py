"""The agent-state writer (``_agentstate/encoder.py``, :class:`StateLog`) and its reader.

Rows as docs/state-format.md ("In the database") describes them: ``base_step`` 0 is a whole state
(a splice of the empty text), ``base_step`` k a splice against the node's row at step k, whose
pieces are literal text or references to a message's content. The property test folds the rows the
writer made back with the store's reader and must get every state exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphflow_durable._agentstate.decoder import fold_states
from graphflow_durable._agentstate.encoder import MAX_DELTAS, StateLog
from graphflow_durable._model.codec import dumps
from graphflow_durable._model.records import AgentStateRecord, MessageRecord

LONG = 300  # longer than MIN_REFERENCE: such contents are stored as references


def text_of(row: Any) -> str:
    """A written row's body as the JSON text the store keeps (rows carry the text or the value)."""
    text = getattr(row, "text", None)
    return text if isinstance(text, str) else dumps(row.body)


def body_of(row: Any) -> dict[str, Any]:
    return dict(json.loads(text_of(row)))


class Run:
    """A run's message log and agent-state rows, written through one :class:`StateLog`."""

    def __init__(self) -> None:
        self.log = StateLog()
        self.messages: list[MessageRecord] = []
        self.rows: list[tuple[str, int, int | None, str]] = []
        self.step = 0

    def commit(
        self, states: Mapping[str, Any], contents: Sequence[str] = (), *, fails: bool = False
    ) -> list[Any]:
        """One commit adding messages with ``contents`` and the given states; returns the rows.

        With ``fails``, the commit is not stored and the writer is cleared, as the flow does."""
        self.step += 1
        added = [
            MessageRecord(len(self.messages) + i, {"source": "A", "content": c}, True)
            for i, c in enumerate(contents)
        ]
        written = self.log.encode([AgentStateRecord(n, s) for n, s in states.items()], added, self.step)
        if fails:
            self.log.clear()
            return written
        self.messages += added
        self.rows += [(r.node, self.step, r.base_step, text_of(r)) for r in written]
        return written

    def message_text(self, seq: int) -> str:
        return dumps(self.messages[seq].body["content"])

    def fold(self) -> dict[str, Any]:
        rows = sorted(self.rows, key=lambda r: (r[0], r[1]))
        states, _ = fold_states("r1", rows, self.message_text)
        return states


def context(*contents: str) -> dict[str, Any]:
    """A model-context-like agent state repeating what it heard."""
    return {
        "llm_context": {
            "messages": [{"content": c, "source": "user", "type": "UserMessage"} for c in contents]
        }
    }


# -- examples -------------------------------------------------------------------------------------


def test_the_first_write_of_a_node_is_a_whole_state() -> None:
    run = Run()
    [row] = run.commit({"A": {"turn": 1}})
    assert row.node == "A"
    assert row.base_step == 0
    body = body_of(row)
    assert (body["at"], body["cut"]) == (0, 0)
    assert "".join(p for p in body["put"] if isinstance(p, str)) == '{"turn":1}'
    assert run.fold() == {"A": {"turn": 1}}


def test_an_unchanged_state_writes_no_row() -> None:
    run = Run()
    run.commit({"A": {"turn": 1}, "B": {"turn": 1}})
    assert run.commit({"A": {"turn": 1}, "B": {"turn": 2}}) != []
    assert [r.node for r in run.commit({"A": {"turn": 1}, "B": {"turn": 2}})] == []
    assert run.fold() == {"A": {"turn": 1}, "B": {"turn": 2}}


def test_a_changed_state_writes_a_splice_of_what_changed_against_its_previous_row() -> None:
    run = Run()
    big = {"notes": "x" * 2000, "turn": 1}
    run.commit({"A": big})
    [row] = run.commit({"A": {**big, "turn": 2}})
    body = body_of(row)
    assert row.base_step == 1
    assert body["at"] > 2000  # only the tail that changed
    assert len(text_of(row)) < 100
    assert run.fold() == {"A": {"notes": "x" * 2000, "turn": 2}}


def test_the_base_of_a_splice_is_the_nodes_latest_row_not_the_latest_step() -> None:
    run = Run()
    big = {"notes": "x" * 2000, "turn": 1}
    run.commit({"A": big})  # step 1
    run.commit({"B": {"turn": 1}})  # step 2: A unchanged, no row
    [row] = run.commit({"A": {**big, "turn": 2}})  # step 3
    assert row.base_step == 1


def test_a_message_repeated_in_a_state_is_stored_as_a_reference_to_it() -> None:
    run = Run()
    heard = "h" * LONG
    said = "s" * LONG
    [first] = run.commit({"A": context(heard)}, [heard])
    assert 0 in body_of(first)["put"]
    assert heard not in text_of(first)
    [second] = run.commit({"A": context(heard, said)}, [said])
    assert 1 in body_of(second)["put"]
    assert said not in text_of(second)
    assert run.fold() == {"A": context(heard, said)}


def test_short_contents_are_stored_literally() -> None:
    run = Run()
    [row] = run.commit({"A": context("hello")}, ["hello"])
    assert all(isinstance(p, str) for p in body_of(row)["put"])


def test_clear_makes_the_next_write_of_every_node_whole() -> None:
    run = Run()
    big = {"notes": "x" * 2000, "turn": 1}
    run.commit({"A": big})
    run.log.clear()
    [row] = run.commit({"A": {**big, "turn": 2}})
    assert row.base_step == 0
    assert [r.node for r in run.commit({"A": {**big, "turn": 2}, "B": {}})] == ["B"]  # A unchanged
    assert run.fold()["A"] == {**big, "turn": 2}


def test_prime_after_a_load_makes_the_next_write_whole_and_keeps_counting_messages() -> None:
    run = Run()
    content = "c" * LONG
    run.messages = [MessageRecord(i, {"content": f"old {i}"}, True) for i in range(5)]
    run.log.prime(5)
    [row] = run.commit({"A": context(content)}, [content])
    assert row.base_step == 0
    assert 5 in body_of(row)["put"]  # the new message is seq 5, after the loaded ones
    assert run.fold() == {"A": context(content)}


def test_a_whole_snapshot_is_written_again_once_the_splices_add_up_to_its_size() -> None:
    run = Run()
    state: dict[str, Any] = {"log": [], "padding": "p" * 500}
    run.commit({"A": state})
    kinds = []
    for i in range(40):
        state = {**state, "log": [*state["log"], f"entry {i}"]}
        kinds += [r.base_step == 0 for r in run.commit({"A": state})]
    assert any(kinds)  # the splices outgrew the small first snapshot
    assert not all(kinds)
    assert run.fold() == {"A": state}


def test_a_whole_snapshot_is_written_after_max_deltas_splices_however_small() -> None:
    run = Run()
    state = {"turn": 0, "padding": "p" * (MAX_DELTAS * 200)}
    run.commit({"A": state})
    whole = []
    for turn in range(1, MAX_DELTAS + 3):
        [row] = run.commit({"A": {**state, "turn": turn}})
        whole.append(row.base_step == 0)
    assert whole.index(True) == MAX_DELTAS  # 256 splices, then a whole state
    assert run.fold()["A"]["turn"] == MAX_DELTAS + 2


def test_a_value_json_cannot_hold_fails_naming_the_node() -> None:
    from graphflow_durable.errors import NotSerializableError

    with pytest.raises(NotSerializableError, match="agent_states/A"):
        StateLog().encode([AgentStateRecord("A", {"blob": b"bytes"})], [], 1)


# -- property: what is written folds back to every state --------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

NODES = ("A", "B")


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[dict[str, Any], list[str], bool]]:
    """Commits: the states written, the contents of the messages added, whether the commit fails."""
    pool = [c * (LONG + i) for i, c in enumerate("uvwxyz")]  # long contents: referenced when repeated
    heard: dict[str, list[str]] = {n: [] for n in NODES}
    extra: dict[str, Any] = {n: draw(json_values) for n in NODES}
    commits = []
    for _ in range(draw(st.integers(1, 12))):
        contents = draw(st.lists(st.sampled_from(pool) | st.text(max_size=30), max_size=2))
        states: dict[str, Any] = {}
        for node in draw(st.lists(st.sampled_from(NODES), unique=True, max_size=2)):
            edit = draw(st.sampled_from(["hear", "replace", "same", "forget"]))
            if edit == "hear":
                heard[node] = [*heard[node], *contents]
            elif edit == "replace":
                extra[node] = draw(json_values)
            elif edit == "forget":
                heard[node] = heard[node][1:]
            states[node] = {"extra": extra[node], **context(*heard[node])}
        fails = draw(st.integers(0, 9)) == 0  # now and then a commit fails (the flow clears the writer)
        commits.append((states, contents, fails))
    return commits


@settings(max_examples=150, deadline=None)
@given(runs())
def test_folding_the_written_rows_gives_back_every_state_exactly(
    commits: list[tuple[dict[str, Any], list[str], bool]],
) -> None:
    run = Run()
    expected: dict[str, Any] = {}
    for states, contents, fails in commits:
        run.commit(states, contents, fails=fails)
        if not fails:
            expected.update({n: json.loads(json.dumps(s)) for n, s in states.items()})
        assert run.fold() == expected
