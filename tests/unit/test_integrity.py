"""validate_state / repair_state on real legacy states (tests/fixtures/legacy) and on broken ones."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from graphflow_durable.errors import GraphMismatchError, StateFormatError, UnrepairableStateError
from graphflow_durable.integrity import CODES, repair_state, validate_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import make_legacy as ml

M = "GraphManager"


def legacy(name: str) -> tuple[dict[str, Any], Any]:
    return ml.load(name), ml.SCENARIOS[name].graph()


def ext(state: dict[str, Any]) -> dict[str, Any]:
    return dict(state["agent_states"][M]["graphflow_durable"])


EXPECTED_CODES = {
    "sequential_zombie": {"GFD006-legacy-format", "GFD201-zombie-ready-empty"},
    "fanout_join": {"GFD006-legacy-format", "GFD201-zombie-ready-empty", "GFD103-buffer-mismatch"},
    "sibling_ready": {"GFD006-legacy-format", "GFD202-lost-in-flight", "GFD103-buffer-mismatch"},
    "conditional_loop": {"GFD006-legacy-format", "GFD201-zombie-ready-empty"},
    "loop_stopped_by_max_turns": {"GFD006-legacy-format", "GFD301-loop-cannot-rearm"},
    "any_loop": {"GFD006-legacy-format", "GFD201-zombie-ready-empty"},
    "finished": {"GFD006-legacy-format", "GFD211-finished-restarts"},
}


@pytest.mark.parametrize("name", sorted(ml.SCENARIOS))
def test_validate_finds_the_known_corruption_of_each_legacy_fixture(name: str) -> None:
    state, graph = legacy(name)
    report = validate_state(state, graph)
    assert set(report.codes) == EXPECTED_CODES[name]
    assert report.ok is (name == "finished")
    assert report.skipped == ()
    for finding in report.findings:
        assert finding.severity == CODES[finding.code][0]
        assert finding.pointer.startswith("/agent_states")
        assert finding.message


@pytest.mark.parametrize("name", sorted(ml.SCENARIOS))
def test_repair_rebuilds_the_scheduler_state_the_thread_explains(name: str) -> None:
    state, graph = legacy(name)
    expected = ml.SCENARIOS[name].expected
    repaired = repair_state(state, graph).state
    section = ext(repaired)
    sched = section["scheduler"]
    assert sched["in_flight"] == expected["in_flight"]
    assert sched["ready"] == expected["ready"]
    assert section["status"] == expected["status"]
    assert section["format"] == 1
    assert sched.get("triggered", {}) == expected.get("triggered", {})
    origin = graph.get_remaining_map()
    changed = {t: {g: c for g, c in gs.items() if origin[t][g] != c} for t, gs in sched["remaining"].items()}
    assert {t: gs for t, gs in changed.items() if gs} == expected["remaining"]
    manager = repaired["agent_states"][M]
    assert manager["ready"] == [*expected["in_flight"], *expected["ready"]]
    assert manager["remaining"] == sched["remaining"]
    assert manager["current_turn"] == state["agent_states"][M]["current_turn"] == sched["turn"]
    assert section["attempts"] == dict.fromkeys(expected["in_flight"], 1)


def test_zombie_repair_restores_the_running_node_with_its_input_and_dispatch_point() -> None:
    state, graph = legacy("sequential_zombie")
    repaired = repair_state(state, graph).state
    section = ext(repaired)
    assert section["dispatches"] == {"A": [1], "B": [2]}
    assert section["batch_start"] == 2
    assert section["round_start"] == 0
    assert section["run_id"] is None
    assert section["graph_fingerprint"] == ""
    b = repaired["agent_states"]["B"]
    assert [m["source"] for m in b["message_buffer"]] == ["user", "A"]
    assert "deferred_buffer" not in b
    assert b["agent_state"] == state["agent_states"]["B"]["agent_state"]


def test_a_sibling_answer_during_an_in_flight_turn_is_deferred_not_input() -> None:
    state, graph = legacy("fanout_join")
    c = repair_state(state, graph).state["agent_states"]["C"]
    assert [m["source"] for m in c["message_buffer"]] == ["user", "A"]
    assert [m["source"] for m in c["deferred_buffer"]] == ["B"]


@pytest.mark.parametrize("name", sorted(ml.SCENARIOS))
def test_repair_is_pure_idempotent_and_its_output_validates_clean(name: str) -> None:
    state, graph = legacy(name)
    before = copy.deepcopy(state)
    first = repair_state(state, graph)
    assert state == before
    second = repair_state(first.state, graph)
    assert second.state == first.state
    assert second.changes == ()
    assert validate_state(first.state, graph).ok
    assert validate_state(first.state, graph).findings == ()
    json.dumps(first.state, allow_nan=False)


def test_repair_reports_changes_readably() -> None:
    state, graph = legacy("sibling_ready")
    result = repair_state(state, graph)
    texts = [str(c) for c in result.changes]
    assert '/agent_states/GraphManager/ready: ["D"] -> ["C","D"]' in texts
    assert "/agent_states/C/deferred_buffer: (absent) -> ['B']" in texts
    assert result.changed
    assert "GFD202-lost-in-flight" in result.report.codes


def test_the_graph_fingerprint_is_written_when_given_and_a_different_one_is_refused() -> None:
    state, graph = legacy("sequential_zombie")
    repaired = repair_state(state, graph, graph_fingerprint="f" * 64).state
    assert ext(repaired)["graph_fingerprint"] == "f" * 64
    assert repair_state(repaired, graph, graph_fingerprint="f" * 64).changes == ()
    report = validate_state(repaired, graph, graph_fingerprint="0" * 64)
    assert "GFD010-different-graph" in report.codes
    with pytest.raises(GraphMismatchError):
        repair_state(repaired, graph, graph_fingerprint="0" * 64)


def test_without_a_graph_the_zombie_is_still_found_and_graph_checks_are_listed_as_skipped() -> None:
    state, _ = legacy("sequential_zombie")
    report = validate_state(state)
    assert "GFD201-zombie-ready-empty" in report.codes
    assert "GFD202-lost-in-flight" in report.skipped
    assert "GFD209-thread-unexplained" in report.skipped
    assert not report.ok
    assert report.to_json()["skipped"] == list(report.skipped)


def test_a_repaired_state_without_a_graph_is_valid() -> None:
    state, graph = legacy("conditional_loop")
    assert validate_state(repair_state(state, graph).state).ok


# -- broken states ---------------------------------------------------------------------------------


def manager(state: dict[str, Any]) -> dict[str, Any]:
    return dict(state["agent_states"][M])


def test_a_value_that_is_not_a_team_state_is_reported_and_refused() -> None:
    _, graph = legacy("finished")
    for bad in ([], {"agent_states": []}, {"x": 1}):
        report = validate_state(bad, graph)  # type: ignore[arg-type]
        assert report.codes == ("GFD001-not-a-team-state",)
        with pytest.raises(StateFormatError, match="not a team state"):
            repair_state(bad, graph)  # type: ignore[arg-type]


def test_missing_manager_and_foreign_manager_are_refused() -> None:
    state, graph = legacy("finished")
    no_manager = copy.deepcopy(state)
    del no_manager["agent_states"][M]
    assert "GFD004-manager-missing" in validate_state(no_manager, graph).codes
    other = copy.deepcopy(state)
    other["agent_states"][M]["type"] = "RoundRobinManagerState"
    assert "GFD005-not-a-graphflow-state" in validate_state(other, graph).codes
    with pytest.raises(StateFormatError, match="RoundRobinManagerState"):
        repair_state(other, graph)


def test_team_version_missing_is_a_warning_repaired_and_unknown_is_refused() -> None:
    state, graph = legacy("finished")
    missing = copy.deepcopy(state)
    del missing["version"]
    assert "GFD002-version-missing" in validate_state(missing, graph).codes
    assert repair_state(missing, graph).state["version"] == "1.0.0"
    unknown = copy.deepcopy(state)
    unknown["version"] = "9.0.0"
    assert "GFD003-version-unknown" in validate_state(unknown, graph).codes
    with pytest.raises(StateFormatError, match=r"9\.0\.0"):
        repair_state(unknown, graph)


def test_an_unknown_durable_format_is_refused() -> None:
    state, graph = legacy("finished")
    newer = repair_state(state, graph).state
    newer["agent_states"][M]["graphflow_durable"]["format"] = 2
    assert "GFD007-durable-format-unknown" in validate_state(newer, graph).codes
    with pytest.raises(StateFormatError, match="format 2"):
        repair_state(newer, graph)


def test_a_thread_entry_that_is_not_a_message_is_refused_naming_its_index() -> None:
    state, graph = legacy("sequential_zombie")
    state["agent_states"][M]["message_thread"][1] = {"type": "NoSuchMessage", "source": "A"}
    report = validate_state(state, graph)
    assert "/agent_states/GraphManager/message_thread/1" in [f.pointer for f in report.findings]
    with pytest.raises(StateFormatError, match="message 1 "):
        repair_state(state, graph)


def test_a_thread_the_graph_cannot_explain_is_refused_naming_the_first_message_that_does_not_fit() -> None:
    state, graph = legacy("finished")
    thread = state["agent_states"][M]["message_thread"]
    thread[2], thread[3] = thread[3], thread[2]  # C speaks before B
    assert "GFD209-thread-unexplained" in validate_state(state, graph).codes
    with pytest.raises(UnrepairableStateError, match=r"message 2 from 'C'"):
        repair_state(state, graph)


def test_a_state_from_a_different_graph_is_refused() -> None:
    state, _ = legacy("sibling_ready")
    other = ml.SCENARIOS["finished"].graph()
    assert "GFD010-different-graph" in validate_state(state, other).codes
    with pytest.raises(GraphMismatchError):
        repair_state(state, other)


def test_a_missing_participant_state_is_not_invented() -> None:
    state, graph = legacy("sequential_zombie")
    del state["agent_states"]["C"]
    assert "GFD101-participant-missing" in validate_state(state, graph).codes
    with pytest.raises(UnrepairableStateError, match="'C'"):
        repair_state(state, graph)


def test_negative_impossible_and_wrong_counters_are_found_and_rebuilt() -> None:
    state, graph = legacy("sequential_zombie")
    state["agent_states"][M]["remaining"] = {"B": {"B": -1}, "C": {"C": 5}}
    assert "GFD204-negative-counter" in validate_state(state).codes
    report = validate_state(state, graph)
    assert {"GFD204-negative-counter", "GFD205-impossible-counter", "GFD206-remaining-mismatch"} <= set(
        report.codes
    )
    repaired = repair_state(state, graph).state
    assert repaired["agent_states"][M]["remaining"] == {"B": {"B": 1}, "C": {"C": 1}}


def test_wrong_enqueued_any_unknown_ready_names_and_bad_shapes_are_found_and_rebuilt() -> None:
    state, graph = legacy("any_loop")
    m = state["agent_states"][M]
    m["enqueued_any"]["D"]["D"] = True
    m["ready"] = ["Z"]
    state["agent_states"]["A"]["message_buffer"] = "oops"
    codes = set(validate_state(state, graph).codes)
    assert {
        "GFD207-enqueued-mismatch",
        "GFD208-unknown-node",
        "GFD203-ready-mismatch",
        "GFD008-bad-shape",
    } <= codes
    repaired = repair_state(state, graph).state
    # a garbage ready queue does not say B was dispatched: B is queued, and runs next either way
    assert repaired["agent_states"][M]["ready"] == ["B"]
    assert repaired["agent_states"][M]["enqueued_any"]["D"]["D"] is False
    assert validate_state(repaired, graph).ok


def test_a_negative_turn_is_reported_and_clamped() -> None:
    state, graph = legacy("sequential_zombie")
    state["agent_states"][M]["current_turn"] = -3
    assert "GFD210-negative-turn" in validate_state(state).codes
    assert repair_state(state, graph).state["agent_states"][M]["current_turn"] == 0


def test_a_durable_state_whose_plain_keys_drifted_is_reported_and_rewritten() -> None:
    state, graph = legacy("sibling_ready")
    repaired = repair_state(state, graph).state
    repaired["agent_states"][M]["ready"] = ["D"]
    repaired["agent_states"][M]["graphflow_durable"]["status"] = "finished"
    codes = set(validate_state(repaired).codes)
    assert "GFD401-view-mismatch" in codes
    assert "GFD402-status-mismatch" in set(validate_state(repaired, graph).codes)
    again = repair_state(repaired, graph).state
    assert again["agent_states"][M]["ready"] == ["C", "D"]
    assert ext(again)["status"] == "interrupted"


def test_a_durable_scheduler_that_lost_its_in_flight_node_is_found() -> None:
    state, graph = legacy("sibling_ready")
    repaired = repair_state(state, graph).state
    section = repaired["agent_states"][M]["graphflow_durable"]
    section["scheduler"]["in_flight"] = []
    section["scheduler"]["triggered"] = {}
    codes = set(validate_state(repaired, graph).codes)
    assert {"GFD202-lost-in-flight", "GFD302-triggered-mismatch"} <= codes


def test_finding_pointers_escape_slashes_and_tildes() -> None:
    from graphflow_durable._integrity.codes import pointer

    assert pointer("agent_states", "a/b~c", "message_buffer") == "/agent_states/a~1b~0c/message_buffer"


def test_every_code_has_a_severity_and_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "repair.md").read_text(encoding="utf-8")
    for code, (severity, summary) in CODES.items():
        assert severity in ("error", "warning", "info")
        assert summary
        assert f"`{code}`" in doc, code
