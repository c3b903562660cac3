"""Logs: a lost lease, a normal event in a pool, is one line, not tracebacks.

A driver is frozen (its event loop blocked, as under SIGSTOP) while its agent B runs; meanwhile its
lease expires and a successor takes the run over and finishes it. When the frozen driver wakes up,
B's answer is refused by the fencing token (on PostgreSQL inside psycopg's pipeline mode, where the
successor's rows make the statements fail too). It must log one WARNING line saying so, and no
library may log an ERROR traceback or psycopg's "pipeline aborted" warning. An agent's own error is
still logged by AutoGen as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agents import Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable.errors import LeaseLostError


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


async def test_a_lost_lease_is_one_warning_line_and_no_traceback(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = 0.6
    calls: list[str] = []
    successor_calls: list[str] = []

    def successor() -> None:
        agents = [Scripted(n, calls=successor_calls) for n in "ABC"]
        team = durable(agents, chain(*agents), store_url, "lost", lease_seconds=30, lease_owner="successor")
        asyncio.run(team.run())

    async def frozen(agent: Scripted, messages: Sequence[Any]) -> None:
        time.sleep(lease + 0.3)  # blocks the event loop: no renewal; the lease expires
        thread = threading.Thread(target=successor)
        thread.start()
        thread.join()  # the successor runs B and C and finishes the run meanwhile

    agents = [Scripted(n, calls=calls, before=frozen if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), store_url, "lost", lease_seconds=lease, lease_owner="first")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(team.run(task="go"), 30)
    assert calls == ["A", "B"] and successor_calls == ["B", "C"]
    assert [s for s, _ in stored_transcript(team)] == ["user", "A", "B", "C"]

    lost = [r for r in caplog.records if "lease lost" in r.getMessage()]
    assert [(r.name, r.levelno) for r in lost] == [("graphflow_durable.flow", logging.WARNING)]
    assert lost[0].getMessage() == (
        "run lost: lease lost to another driver (fencing token 2, since released); stopped dispatching"
    )
    loud = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and r.exc_info)
    ]
    assert loud == [], [f"{r.name}: {r.getMessage()}" for r in loud]
    assert not [r for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= logging.WARNING]


async def test_an_agents_own_error_is_still_logged_by_autogen_with_its_traceback(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(agent: Scripted, messages: Sequence[Any]) -> None:
        raise ValueError("the model refused")

    agents = [Scripted(n, before=broken if n == "B" else None) for n in "ABC"]
    team = durable(agents, chain(*agents), sqlite_url, "broken")
    with pytest.raises(Exception, match="the model refused"):
        await asyncio.wait_for(team.run(task="go"), 30)
    logged = [
        r
        for r in caplog.records
        if r.name == "autogen_core"
        and r.levelno == logging.ERROR
        and r.exc_info
        and "the model refused" in repr(r.exc_info[1])
    ]
    assert logged, [f"{r.name} {r.levelname}: {r.getMessage()}" for r in caplog.records]


def test_psycopgs_pipeline_aborted_warning_after_a_refused_commit_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """psycopg logs it while the commit's own error propagates (see _runtime/stops.py); other
    psycopg warnings pass."""
    errors = pytest.importorskip("psycopg.errors")
    from graphflow_durable._runtime.stops import install_log_filters

    install_log_filters()
    psycopg_log = logging.getLogger("psycopg")
    psycopg_log.warning(
        "error ignored terminating %r: %s", "<Pipeline>", errors.PipelineAborted("pipeline aborted")
    )
    psycopg_log.warning("error ignored terminating %r: %s", "<Pipeline>", "something else")
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == [
        "error ignored terminating '<Pipeline>': something else"
    ]
