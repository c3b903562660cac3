"""The canonical encoder refuses what JSON text in UTF-8 cannot hold, naming where."""

from __future__ import annotations

from typing import Any

import pytest

from graphflow_durable._model.codec import dumps, state_text, too_deep
from graphflow_durable.errors import NotSerializableError


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


@pytest.mark.parametrize("encode", [dumps, state_text])
@pytest.mark.parametrize(
    ("value", "where", "says"),
    [
        ({"a": ["ok", "lone \udfff"]}, "v/a/1", "lone surrogate '\\udfff' at character 5"),
        ({"k\ud800": 1}, "v/k\ud800", "lone surrogate"),
        ({"a": _deep(5000)}, "v/a/x/x/x", "nested 5001 levels deep"),
        ({"a": float("inf")}, "v/a", "float inf"),
    ],
)
def test_unencodable_values_are_refused_with_their_pointer_and_node(
    encode: Any, value: Any, where: str, says: str
) -> None:
    with pytest.raises(NotSerializableError) as raised:
        encode(value, where="v", node="N")
    assert raised.value.node == "N"
    assert raised.value.where is not None and raised.value.where.startswith(where)
    assert says in str(raised.value) and str(raised.value).startswith("node 'N': cannot store v/")
    str(raised.value).encode("utf-8")  # the message itself can be printed


def test_a_value_that_contains_itself_is_refused_not_walked_forever() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(NotSerializableError, match="circular reference"):
        dumps(value, where="v")


def test_non_ascii_text_with_paired_surrogates_or_nul_is_stored() -> None:
    assert dumps({"t": "a\x00 é 😀"}) == '{"t":"a\\u0000 é 😀"}'


def test_too_deep_names_the_first_container_beyond_the_limit_of_a_value_deeper_than_recursion_allows() -> (
    None
):
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert too_deep({"a": [1, {"b": deep}]}, 500) == ("a", 1, "b", *([0] * 497))
    assert too_deep({"a": [1, {"b": [[]]}]}, 5) is None
    assert too_deep("text", 0) is None
