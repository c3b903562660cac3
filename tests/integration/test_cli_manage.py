"""``graphflow-durable runs show|cancel|retry|delete|prune|stats`` on SQLite and PostgreSQL: what they
print (text and ``--json``), their exit codes, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, fail_once
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.cli.runs import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, main
from graphflow_durable.store import Store

from .test_store_admin import age, made


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
def raw(store_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    yield engine
    engine.dispose()


def cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, list[str], list[str]]:
    """Run ``graphflow-durable runs ARGS --store URL``: exit code, stdout lines, stderr lines."""
    capsys.readouterr()
    code = main(["runs", *args, "--store", url])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


def one_line_error(err: list[str], *words: str) -> None:
    assert len(err) == 1 and err[0].startswith("graphflow-durable: "), err
    for word in words:
        assert word in err[0], err[0]


async def test_show_prints_status_round_head_lease_and_last_error(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = [Scripted("A"), Scripted("B", before=fail_once())]
    team = durable(agents, chain(*agents), store_url, "run-1")
    with pytest.raises(RuntimeError):
        await team.run(task="go")
    team.store.queue.record_failure("run-1", error="Boom: B crashed on purpose", retry_at=0)
    code, out, err = cli(capsys, store_url, "show", "run-1")
    assert (code, err) == (EXIT_OK, [])
    shown = dict((line[:11].strip(), line[12:]) for line in out)
    assert shown["run"] == "run-1" and shown["status"] == "failed" and shown["round"] == "1"
    assert shown["head"].startswith("4 (interrupt at 20") and shown["messages"] == "2"
    assert shown["lease"] == "-" and shown["last error"] == "Boom: B crashed on purpose"
    assert shown["attempts"] == "1"
    code, out, _ = cli(capsys, store_url, "show", "run-1", "--json")
    data = json.loads(out[0])
    assert (data["status"], data["round"], data["head"], data["lease_owner"]) == ("failed", 1, 4, None)
    assert data["head_step"]["kind"] == "interrupt" and data["last_error"].startswith("Boom")

    await team.run()
    code, out, _ = cli(capsys, store_url, "show", "run-1", "--json")
    assert json.loads(out[0])["status"] == "finished"


def test_show_of_a_held_run_names_its_driver_and_expiry(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("run-1", graph_fingerprint="f", graph={}, owner="worker-7", lease_seconds=60)
        )
        store.cancel_run("run-1")
    code, out, _ = cli(capsys, store_url, "show", "run-1")
    lease = next(line for line in out if line.startswith("lease"))
    assert code == EXIT_OK and "worker-7 (pid" in lease and "held, until 20" in lease
    assert next(line for line in out if line.startswith("cancel")).split()[1] == "requested"


def test_show_of_a_nested_run_prints_its_parent_and_of_a_top_level_run_no_parent_line(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        made(store, "outer", status="finished")
        made(store, "outer/T/2/inner", status="finished", parent="outer")
    code, out, _ = cli(capsys, store_url, "show", "outer/T/2/inner")
    assert code == EXIT_OK and out[:2] == ["run         outer/T/2/inner", "parent      outer"]
    code, out, _ = cli(capsys, store_url, "show", "outer")
    assert code == EXIT_OK and out[1] == "status      finished"
    assert not any(line.startswith("parent") for line in out)
    code, out, _ = cli(capsys, store_url, "show", "outer/T/2/inner", "--json")
    assert json.loads(out[0])["parent_run_id"] == "outer"


def test_show_of_a_submission_not_started_yet_says_it_waits_for_a_worker_serving_its_team(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    waits = (
        "a worker serving team report (started with --team report=module:factory); none holds a claim on it"
    )
    with Store(store_url) as store:
        store.queue.submit("sub-1", task="go", team="report")
    code, out, _ = cli(capsys, store_url, "show", "sub-1")
    assert code == EXIT_OK and out[:3] == ["run         sub-1", "status      submitted", "team        report"]
    assert f"waiting for {waits}" in out
    code, out, _ = cli(capsys, store_url, "show", "sub-1", "--json")
    assert json.loads(out[0]) == {
        "run_id": "sub-1",
        "status": "submitted",
        "team": "report",
        "attempts": 0,
        "last_error": None,
        "queue": "default",
        "priority": 0,
        "partition": None,
        "not_before": None,
        "not_starting": None,
        "waiting_for": waits,
    }
    with Store(store_url) as store:
        store.queue.submit("sub-2", task="go", team=None)
        claim = store.queue.claim("worker-9", lease_seconds=60, teams=["report"])
        assert claim is not None and claim.run_id == "sub-1"
    code, out, _ = cli(capsys, store_url, "show", "sub-2", "--json")
    assert json.loads(out[0])["waiting_for"] == (
        "a worker started with --team module:factory (a submission with no team key)"
    )
    code, out, _ = cli(capsys, store_url, "show", "sub-1", "--json")
    assert json.loads(out[0])["waiting_for"].startswith("worker worker-9, which claimed it (until 20")


def test_runs_list_keeps_its_columns_aligned_with_a_long_run_id_and_json_keeps_it_whole(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    long_id = "nightly-report/" + "x" * 70
    with Store(store_url) as store:
        made(store, "r1", status="finished")
        made(store, long_id, status="interrupted")
        store.queue.submit("sub-" + "y" * 40, task="go", team="a-team-with-a-long-key")
    code, out, _ = cli(capsys, store_url, "list")
    assert code == EXIT_OK and len(out) == 4
    header, *rows = out
    for column in ("STATUS", "TEAM", "HEAD", "LEASE"):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows if column != "HEAD"), (column, out)
    assert [row.split()[0] for row in rows] == ["r1", long_id, "sub-" + "y" * 40]
    assert {row[header.index("STATUS") :].split()[0] for row in rows} == {
        "finished",
        "interrupted",
        "submitted",
    }
    code, out, _ = cli(capsys, store_url, "list", "--json")
    assert {json.loads(line)["run_id"] for line in out} == {"r1", long_id, "sub-" + "y" * 40}


@pytest.mark.parametrize(
    "command", ["show", "cancel", "retry", "delete", "verify", "history", "transcript", "export"]
)
def test_a_command_on_an_unknown_run_fails_on_one_line_with_exit_2(
    store_url: str, store: Store, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, err = cli(capsys, store_url, command, "nope")  # in a store that exists
    assert (code, out) == (EXIT_USAGE, [])
    one_line_error(err, "run nope does not exist", "runs list")


def test_cancel_requests_a_held_run_cancels_a_free_one_and_refuses_a_finished_one(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("held", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=60)
        )
        made(store, "free", status="interrupted")
        made(store, "done", status="finished")
    code, out, _ = cli(capsys, store_url, "cancel", "held")
    assert code == EXIT_OK and out[0].startswith(
        "run held: cancel requested; its driver worker-1 (lease until"
    )
    code, out, _ = cli(capsys, store_url, "cancel", "free", "--json")
    assert code == EXIT_OK and json.loads(out[0])["outcome"] == "cancelled"
    code, out, _ = cli(capsys, store_url, "cancel", "free")
    assert out == ["run free: already cancelled"]
    code, out, err = cli(capsys, store_url, "cancel", "done")
    assert (code, out) == (EXIT_REFUSED, [])
    one_line_error(err, "run done is finished", "nothing to cancel")


def test_retry_queues_a_cancelled_run_again_and_refuses_a_held_one(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        made(store, "run-1", status="interrupted")
        store.cancel_run("run-1")
        store._driver.create_run(
            CreateRequest("held", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=60)
        )
    code, out, _ = cli(capsys, store_url, "retry", "run-1")
    assert code == EXIT_OK
    assert out == [
        "run run-1: queued again, interrupted (was cancelled); a worker started with --team module:factory "
        "or the next run() resumes it"
    ]
    code, out, err = cli(capsys, store_url, "retry", "held", "--json")
    assert (code, out) == (EXIT_REFUSED, [])
    one_line_error(err, "run held is being driven by worker-1")


def test_delete_refuses_a_running_run_without_force_and_deletes_with_it(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("live", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=60)
        )
        made(store, "done", status="finished")
        made(store, "done/A/2/inner", status="finished", parent="done")
    code, out, err = cli(capsys, store_url, "delete", "live")
    assert (code, out) == (EXIT_REFUSED, [])
    one_line_error(err, "run live was not deleted: it is running", "--force")
    code, out, _ = cli(capsys, store_url, "delete", "live", "--force")
    assert code == EXIT_OK and out == [
        "run live: deleted rows: 0 agent states, 0 messages, 0 steps, 0 input requests, 0 call records, 0 queue, 1 runs"
    ]
    code, out, _ = cli(capsys, store_url, "delete", "done", "--dry-run")
    assert out == [
        "run done and 1 nested runs: would delete rows: 2 agent states, 2 messages, 2 steps, 0 input requests, 0 call records, 0 queue, 2 runs"
    ]
    code, out, _ = cli(capsys, store_url, "delete", "done", "--json")
    data = json.loads(out[0])
    assert data["run_ids"] == ["done", "done/A/2/inner"] and data["rows"]["graphflow_runs"] == 2
    with Store(store_url) as store:
        assert store.list_runs() == []


def test_prune_dry_run_lists_then_prune_deletes_and_nothing_to_do_is_not_an_error(
    store_url: str, raw: sa.Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        made(store, "old", status="finished")
        made(store, "new", status="finished")
    age(raw, "old", 31)
    code, out, _ = cli(capsys, store_url, "prune", "--status", "finished", "--older-than", "30d", "--dry-run")
    assert code == EXIT_OK and out == [
        "would prune 1 finished runs last updated more than 30d ago (old); rows: 1 agent states, 1 messages, "
        "1 steps, 0 input requests, 0 call records, 0 queue, 1 runs"
    ]
    code, out, _ = cli(capsys, store_url, "prune", "--older-than", "30d", "--json")
    assert json.loads(out[0]) == {
        "dry_run": False,
        "rows": {
            "graphflow_agent_states": 1,
            "graphflow_call_records": 0,
            "graphflow_input_requests": 0,
            "graphflow_messages": 1,
            "graphflow_queue": 0,
            "graphflow_runs": 1,
            "graphflow_steps": 1,
        },
        "run_ids": ["old"],
        "skipped": [],
    }
    code, out, _ = cli(capsys, store_url, "prune", "--older-than", "30d")
    assert (code, out) == (EXIT_OK, ["nothing to prune: no finished runs last updated more than 30d ago"])
    with Store(store_url) as store:
        assert [r.run_id for r in store.list_runs()] == ["new"]


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--older-than", "30x"], EXIT_USAGE, ["'30x' is not an age", "30d"]),
        (["--older-than", "1d", "--status", "done"], EXIT_USAGE, ["invalid choice: 'done'"]),
        ([], EXIT_USAGE, ["--older-than"]),
        (["--older-than", "1d", "--status", "running"], EXIT_REFUSED, ["running runs", "--force"]),
    ],
)
def test_prune_bad_input_fails_on_one_line(
    store_url: str,
    store: Store,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    words: list[str],
) -> None:
    got, out, err = cli(capsys, store_url, "prune", *args)  # in a store that exists
    assert (got, out) == (code, [])
    one_line_error(err, *words)


def test_stats_prints_runs_per_status_and_rows_and_bytes_per_table(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(store_url) as store:
        made(store, "a", status="finished")
        made(store, "b", status="failed")
    code, out, _ = cli(capsys, store_url, "stats")
    assert code == EXIT_OK and out[0] == "runs: 2 (failed 1, finished 1); submissions waiting: 0"
    assert out[1].split() == ["TABLE", "ROWS", "BYTES"]
    table = {line.split()[0]: line.split()[1:] for line in out[2:]}
    assert table["graphflow_runs"][0] == "2" and int(table["graphflow_runs"][1]) > 0
    code, out, _ = cli(capsys, store_url, "stats", "--json")
    assert json.loads(out[0])["runs"]["finished"] == 1


def test_the_installed_command_prints_no_traceback_for_a_refusal(store_url: str) -> None:
    with Store(store_url) as store:
        store._driver.create_run(
            CreateRequest("live", graph_fingerprint="f", graph={}, owner="worker-1", lease_seconds=60)
        )
    done = subprocess.run(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "runs", "delete", "live", "--store", store_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (EXIT_REFUSED, "")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


async def test_show_of_a_waiting_run_prints_what_it_waits_for(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    from autogen_agentchat.agents import UserProxyAgent
    from autogen_agentchat.teams import DiGraphBuilder

    from graphflow_durable import DurableGraphFlow

    a, h = Scripted("A"), UserProxyAgent("H", input_func=lambda prompt: "typed")
    graph = DiGraphBuilder().add_node(a).add_node(h).add_edge(a, h).build()
    team = DurableGraphFlow([a, h], graph, store=store_url, run_id="asks", human_input="wait")
    await team.run(task="go")
    code, out, _ = cli(capsys, store_url, "show", "asks")
    assert code == EXIT_OK
    assert ("status", "waiting") in [tuple(line.split(None, 1)) for line in out if " " in line]
    waits = [line for line in out if line.startswith("waits for")]
    assert len(waits) == 1 and "H asks" in waits[0]
    code, out, _ = cli(capsys, store_url, "show", "asks", "--json")
    shown = json.loads(out[0])
    assert code == EXIT_OK and [r["node"] for r in shown["pending"]] == ["H"]
    with Store(store_url) as store:
        store.respond("asks", "later")
    code, out, _ = cli(capsys, store_url, "show", "asks")
    assert not [line for line in out if line.startswith("waits for")]
