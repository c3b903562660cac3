"""The run page's live events (Server-Sent Events) against a real uvicorn server, on SQLite and
PostgreSQL: a message committed after the browser connected arrives, the run's end arrives as a
state, a browser that leaves releases its follower; the followers of a run share one reader."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
import uvicorn

from agents import close_stores
from graphflow_durable.store import RunUpdate, Store
from graphflow_durable.ui import create_app, live
from integration.test_store import commit_text
from integration.test_store_admin import made


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with Store(store_url) as opened:
        yield opened


@pytest.fixture
def served(store: Store) -> Iterator[str]:
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
    assert server.started
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def followers(store: Store) -> int:
    return len(store._feeds._feeds)


def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, object]]]:
    """The stream's events as (kind, data)."""
    kind = "message"
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield kind, json.loads(line[6:])
            kind = "message"


def test_a_message_committed_after_connecting_arrives_and_leaving_releases_the_follower(
    store: Store, served: str
) -> None:
    token = made(store, "live")  # running: a driver holds it
    with (
        httpx.Client(timeout=20) as client,
        client.stream("GET", f"{served}/runs/live/events?after=0") as got,
    ):
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/event-stream")
        assert got.headers["content-security-policy"].startswith("default-src 'self'")
        wait_until(lambda: followers(store) == 1)  # the browser follows the run's feed
        commit_text(store, "live", 1, token, 1, text="<b>arrived</b>")
        kind, data = next(events(got.iter_lines()))
        assert kind == "message" and data["seq"] == 1 and data["text"] == "<b>arrived</b>"
    wait_until(lambda: followers(store) == 0, timeout=5)  # the disconnect closed the follower


def test_the_runs_end_arrives_as_a_state_event(store: Store, served: str) -> None:
    token = made(store, "ends")
    with (
        httpx.Client(timeout=20) as client,
        client.stream("GET", f"{served}/runs/ends/events?after=0") as got,
    ):
        wait_until(lambda: followers(store) == 1)
        update = RunUpdate(status="finished", release_lease=True)
        commit_text(store, "ends", 1, token, 1, text="last", update=update)
        seen = []
        for kind, data in events(got.iter_lines()):
            seen.append((kind, data.get("seq"), data.get("status")))
            if kind == "state":
                break
        assert seen == [("message", 1, None), ("state", None, "finished")]
    wait_until(lambda: followers(store) == 0, timeout=5)


def test_a_deleted_run_ends_its_stream_with_gone(store: Store, served: str) -> None:
    made(store, "doomed", status="interrupted")
    with httpx.Client(timeout=20) as client, client.stream("GET", f"{served}/runs/doomed/events") as got:
        stream = events(got.iter_lines())
        assert next(stream)[1]["seq"] == 0
        store.delete_run("doomed")
        assert next(k for k, _ in stream if k != "state") == "gone"


async def test_followers_of_a_run_share_one_reader_a_slow_one_catches_up_from_the_store_and_the_last_to_leave_stops_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "QUEUED", 2)  # a stream two batches behind reads the rest itself
    token = made(store, "busy")
    shared = live.Followers(store)

    def seqs(chunks: list[bytes]) -> list[int]:
        return [
            int(data["seq"])  # type: ignore[call-overload]
            for kind, data in events(iter(b"".join(chunks).decode().splitlines()))
            if kind == "message"
        ]

    async def upto(stream: AsyncIterator[bytes], seq: int) -> list[int]:
        got: list[bytes] = []
        while not seqs(got) or seqs(got)[-1] < seq:
            got.append(await asyncio.wait_for(anext(stream), 20))
        return seqs(got)

    fast, slow = shared.stream("busy", -1), shared.stream("busy", -1)
    assert await upto(fast, 0) == [0] and await upto(slow, 0) == [0]
    assert len(shared.readers) == 1
    await eventually(lambda: followers(store) == 1)  # one reader: one feed of the store
    for seq in range(1, 9):  # eight commits read one by one: eight batches, the slow one reads none
        await asyncio.to_thread(commit_text, store, "busy", seq, token, seq, text=f"m{seq}")
        assert (await upto(fast, seq))[-1] == seq
    reader = shared.readers["busy"]
    assert sum(s.behind for s in reader.streams) == 1  # the slow one was told to catch up
    assert await upto(slow, 8) == list(range(1, 9))  # from the store, each once, in order
    await asyncio.to_thread(commit_text, store, "busy", 9, token, 9, text="m9")
    assert await upto(slow, 9) == [9] and await upto(fast, 9) == [9]
    await fast.aclose()  # type: ignore[attr-defined]
    assert shared.readers == {"busy": reader} and len(reader.streams) == 1
    await slow.aclose()  # type: ignore[attr-defined]
    assert shared.readers == {}
    await eventually(lambda: followers(store) == 0)  # the reader's follow closed as its task ended
