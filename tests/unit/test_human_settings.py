"""The human_input= argument: modes per team and per node, their JSON form, request ids."""

from __future__ import annotations

import pytest

from graphflow_durable import HumanInput, UsageError
from graphflow_durable._model.human import human_input_config, human_inputs, request_id


def test_no_setting_is_inline_everywhere_and_writes_nothing_to_the_config() -> None:
    default, per_node = human_inputs(None, ["H"])
    assert default == HumanInput("inline") and per_node == {}
    assert human_input_config(default, per_node) is None


@pytest.mark.parametrize(
    "value",
    ["wait", HumanInput("wait", timeout=5, default="ok"), {"mode": "wait", "timeout": 5, "default": "ok"}],
)
def test_a_team_wide_setting_round_trips_through_its_json_form(value: object) -> None:
    default, per_node = human_inputs(value, ["H"])
    assert default.mode == "wait" and per_node == {}
    assert human_inputs(human_input_config(default, per_node), ["H"]) == (default, per_node)


def test_per_node_settings_with_a_star_default_round_trip() -> None:
    default, per_node = human_inputs({"*": "wait", "H": HumanInput("inline")}, ["H", "G"])
    assert default == HumanInput("wait") and per_node == {"H": HumanInput("inline")}
    assert human_inputs(human_input_config(default, per_node), ["H", "G"]) == (default, per_node)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("later", "'wait' or 'inline'"),
        ({"X": "wait"}, "'X', which is not a participant"),
        ({"H": 3}, "must be 'wait', 'inline' or a HumanInput"),
        ({"H": {"mode": "wait", "when": 1}}, "unexpected keyword"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_problem(value: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        human_inputs(value, ["H"])


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_a_deadline_must_be_a_positive_number_of_seconds(timeout: float) -> None:
    with pytest.raises(UsageError, match="timeout must be"):
        HumanInput("wait", timeout=timeout)


def test_request_ids_are_node_and_step_and_count_the_calls_of_one_turn() -> None:
    assert [request_id("H", 7, i) for i in (1, 2, 3)] == ["H/7", "H/7#2", "H/7#3"]
