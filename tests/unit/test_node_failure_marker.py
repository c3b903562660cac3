"""The ``node_failed`` marker of a run whose budget ran out: JSON both ways, and a run result that
is not one reads as no marker (never an error)."""

from __future__ import annotations

from typing import Any

import pytest

from graphflow_durable._model.records import NodeFailure


def test_the_marker_round_trips_through_json() -> None:
    marker = NodeFailure("writer", 3, "ConnectionError", "connection reset", "timeout")
    data = marker.to_json()
    assert data == {
        "node": "writer",
        "attempts": 3,
        "error_type": "ConnectionError",
        "error": "connection reset",
        "cause": "timeout",
    }
    assert NodeFailure.from_json(data) == marker
    assert NodeFailure.of_result({"stop_reason": "x", "node_failed": data}) == marker


@pytest.mark.parametrize(
    "result",
    [
        None,
        "text",
        {},
        {"stop_reason": "done"},
        {"node_failed": None},
        {"node_failed": {"node": "a"}},
        {"node_failed": {"node": "a", "attempts": "many"}},
        {"node_failed": ["a", 1]},
    ],
)
def test_a_result_without_a_whole_marker_has_none(result: Any) -> None:
    assert NodeFailure.of_result(result) is None


def test_an_unknown_cause_reads_as_an_error() -> None:
    marker = NodeFailure.from_json({"node": "a", "attempts": 1, "cause": "meteor"})
    assert marker == NodeFailure("a", 1, "", "", "error")
