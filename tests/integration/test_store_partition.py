"""A network partition is a clear StoreError within seconds, never a hang.

A real PostgreSQL is reached through a local proxy (``tests/netproxy.py``) that can drop every
byte both ways while keeping the connections open, as a partition behind a proxy or pooler looks.
The store's connect timeout and its bound on each wait for the server's answer turn it into a
:class:`StoreError` naming the store and the action; the run stays resumable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from agents import Scripted, chain, close_stores, durable, stored_transcript
from graphflow_durable._storage.driver import CreateRequest
from graphflow_durable.errors import StoreConfigError, StoreError
from graphflow_durable.store import Store
from netproxy import NetProxy

pytestmark = pytest.mark.postgres

#: Every case must end within this many seconds instead of hanging.
BOUND = 30.0
_T = TypeVar("_T")


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
def proxy(postgres_database: str) -> Iterator[NetProxy]:
    url = sa.make_url(postgres_database)
    with NetProxy(url.host or "127.0.0.1", url.port or 5432) as running:
        yield running


def _via(proxy: NetProxy, url: str, **options: str) -> str:
    """``url`` through the proxy, with a password the server does not need (trust) and ``options``."""
    parsed = sa.make_url(url).set(host="127.0.0.1", port=proxy.port, password="s3cr3t-pw")
    return parsed.update_query_dict(options).render_as_string(hide_password=False)


def _within(seconds: float, call: Callable[[], _T]) -> tuple[_T | BaseException, float]:
    """Run ``call`` in a thread; its result or error and the time it took. Fails the test if it
    has not returned within ``seconds`` (the thread is left behind, as a hang would be)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    started = time.monotonic()
    future = pool.submit(call)
    pool.shutdown(wait=False)
    try:
        outcome: _T | BaseException = future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"still blocked after {seconds} s: the partition hangs the caller")
    except BaseException as exc:
        outcome = exc
    return outcome, time.monotonic() - started


def _one_clear_line(error: BaseException, action: str) -> str:
    message = str(error)
    assert isinstance(error, StoreError) and not isinstance(error, StoreConfigError), repr(error)
    assert "\n" not in message and "s3cr3t-pw" not in message, message
    assert action in message and "127.0.0.1:" in message and "***" in message, message
    return message


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_opening_a_store_through_a_partition_is_a_store_error_within_the_connect_timeout(
    proxy: NetProxy, postgres_database: str
) -> None:
    proxy.blackhole()  # the TCP connection is accepted; the server never answers
    outcome, took = _within(BOUND, lambda: Store(_via(proxy, postgres_database)))
    message = _one_clear_line(outcome, "opening the store")  # type: ignore[arg-type]
    assert "timeout" in message.lower(), message
    assert took >= 4.0, took  # the default connect_timeout (5 s) ended it, not a refused connection
    print(f"opening through a partition failed after {took:.1f} s: {message}")


def test_the_network_defaults_and_server_timeouts_are_in_effect_and_overridable(
    postgres_database: str,
) -> None:
    with Store(postgres_database) as store:
        with store._e.engine.connect() as conn:
            shown = {
                name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("statement_timeout", "lock_timeout")
            }
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert shown == {"statement_timeout": "15s", "lock_timeout": "10s"}
        assert store.config_url == sa.make_url(postgres_database).render_as_string(hide_password=False)
    assert params["tcp_user_timeout"] == "10000" and params["keepalives"] == "1"
    assert params["connect_timeout"] == "5" and params["keepalives_idle"] == "5"
    url = sa.make_url(postgres_database).update_query_dict(
        {"statement_timeout": "0", "lock_timeout": "2.5", "tcp_user_timeout": "3000"}
    )
    with Store(url.render_as_string(hide_password=False)) as store:
        with store._e.engine.connect() as conn:
            shown = {
                name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("statement_timeout", "lock_timeout")
            }
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert shown == {"statement_timeout": "0", "lock_timeout": "2500ms"}
        assert "statement_timeout=0" in store.config_url and "lock_timeout=2.5" in store.config_url
    assert params["tcp_user_timeout"] == "3000"
    with pytest.raises(StoreConfigError, match="statement_timeout in the libpq options"):
        Store(
            url.update_query_dict({"options": "-c statement_timeout=0"}).render_as_string(hide_password=False)
        )


def _team(url: str, run_id: str, calls: list[str], before: Any = None, **kwargs: Any) -> Any:
    agents = [Scripted(n, calls=calls, before=before if n == "B" else None) for n in "ABC"]
    return durable(agents, chain(*agents), url, run_id, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(120)  # a commit blocking the event loop would escape asyncio.wait_for
async def test_a_partition_mid_run_is_a_store_error_and_the_run_resumes_once_healed(
    proxy: NetProxy, postgres_database: str
) -> None:
    # Short bounds for a quick test: the server cancels a statement after 1 s, the client gives a
    # silent server up 5 s later; a new connection waits 2 s.
    url = _via(proxy, postgres_database, statement_timeout="1", connect_timeout="2")
    lease = 3.0
    reference = _team(postgres_database, "reference", [])
    await reference.run(task="go")
    expected = stored_transcript(reference)

    async def partition(agent: Scripted, messages: Sequence[Any]) -> None:
        proxy.blackhole()  # B answers into a partition: its commit cannot reach the server

    calls: list[str] = []
    team = _team(url, "partitioned", calls, partition, lease_seconds=lease)
    started = time.monotonic()
    with pytest.raises(StoreError) as raised:
        await asyncio.wait_for(team.run(task="go"), BOUND)
    took = time.monotonic() - started
    message = _one_clear_line(raised.value, "partitioned")
    assert calls == ["A", "B"]
    print(f"run() failed {took:.1f} s after it started: {message}")
    proxy.heal()
    await asyncio.sleep(lease + 0.5)  # the lost driver's lease expires (it could not release it)
    calls2: list[str] = []
    again = _team(url, "partitioned", calls2, lease_seconds=lease, lease_owner="next")
    await asyncio.wait_for(again.run(), BOUND)
    assert calls2 == ["B", "C"]  # A's completion was committed: not re-run
    transcript = stored_transcript(again)
    assert [s for s, _ in transcript] == ["user", "A", "B", "C"]
    assert [(s, c.replace("partitioned", "reference")) for s, c in transcript] == expected


def test_a_row_lock_held_past_lock_timeout_is_a_store_error_not_a_wait(postgres_database: str) -> None:
    url = sa.make_url(postgres_database).update_query_dict({"lock_timeout": "0.5"})
    with Store(url.render_as_string(hide_password=False)) as store:
        store._driver.create_run(
            CreateRequest("locked", graph_fingerprint="f", graph={}, owner="first", lease_seconds=0.01)
        )
        holder = sa.create_engine(postgres_database)
        try:
            with holder.begin() as conn:  # another session holds the run's row
                conn.exec_driver_sql("SELECT 1 FROM graphflow_runs WHERE run_id = 'locked' FOR UPDATE")
                outcome, took = _within(
                    BOUND, lambda: store._driver.acquire_lease("locked", "second", lease_seconds=5)
                )
        finally:
            holder.dispose()
    assert isinstance(outcome, StoreError), repr(outcome)
    assert "\n" not in str(outcome) and "lock timeout" in str(outcome), str(outcome)
    assert took < 5.0, took  # 0.5 s, not the holder's whole transaction


@pytest.mark.slow
def test_workers_opening_a_new_store_at_once_wait_for_the_migration_past_lock_timeout(
    postgres_database: str,
) -> None:
    """The migration waits on its advisory lock without the store's lock_timeout: six stores
    opened at once on an empty database all open, although each waits far longer than 1 ms."""
    url = sa.make_url(postgres_database).update_query_dict({"lock_timeout": "0.001"})
    text = url.render_as_string(hide_password=False)
    barrier = threading.Barrier(6)
    versions: list[int] = []
    errors: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            with Store(text) as store:
                versions.append(store.schema_version())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    assert not errors, errors
    assert len(versions) == 6 and len(set(versions)) == 1


_DROPPED_PACKETS = r"""
import fcntl, socket, struct, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from graphflow_durable.errors import StoreError
from graphflow_durable.store import Store
from pgcluster import PgCluster

ifreq = fcntl.ioctl(socket.socket(), 0x8913, struct.pack("16sH", b"lo", 0))  # SIOCGIFFLAGS
flags = struct.unpack("16sH", ifreq)[1]
fcntl.ioctl(socket.socket(), 0x8914, struct.pack("16sH", b"lo", flags | 1))  # lo up
cluster = PgCluster.start()
try:
    store = Store(cluster.url)
    store.list_runs()  # a pooled connection
    # The partition: every packet to 127.0.0.0/8 is dropped (a blackhole route); no RST, no FIN.
    subprocess.run(
        "ip route del local 127.0.0.0/8 dev lo table local; ip route del local 127.0.0.1 dev lo table local; "
        "ip route add blackhole 127.0.0.0/8 table local", shell=True, check=True)
    started = time.monotonic()
    try:
        store.list_runs()
        print("no error")
    except StoreError as exc:
        print(f"{time.monotonic() - started:.1f} {exc}")
finally:
    subprocess.run(
        "ip route del blackhole 127.0.0.0/8 table local; ip route add local 127.0.0.0/8 dev lo table local",
        shell=True, check=False)
    cluster.stop()
"""


@pytest.mark.slow
def test_dropped_packets_end_an_operation_on_a_pooled_connection_within_tcp_user_timeout() -> None:
    """A real partition: in a network namespace of its own (root), the route to a real PostgreSQL
    server becomes a blackhole under a pooled connection. The pool's pre-ping is sent into it and
    ``tcp_user_timeout`` (10 s) ends it, before the 20 s answer bound."""
    tests = str(Path(__file__).parent.parent)
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0 or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip (a network namespace of its own)")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", _DROPPED_PACKETS, tests],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if "ClusterUnavailable" in done.stderr:
        pytest.skip("PostgreSQL not available")
    assert done.returncode == 0, done.stderr[-2000:]
    took, message = done.stdout.strip().split(" ", 1)
    assert "listing runs failed on postgresql+psycopg://" in message and "\n" not in message
    assert 8.0 <= float(took) < 18.0, done.stdout  # tcp_user_timeout, not a hang, not the answer bound
    print(f"dropped packets: the operation failed after {took} s: {message}")
