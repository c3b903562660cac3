"""Text splices with message references: lossless, minimal at both ends, and readable next to the
older structural deltas."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphflow_durable._agentstate import jsondelta as _jsondelta
from graphflow_durable._agentstate.decoder import fold_states
from graphflow_durable._agentstate.textdelta import MIN_REFERENCE, Rope, common_ends, splice, with_references
from graphflow_durable._model.codec import dumps, state_text
from graphflow_durable.errors import NotSerializableError, StoreError

# Texts over a small alphabet, so prefixes, suffixes and repeats are common; long enough to cross
# the 4096-character blocks of the end search.
texts = st.text(alphabet='ab"{}', max_size=40) | st.builds(
    lambda unit, n, tail: unit * n + tail,
    st.text(alphabet="ab", min_size=1, max_size=3),
    st.integers(0, 3000),
    st.text(alphabet="abc", max_size=5),
)
MESSAGES = {seq: dumps(f"message {seq} " + "xyz"[seq % 3] * (MIN_REFERENCE + seq)) for seq in range(8)}


def resolve(seq: int) -> str:
    return MESSAGES[seq]


def expand(pieces: list[str | int]) -> str:
    return "".join(p if isinstance(p, str) else resolve(p) for p in pieces)


@settings(max_examples=400, deadline=None)
@given(texts, texts)
def test_common_ends_are_the_longest_prefix_and_then_the_longest_suffix(old: str, new: str) -> None:
    p, s = common_ends(old, new)
    assert old[:p] == new[:p]
    assert p == min(len(old), len(new)) or old[p] != new[p]
    rest = min(len(old), len(new)) - p
    assert 0 <= s <= rest
    assert old[len(old) - s :] == new[len(new) - s :]
    assert s == rest or old[len(old) - s - 1] != new[len(new) - s - 1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.text(alphabet="ab,", max_size=6), st.sampled_from(sorted(MESSAGES))), max_size=8),
    st.sets(st.sampled_from(sorted(MESSAGES))),
)
def test_references_replace_exact_occurrences_only_and_lose_nothing(
    parts: list[str | int], known: set[int]
) -> None:
    text = expand(parts)
    pieces = with_references(text, [(seq, MESSAGES[seq]) for seq in sorted(known)])
    assert expand(pieces) == text
    assert {p for p in pieces if isinstance(p, int)} <= known


@settings(max_examples=300, deadline=None)
@given(
    texts,
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.integers(0, 10**6),
            texts,
            st.sets(st.sampled_from(sorted(MESSAGES)), max_size=3),
        ),
        max_size=6,
    ),
)
def test_a_rope_edited_by_the_writers_splices_is_the_new_text_and_so_is_its_snapshot(
    start: str, edits: list[tuple[int, int, str, set[int]]]
) -> None:
    rope = Rope.of([start], resolve)
    current = start
    for a, b, middle, inserted in edits:
        i, j = sorted((a % (len(current) + 1), b % (len(current) + 1)))
        new = current[:i] + middle + "".join(MESSAGES[s] for s in sorted(inserted)) + current[j:]
        p, s = common_ends(current, new)
        pieces = with_references(new[p : len(new) - s], [(q, MESSAGES[q]) for q in sorted(MESSAGES)])
        patch = json.loads(json.dumps(splice(p, len(current) - p - s, pieces)))
        rope.splice(patch["at"], patch["cut"], patch["put"], resolve)
        current = new
        assert rope.text() == current and len(rope) == len(current)
        assert Rope.of(rope.pieces(), resolve).text() == current


def test_a_splice_outside_the_text_is_refused() -> None:
    rope = Rope.of(["abc"], resolve)
    with pytest.raises(ValueError, match="outside a text of 3 characters"):
        rope.splice(2, 5, ["x"], resolve)


def rows(node: str, *items: tuple[int, int | None, Any]) -> list[tuple[str, int, int | None, str]]:
    return [(node, step, base, dumps(body)) for step, base, body in items]


def test_fold_reads_both_chains_and_refuses_one_that_mixes_them() -> None:
    v1: dict[str, Any] = {"context": ["hello"], "turns": 1}
    three, five = json.loads(MESSAGES[3]), json.loads(MESSAGES[5])
    v2 = {"context": ["hello", three], "turns": 2}
    v3 = {"context": ["hello", three, five], "turns": 3}
    # before schema 4: a whole value, then structural deltas
    legacy = rows("A", (1, None, v1), (4, 1, _jsondelta.diff(v1, v2)))
    assert fold_states("r", legacy, resolve) == ({"A": v2}, {"A": 4})
    # schema 4: a splice of the empty text, then splices, with message references
    p, s = common_ends(dumps(v2), dumps(v3))
    middle = dumps(v3)[p : len(dumps(v3)) - s]
    splice3 = splice(p, len(dumps(v2)) - p - s, with_references(middle, [(5, MESSAGES[5])]))
    assert any(isinstance(x, int) for x in splice3["put"])
    whole2 = splice(0, 0, with_references(dumps(v2), [(3, MESSAGES[3])]))
    current = rows("A", (4, 0, whole2), (7, 4, splice3))
    assert fold_states("r", current, resolve) == ({"A": v3}, {"A": 7})
    # a writer never continues one kind of chain with the other
    with pytest.raises(
        StoreError, match=r"node 'A' saved at step 7 is a splice against a row of the other kind"
    ):
        fold_states("r", [*legacy, *rows("A", (7, 4, splice3))], resolve)
    with pytest.raises(StoreError, match=r"step 9 is a structural delta against a row of the other kind"):
        fold_states("r", [*current, *rows("A", (9, 7, _jsondelta.diff(v3, v1)))], resolve)


def test_a_whole_state_written_with_references_starts_a_new_chain() -> None:
    state = {"context": [json.loads(MESSAGES[2])], "turns": 1}
    text = dumps(state)
    log = rows(
        "A", (1, None, {"stale": True}), (5, 0, splice(0, 0, with_references(text, [(2, MESSAGES[2])])))
    )
    assert fold_states("r", log, resolve)[0] == {"A": state}


def test_a_splice_that_does_not_fit_its_base_is_corruption_naming_node_and_step() -> None:
    whole = splice(0, 0, [dumps({"x": 1})])
    log = rows("A", (1, 0, whole), (3, 1, splice(5, 99, ["y"])))
    with pytest.raises(StoreError, match=r"node 'A' saved at step 3 cannot be applied.*corrupt"):
        fold_states("r", log, resolve)
    broken = rows("A", (1, 0, whole), (3, 1, splice(1, 0, ["}"])))
    with pytest.raises(StoreError, match=r"node 'A' rebuilt from its rows up to step 3 is not JSON"):
        fold_states("r", broken, resolve)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_state_text_is_json_of_the_same_value_and_stable(value: Any) -> None:
    text = state_text(value)
    assert json.loads(text) == value
    assert state_text(value) == text


def test_state_text_takes_the_canonical_path_for_what_is_not_plain_json_and_refuses_what_json_cannot_hold() -> (
    None
):
    assert state_text({"pair": (1, 2)}) == dumps({"pair": [1, 2]})
    assert state_text({1: "one"}) == dumps({"1": "one"})
    with pytest.raises(NotSerializableError, match=r"agent_states/A/when: datetime"):
        state_text({"when": datetime.datetime(2026, 1, 1)}, where="agent_states/A")
    with pytest.raises(NotSerializableError, match=r"agent_states/A/x: float nan"):
        state_text({"x": float("nan")}, where="agent_states/A")
