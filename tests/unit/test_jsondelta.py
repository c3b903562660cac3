"""JSON deltas: applying the diff of two values gives the second, without touching the first."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from graphflow_durable._agentstate import jsondelta as _jsondelta

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(values, values)
def test_apply_of_diff_gives_the_new_value_and_leaves_the_old_one_alone(old: Any, new: Any) -> None:
    before = copy.deepcopy(old)
    patch = _jsondelta.diff(old, new)
    json.dumps(patch)  # a patch is JSON
    assert _jsondelta.apply(old, patch) == new
    assert old == before


@settings(max_examples=200, deadline=None)
@given(st.lists(values, max_size=6), st.lists(values, min_size=1, max_size=3))
def test_a_list_that_grows_is_stored_as_its_new_items_only(history: list[Any], added: list[Any]) -> None:
    old = {"type": "AssistantAgentState", "llm_context": {"messages": history}}
    new = {"type": "AssistantAgentState", "llm_context": {"messages": history + added}}
    assert _jsondelta.diff(old, new) == {"sub": {"llm_context": {"sub": {"messages": {"+": added}}}}}


def test_equal_values_give_an_empty_patch() -> None:
    assert _jsondelta.diff({"a": [1, 2]}, {"a": [1, 2]}) == {}
    assert _jsondelta.apply({"a": 1}, {}) == {"a": 1}
