"""A run id that is empty or white space is refused, never replaced by
a random one; bad command-line input exits 2 with one line on stderr and no traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import Scripted, chain, close_stores, durable
from graphflow_durable import DurableGraphFlow, Store, UsageError


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


# --- run ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["", " ", "\t\n", " r1", "r1 ", "a\nb", "a\x00b", "x" * 501])
def test_an_empty_blank_or_unprintable_run_id_is_refused_saying_what_is_allowed(run_id: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    with pytest.raises(UsageError, match="a run id is 1 to 500 printable characters") as raised:
        DurableGraphFlow(agents, chain(*agents), store="sqlite://", run_id=run_id)  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    assert raised.value.option == "run_id"


@pytest.mark.parametrize("run_id", ["r1", "run-1", "outer/B/3/inner team", "ünïcode:42", "x" * 500])
async def test_printable_run_ids_with_inner_spaces_and_slashes_are_kept(store_url: str, run_id: str) -> None:
    agents = [Scripted(n) for n in "AB"]
    team = durable(agents, chain(*agents), store_url, run_id)
    assert team.run_id == run_id
    await team.run(task="go")
    assert team.store.get_run(run_id) is not None


def test_the_work_queue_refuses_a_blank_run_id(store_url: str) -> None:
    with Store(store_url) as store:
        with pytest.raises(UsageError, match="is only white space"):
            store.queue.submit("   ", task="t", team=None)
        assert store.queue.list_submissions() == []


# --- the command line, run as a real process ------------------------------------------------------


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"graphflow_durable.cli.{module}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _refused(done: subprocess.CompletedProcess[str], prog: str, says: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    assert done.stderr.startswith(f"{prog}: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("runs", "list", "--store", ""), "--store was given an empty value"),
        (("--store", "  ", "runs", "list"), "--store was given an empty value"),
        (("submit", "--store", "{url}", "", "task"), "RUN_ID '' is empty"),
        (("submit", "--store", "{url}", " ", "task"), "RUN_ID ' ' is only white space"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--lease-seconds", "-1"), "lease_seconds must be"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--lease-seconds", "0"), "lease_seconds must be"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--poll-interval", "-1"), "poll_interval must be"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--poll-interval", "0"), "poll_interval must be"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--grace-seconds", "-1"), "grace_seconds must be"),
        (
            ("worker", "--store", "{url}", "--team", "t=x:y", "--lease-seconds", "nan"),
            "lease_seconds must be",
        ),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--concurrency", "0"), "concurrency must be"),
        (("worker", "--store", "{url}", "--team", "t=x:y", "--concurrency", "x"), "invalid int value: 'x'"),
        (("nonsense",), "invalid choice: 'nonsense'"),
    ],
)
def test_graphflow_durable_refuses_bad_input_with_exit_2_and_one_line(
    sqlite_url: str, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    done = _cli("runs", *(a.replace("{url}", sqlite_url) for a in args), cwd=tmp_path)
    _refused(done, "graphflow-durable", says)
    assert not (tmp_path / ".graphflow_durable").exists(), "the default store must not be used"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("",), "STATE was given an empty value"),
        (("{state}", "--graph", ""), "--graph was given an empty value"),
        (("{state}", "--team", ""), "--team was given an empty value"),
        (("{state}", "--graph", "{state}", "-o", ""), "--output was given an empty value"),
        (("{state}", "--bogus"), "unrecognized arguments: --bogus"),
        ((), "the following arguments are required"),
    ],
)
def test_graphflow_repair_refuses_bad_input_with_exit_2_and_one_line(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"agent_states": {}}')
    done = _cli("repair", *(a.replace("{state}", str(state)) for a in args), cwd=tmp_path)
    _refused(done, "graphflow-repair", says)
