"""``max_crash_attempts``: validated where it is written, kept in the component config."""

from __future__ import annotations

import pytest

from agents import Scripted, chain
from graphflow_durable import DurableGraphFlow
from graphflow_durable.errors import UsageError


def made(url: str, **kw: object) -> DurableGraphFlow:
    a, b = Scripted("A"), Scripted("B")
    return DurableGraphFlow([a, b], chain(a, b), store=url, run_id="r", **kw)  # type: ignore[arg-type]


def test_max_crash_attempts_round_trips_through_the_component_config(sqlite_url: str) -> None:
    assert made(sqlite_url).dump_component().config["max_crash_attempts"] == 5
    config = made(sqlite_url, max_crash_attempts=2).dump_component()
    assert config.config["max_crash_attempts"] == 2
    loaded = DurableGraphFlow.load_component(config)
    assert loaded.dump_component().config["max_crash_attempts"] == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True, None])
def test_a_bad_max_crash_attempts_is_refused_with_one_clear_line(sqlite_url: str, bad: object) -> None:
    with pytest.raises(UsageError, match="max_crash_attempts must be an int 1 or more") as raised:
        made(sqlite_url, max_crash_attempts=bad)
    assert isinstance(raised.value, ValueError) and "\n" not in str(raised.value)
