"""The console over a sealed store, on SQLite and PostgreSQL: opened with the keys it shows the
runs' text as usual; opened without them it still lists and shows the runs (ids, statuses and
times are plain; the content marked ``{"sealed": key id}``) but refuses every page, API answer, export and live stream that would show content with one
line naming the key id (403), never the stored ``gfd1:`` text and never a traceback."""

from __future__ import annotations

import asyncio
import base64
import html
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from autogen_agentchat.agents import UserProxyAgent
from autogen_agentchat.teams import DiGraphBuilder

from agents import Scripted, chain, close_stores, durable
from graphflow_durable import DurableGraphFlow
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE
from graphflow_durable.store import Store
from graphflow_durable.ui import create_app
from integration.test_cli_manage import cli, one_line_error
from integration.test_sealed_readers import KEY, SAID, TASK, codec

from .helpers import client
from .test_console_live import events

ASKED = "approve the refund of 42 EUR to Jane Roe?"


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
async def sealed(store_url: str) -> str:
    """Two runs written through the codec: ``done`` (A -> B, finished) and ``asks`` (waiting for a
    person, its prompt quoting the task)."""
    with Store(store_url, codec=codec()) as store:
        a, b = Scripted("A", [SAID]), Scripted("B")
        await durable([a, b], chain(a, b), store, "done").run(task=TASK)
        c, h = Scripted("C"), UserProxyAgent("H", input_func=lambda prompt: "never asked")
        graph = DiGraphBuilder().add_node(c).add_node(h).add_edge(c, h).build()
        await DurableGraphFlow([c, h], graph, store=store, run_id="asks", human_input="wait").run(task=ASKED)
    return store_url


def no_ciphertext(text: str) -> None:
    assert "gfd1:" not in text, text[:2000]
    assert "Traceback" not in text


def refused(response: httpx.Response) -> str:
    """The one line of a refusal for want of the key (page or JSON)."""
    assert response.status_code == 403, (response.status_code, response.text[:2000])
    no_ciphertext(response.text)
    if response.headers["content-type"].startswith("application/json"):
        line = str(response.json()["error"])
    else:
        found = re.search(r'data-error-page="403">([^<]*)<', response.text)
        assert found is not None, response.text[:2000]
        line = html.unescape(found.group(1))
    assert "\n" not in line and "'k1'" in line and "GRAPHFLOW_DURABLE_KEYS" in line, line
    assert TASK not in response.text and SAID not in response.text
    return line


async def test_with_the_keys_the_pages_and_the_api_show_the_real_text(sealed: str) -> None:
    with Store(sealed, codec=codec()) as store:
        c = client(store)
        page = c.get("/runs/done")
        assert page.status_code == 200 and TASK in page.text and SAID in page.text
        no_ciphertext(page.text)
        assert c.get("/api/runs/done/transcript").json()[0]["message"]["content"] == TASK
        assert c.get("/runs/done/export").status_code == 200
        inbox = c.get("/inbox")
        assert inbox.status_code == 200 and 'data-run-id="asks"' in inbox.text
        for path in ("/", "/inbox", "/runs/asks", "/api/runs", "/api/inbox", "/api/runs/done/history"):
            no_ciphertext(c.get(path).text)


async def test_without_the_keys_every_page_with_content_is_refused_naming_the_key(sealed: str) -> None:
    with Store(sealed) as keyless:
        c = client(keyless)
        stats = c.get("/stats")
        assert stats.status_code == 200 and 'data-stat="queue-depth"' in stats.text
        no_ciphertext(stats.text)
        for path in ("/", "/api/runs"):  # the runs are listed: their content is marked, not shown
            listed = c.get(path)
            assert listed.status_code == 200, listed.text[:2000]
            no_ciphertext(listed.text)
            assert "done" in listed.text and "asks" in listed.text and TASK not in listed.text
        rows = {row["run_id"]: row for row in c.get("/api/runs").json()["runs"]}
        assert rows["done"]["status"] == "finished" and rows["done"]["content"] == {"sealed": "k1"}
        assert rows["asks"]["status"] == "waiting"
        shown = c.get("/api/runs/done")  # the run's plain fields, as `runs show --json`
        assert shown.status_code == 200 and shown.json()["content"] == {"sealed": "k1"}
        no_ciphertext(shown.text)
        for path in ("/runs/done", "/runs/asks", "/inbox", "/api/runs/done/transcript"):
            refused(c.get(path))
        assert "'k1'" in c.get("/api/inbox").json()["error"]
        exported = c.get("/runs/done/export")  # as `runs export`: the rows as stored, sealed
        if exported.status_code == 200:
            assert TASK not in exported.text and SAID not in exported.text
        else:
            refused(exported)


def test_without_the_keys_an_answer_is_refused_in_one_line_and_the_request_stays_open(
    sealed: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console without the keys offers no answer box (its inbox is refused); ``runs respond``
    from a shell without them writes no plain answer into the sealed run."""
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    code, out, err = cli(capsys, sealed, "respond", "asks", "approved")
    assert (code, out) == (EXIT_USAGE, [])
    one_line_error(err, "sealed", "GRAPHFLOW_DURABLE_KEYS")
    with Store(sealed, codec=codec()) as store:
        run = store.get_run("asks")
        assert run is not None and run.status == "waiting"
        (request,) = store.pending_requests("asks")
        assert request.answer is None
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", "k1=" + base64.b64encode(KEY).decode())
    code, out, err = cli(capsys, sealed, "respond", "asks", "approved")
    assert code == EXIT_OK, err


@contextmanager
def serve(store: Store) -> Iterator[str]:
    """The console over ``store``, served by uvicorn in a thread; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(store), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


async def test_the_live_stream_gives_the_text_with_the_keys_and_is_refused_without(sealed: str) -> None:
    with (
        Store(sealed, codec=codec()) as store,
        serve(store) as url,
        httpx.Client(timeout=20) as http,
        http.stream("GET", f"{url}/runs/done/events?after=0") as got,
    ):
        kind, data = next(events(got.iter_lines()))
        assert kind == "message" and SAID in str(data["text"])
    with Store(sealed) as keyless, serve(keyless) as url, httpx.Client(timeout=20) as http:
        got = http.get(f"{url}/runs/done/events?after=0")
        refused(got)


async def test_a_moved_ciphertext_ends_the_live_stream_with_a_refusal_naming_the_row(sealed: str) -> None:
    """A message whose sealed body was copied from another message does not open: the stream
    sends one ``refused`` event naming the row (after what it could read before it) and ends; it
    does not retry the same read every second in silence."""
    engine = sa.create_engine(sealed)
    with engine.begin() as conn:
        (body,) = conn.execute(
            sa.text("SELECT body FROM graphflow_messages WHERE run_id = 'done' AND seq = 1")
        ).one()
        conn.execute(
            sa.text("UPDATE graphflow_messages SET body = :b WHERE run_id = 'done' AND seq = 2"), {"b": body}
        )
    engine.dispose()
    with Store(sealed, codec=codec()) as store, serve(store) as url, httpx.Client(timeout=20) as http:
        started = time.monotonic()
        with http.stream("GET", f"{url}/runs/done/events?after=-1") as got:
            seen = list(events(got.iter_lines()))  # the stream ends after its refusal
        assert time.monotonic() - started < 10
    *before, (last, refusal) = seen
    assert last == "refused" and all(kind == "message" and data["seq"] < 2 for kind, data in before), seen
    line = str(refusal["error"])
    assert "graphflow_messages" in line and "done" in line and " 2 " in line and "\n" not in line
    assert "gfd1:" not in line and SAID not in line


def test_the_ui_command_opens_the_store_with_the_keys_of_its_environment(tmp_path: Path) -> None:
    """``graphflow-durable ui`` reads ``GRAPHFLOW_DURABLE_KEYS`` as every command does: started with
    them it shows a sealed run's text, started without them it refuses it naming the key."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with Store(url, codec=codec()) as store:
        a, b = Scripted("A", [SAID]), Scripted("B")
        asyncio.run(durable([a, b], chain(a, b), store, "done").run(task=TASK))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHFLOW_DURABLE_")}
    for keys in (True, False):
        given = {**env, "GRAPHFLOW_DURABLE_KEYS": "k1=" + base64.b64encode(KEY).decode()} if keys else env
        command = [sys.executable, "-m", "graphflow_durable.cli.runs", "ui", "--store", url, "--port", "0"]
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=given
        ) as ui:
            address = ui.stdout.readline().split(": ", 1)[1].strip()  # type: ignore[union-attr]
            page = httpx.get(address + "runs/done", timeout=10)
            ui.send_signal(signal.SIGTERM)
            assert ui.wait(15) == 0
        if keys:
            assert page.status_code == 200 and SAID in page.text
            no_ciphertext(page.text)
        else:
            refused(page)
