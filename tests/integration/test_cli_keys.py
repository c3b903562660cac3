"""Every graphflow-durable command reads the store's keys from GRAPHFLOW_DURABLE_KEYS: a malformed
value is refused on one line (exit 2) that never shows the key material, and a sealed row the keys
cannot open names the key id it needs (exit 2)."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path

import pytest

from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE, main
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.store import Store
from graphflow_durable.worker import Worker

sys.path.insert(0, str(Path(__file__).parents[1] / "pool"))
from poolteam import team

K1 = os.urandom(32)
MATERIAL = base64.b64encode(os.urandom(32)).decode()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sealed_store(url: str, runs: int = 1) -> None:
    """A store whose runs are sealed with key k1 (K1), each finished by a worker."""
    os.environ["GFD_AGENT_DELAY"] = "0"
    with Store(url, codec=AESGCMCodec({"k1": K1})) as store:
        for i in range(runs):
            store.queue.submit(f"r{i}", task=f"the secret task {i}", team="t")
        asyncio.run(Worker(store, {"t": team}, poll_interval=0.01).run_until_idle())


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (f"k1={MATERIAL[:-4]}!!!!", "key 'k1' is not valid base64"),
        (f"k1={base64.b64encode(os.urandom(31)).decode()}", "key 'k1' is 31 bytes, not 32"),
        (f"k1={MATERIAL},k1={MATERIAL}", "key id 'k1' is listed twice"),
        (MATERIAL, "item 1 is not 'KEY_ID=<base64 of 32 bytes>'"),  # pasted without its id
        (f"{MATERIAL[:20]}+/x={MATERIAL}", "item 1 is not 'KEY_ID=<base64 of 32 bytes>'"),
    ],
    ids=["not-base64", "31-bytes", "duplicate-id", "no-id", "bad-id"],
)
@pytest.mark.parametrize(
    "command", [["runs", "list"], ["queues", "list"], ["limits", "list"], ["runs", "verify"]], ids=" ".join
)
def test_a_malformed_keys_variable_exits_2_on_one_line_without_the_key_material(
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    keys: str,
    named: str,
    command: list[str],
) -> None:
    Store(sqlite_url).close()
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", keys)
    code, out, err = _run(capsys, *command, "--store", sqlite_url)
    assert code == EXIT_USAGE
    assert out == ""
    assert err.count("\n") == 1 and named in err, err
    assert MATERIAL not in out + err and MATERIAL[:20] not in out + err


def test_the_worker_refuses_malformed_keys_before_it_imports_a_team(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k1={MATERIAL[:-8]}")
    code, out, err = _run(capsys, "worker", "--team", "no_such_module:team", "--store", sqlite_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert "key 'k1' is 27 bytes, not 32" in err and "no_such_module" not in err
    assert MATERIAL[:20] not in err


def test_every_command_opens_the_store_with_the_keys_of_the_environment(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed_store(store_url)
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k1={base64.b64encode(K1).decode()}")
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert code == EXIT_OK, err
    assert "the secret task 0" in out


def test_a_sealed_row_without_its_key_exits_2_naming_the_key_id(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed_store(store_url)
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1 and "key 'k1'" in err and "secret" not in err
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k2={base64.b64encode(os.urandom(32)).decode()}")
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1 and "key 'k1'" in err


def test_a_key_of_the_right_id_with_other_material_exits_2_as_the_wrong_key(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed_store(store_url)
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k1={MATERIAL}")
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1 and "key 'k1' is not the key" in err
    assert MATERIAL not in err


def test_the_migration_window_variable_lets_the_commands_read_plain_rows_with_keys_set(
    store_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    os.environ["GFD_AGENT_DELAY"] = "0"
    with Store(store_url) as store:  # written before the store was encrypted
        store.queue.submit("r0", task="the plain task", team="t")
        asyncio.run(Worker(store, {"t": team}, poll_interval=0.01).run_until_idle())
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", f"k1={base64.b64encode(K1).decode()}")
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert code != EXIT_OK and "plain text in a store opened with a codec" in err
    monkeypatch.setenv("GRAPHFLOW_DURABLE_ALLOW_PLAINTEXT", "1")
    code, out, err = _run(capsys, "runs", "transcript", "r0", "--store", store_url)
    assert code == EXIT_OK, err
    assert "the plain task" in out
