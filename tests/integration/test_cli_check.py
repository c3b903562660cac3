"""``graphflow-durable check``, the pre-deploy check, on SQLite and PostgreSQL: stored runs loaded
into fresh teams of the current code (tests/integration/checkteam.py), with no agent started; what
it prints (text and ``--json``) and its exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from agents import close_stores
from graphflow_durable._storage import migrations as _migrations
from graphflow_durable._storage.engine import open_engines
from graphflow_durable.cli.runs import EXIT_DAMAGED, EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from graphflow_durable.store import Store

from . import checkteam

TEAM = "integration.checkteam"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    checkteam.ROUTE = "B"
    checkteam.CALLS.clear()
    yield
    checkteam.ROUTE = "B"
    close_stores()


def check(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, list[str], list[str]]:
    """Run ``graphflow-durable check ARGS --store URL``: exit code, stdout lines, stderr lines."""
    capsys.readouterr()
    code = main(["check", *args, "--store", url])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


def stored_runs(url: str) -> None:
    """Runs the deployed team left: stopped after A, stopped after B, failed while B ran (B in
    flight), and one finished."""

    async def go() -> None:
        await checkteam.make_team("stopped-a", store=url, max_turns=1).run(task="go")
        await checkteam.make_team("stopped-b", store=url, max_turns=2).run(task="go")
        with pytest.raises(RuntimeError):
            await checkteam.make_team("failed-b", store=url, b_fails=True).run(task="go")
        await checkteam.make_team("done", store=url).run(task="go")

    asyncio.run(go())
    with Store(url) as store:
        statuses = {r.run_id: r.status for r in store.list_runs()}
    assert statuses == {
        "stopped-a": "stopped",
        "stopped-b": "stopped",
        "failed-b": "failed",
        "done": "finished",
    }
    checkteam.CALLS.clear()


def rows(url: str) -> dict[str, tuple[object, ...]]:
    """Each run's status, head, message count, lease and last update."""
    with Store(url) as store:
        return {
            r.run_id: (r.status, r.head_seq, r.message_count, r.lease_owner, r.fencing_token, r.updated_at)
            for r in store.list_runs()
        }


def test_check_passes_the_unchanged_code_and_starts_no_agent(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_runs(store_url)
    before = rows(store_url)
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:make_team")
    assert (code, out) == (EXIT_OK, [])
    assert err == ["graphflow-durable: 3 runs checked, 0 problems"]  # the finished run left out
    # Each stored agent state was loaded once (3 agents x 3 runs); no agent ran or was reset.
    assert checkteam.CALLS == {"load_state": 9}
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:make_team", "done", "--json")
    assert (code, out, err) == (EXIT_OK, [], ["graphflow-durable: 1 runs checked, 0 problems"])
    assert checkteam.CALLS["on_messages"] == checkteam.CALLS["on_messages_stream"] == 0
    assert checkteam.CALLS["on_reset"] == 0

    assert rows(store_url) == before  # nothing was written: every run is where it was


def test_check_reports_an_extra_node_and_a_changed_edge(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_runs(store_url)
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:with_extra_node", "stopped-a")
    assert code == EXIT_DAMAGED
    assert out == [
        "stopped-a: graph: node 'D' is in the given graph but not in the stored run",
        "stopped-a: graph: node 'C': edge added "
        '{"activation":"all","condition":null,"group":"D","target":"D"}',
        "stopped-a: graph: participants ['A', 'B', 'C'] -> ['A', 'B', 'C', 'D']",
    ]
    assert err == ["graphflow-durable: 1 runs checked, 3 problems"]

    code, out, _ = check(capsys, store_url, "--team", f"{TEAM}:with_changed_edge", "--json")
    assert code == EXIT_DAMAGED
    rows = [json.loads(line) for line in out]
    assert {r["run_id"] for r in rows} == {"stopped-a", "stopped-b", "failed-b"}
    assert all(set(r) == {"run_id", "kind", "subject", "message"} for r in rows)
    assert {(r["kind"], r["subject"], r["message"]) for r in rows} == {
        (
            "graph",
            None,
            'node \'A\': edge added {"activation":"all","condition":null,"group":"C","target":"C"}',
        )
    }
    assert checkteam.CALLS["on_messages"] == checkteam.CALLS["on_messages_stream"] == 0


def test_check_reports_an_agent_whose_load_state_refuses_its_stored_state(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_runs(store_url)
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:with_new_agent")
    assert code == EXIT_DAMAGED
    assert out == [
        f"{run}: agent_state B: load_state raised ValueError: state of 'B' has no 'memory' "
        "(saved by an older version?)"
        for run in ("stopped-a", "stopped-b", "failed-b")
    ]
    assert err == ["graphflow-durable: 3 runs checked, 3 problems"]
    code, out, _ = check(capsys, store_url, "--team", f"{TEAM}:with_new_agent", "failed-b", "--json")
    assert [json.loads(line) for line in out] == [
        {
            "run_id": "failed-b",
            "kind": "agent_state",
            "subject": "B",
            "message": "load_state raised ValueError: state of 'B' has no 'memory' (saved by an older version?)",
        }
    ]
    assert checkteam.CALLS["on_messages"] == checkteam.CALLS["on_reset"] == 0


def test_check_reports_a_scheduler_replay_that_diverges_from_the_stored_run(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stopped after A, whose answer the condition sent to B; the new code sends it to C. The
    # conditions keep their names, so the graph's fingerprint cannot tell.
    asyncio.run(checkteam.rerouted("routed", store=store_url, max_turns=1).run(task="go"))
    code, out, _ = check(capsys, store_url, "--team", f"{TEAM}:rerouted")
    assert (code, out) == (EXIT_OK, [])
    checkteam.ROUTE = "C"
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:rerouted", "--json")
    assert code == EXIT_DAMAGED, err
    rows = [json.loads(line) for line in out]
    assert rows and all((r["run_id"], r["kind"]) == ("routed", "scheduler") for r in rows)
    assert "GFD203-ready-mismatch" in {r["subject"] for r in rows}, rows
    assert checkteam.CALLS["on_messages"] == 1  # A's one turn, when the run was made; none since


def test_check_refuses_a_bad_team_and_an_unknown_run_with_exit_2(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_runs(store_url)
    for team, words in (
        ("no_such_module_here:make_team", ["cannot import 'no_such_module_here'"]),
        (f"{TEAM}:no_such_factory", ["has no attribute 'no_such_factory'"]),
        ("make_team", ["expected MODULE:ATTRIBUTE"]),
        (f"{TEAM}:ROUTE", ["str is not callable"]),
        (f"{TEAM}:not_a_team", ["returned dict, expected a DurableGraphFlow"]),
        (f"{TEAM}:needs_more", ["cannot be called as factory(run_id, store=...)", "lease_owner"]),
    ):
        code, out, err = check(capsys, store_url, "--team", team)
        assert (code, out) == (EXIT_USAGE, []), (team, err)
        assert len(err) == 1 and err[0].startswith("graphflow-durable: "), err
        assert all(word in err[0] for word in words), err
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:make_team", "stopped-a", "nope")
    assert (code, out) == (EXIT_USAGE, [])
    assert err == [
        "graphflow-durable: run nope does not exist, nothing was changed; "
        "'graphflow-durable runs list' lists the runs"
    ]
    code, _, err = check(capsys, store_url)
    assert code == EXIT_USAGE and "--team" in err[0]
    assert checkteam.CALLS == {}


def test_check_with_an_unreachable_store_exits_1_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://alice:s3cr3t-pw@127.0.0.1:1/graphflow?connect_timeout=2"
    code, out, err = check(capsys, url, "--team", f"{TEAM}:make_team")
    assert (code, out) == (EXIT_ERROR, [])
    assert len(err) == 1 and err[0].startswith("graphflow-durable: "), err
    assert "s3cr3t" not in err[0] and "Traceback" not in err[0] and "alice:***@" in err[0]


def test_check_migrates_nothing_a_store_at_an_older_schema_is_refused_unchanged(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before a deploy the old workers still run on the old schema: the check must not move it.
    engines = open_engines(store_url)
    try:
        older = _migrations.MIGRATIONS[-2][0]
        _migrations.migrate(engines.write, url=engines.url, migrations=_migrations.MIGRATIONS[:-1])
        code, out, err = check(capsys, store_url, "--team", f"{TEAM}:make_team")
        with engines.read.connect() as conn:
            assert _migrations.current_version(conn) == older
    finally:
        engines.engine.dispose()
    assert (code, out) == (EXIT_USAGE, [])
    assert len(err) == 1 and f"has schema version {older}, older than" in err[0], err
    assert "opened without migrating it; nothing was changed" in err[0]
    assert check(capsys, store_url, "--team", f"{TEAM}:make_team", "--help")[0] == EXIT_OK
    with Store(store_url):  # any other opening migrates it, and then the check runs
        pass
    assert check(capsys, store_url, "--team", f"{TEAM}:make_team")[0] == EXIT_OK


def test_check_with_team_keys_checks_each_run_with_the_factory_of_its_key(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def go() -> None:
        with Store(store_url) as store:
            store.queue.submit("report-1", task="go", team="report")
            store.queue.submit("longer-1", task="go", team="longer")
        await checkteam.make_team("report-1", store=store_url, max_turns=1).run(task="go")
        await checkteam.with_extra_node("longer-1", store=store_url, max_turns=1).run(task="go")

    asyncio.run(go())
    report, longer = f"report={TEAM}:make_team", f"longer={TEAM}:with_extra_node"
    code, out, err = check(capsys, store_url, "--team", report)
    assert (code, out) == (EXIT_OK, [])
    assert err == ["graphflow-durable: 1 runs checked (1 of other teams left out), 0 problems"]
    code, out, err = check(capsys, store_url, "--team", report, "--team", longer)
    assert (code, out, err) == (EXIT_OK, [], ["graphflow-durable: 2 runs checked, 0 problems"])
    # One factory for every run: the other team's run is another graph.
    code, out, _ = check(capsys, store_url, "--team", f"{TEAM}:make_team")
    assert code == EXIT_DAMAGED and out and all(line.startswith("longer-1: graph: ") for line in out)
    code, out, err = check(capsys, store_url, "--team", report, "longer-1")
    assert (code, out) == (EXIT_USAGE, [])
    assert len(err) == 1 and "run longer-1 was not submitted with any --team KEY given (report)" in err[0]
    code, _, err = check(capsys, store_url, "--team", report, "--team", f"{TEAM}:make_team")
    assert code == EXIT_USAGE and "cannot be combined" in err[0]
    assert checkteam.CALLS["on_messages"] == 2  # the two turns that made the runs; none since


def test_check_with_nothing_resumable_still_builds_a_team_with_each_factory(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(checkteam.make_team("done", store=store_url).run(task="go"))  # finished: left out
    before = rows(store_url)
    checkteam.CALLS.clear()
    code, out, err = check(capsys, store_url, "--team", f"{TEAM}:make_team")
    assert (code, out, err) == (EXIT_OK, [], ["graphflow-durable: 0 runs checked, 0 problems"])
    for team in (f"{TEAM}:not_a_team", f"report={TEAM}:not_a_team"):
        code, out, err = check(capsys, store_url, "--team", team)
        assert (code, out) == (EXIT_USAGE, []), (team, err)
        assert len(err) == 1 and "returned dict, expected a DurableGraphFlow" in err[0], err
    assert checkteam.CALLS == {}  # the factory was called, no agent ran
    assert rows(store_url) == before  # and nothing was written
