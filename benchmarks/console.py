"""The run console on a big store: page times, what live followers cost a driver, its memory.

    python benchmarks/console.py                                 # SQLite, 100,000 runs (~2 min to fill)
    python benchmarks/console.py --start-postgres                # and a throwaway PostgreSQL cluster
    python benchmarks/console.py --postgres postgresql://user@host/db   # and this server (a fresh schema)
    python benchmarks/console.py --runs 300 --requests 5 --followers 3 --n 40 --loads 40   # a smoke run

Four measurements per store (SQLite in a temporary directory; PostgreSQL if given):

1. **Fill**: three runs driven for real (the report team of ``examples/worker_pool.py``, finished;
   the refund team of ``examples/console_demo.py``, waiting for a person; its digest team, failed on
   a node after a retry), then ``--runs`` copies of them (90% finished, 9% failed, 1% waiting)
   written in bulk through the store's own tables (``_storage/schema.py``), each row with its
   checksum recomputed for its new run id, created one second apart: valid runs the console lists,
   opens and acts on like any other.
2. **Pages**: server time of ``GET /``, ``GET /?status=failed``, ``GET /api/runs`` and
   ``GET /api/runs?status=waiting`` (``--requests`` each, after 3 warm-up requests), in this process
   through ``httpx.ASGITransport`` on ``create_app(store)``: median and p95 in ms (target: < 300).
3. **Followers**: the ``loop`` workload of ``harness.py`` (``--n`` transitions, no agent latency:
   the worst case) driven in this process while ``--followers`` clients (in another process, one
   event loop) follow its page's event stream (``GET /runs/{id}/events``) on a console served by
   ``graphflow-durable ui``, against none; alternated over ``--repeats``: the driver's median wall ms
   per transition and the ratio (target: < 1.2x); the events each follower received, and the
   console's CPU seconds per followed run (``/proc/PID/stat``: the ratio's cause, steadier than it
   on a loaded machine).
4. **Memory**: ``--loads`` page loads (the runs page and a run's page, alternately) against the
   served console; its resident set (``/proc/PID/status`` ``VmRSS``) over the first and the last
   100 loads (target: flat).

Prints Markdown tables; ``--json PATH`` writes every number too. Timings vary with the machine's
load: compare ratios, not milliseconds across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from graphflow_durable import Store
from graphflow_durable._storage import checksum
from graphflow_durable._storage import schema as S
from graphflow_durable._storage.urls import parse_store_url
from harness import TASK, Case, build_team

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
URL_LINE = "graphflow-durable ui: "
PAGES = ("/", "/?status=failed", "/api/runs", "/api/runs?status=waiting")
TEMPLATES = (("finished", 90), ("failed", 9), ("waiting", 1))  # (status, share in 100 copies)


# -- filling the store ------------------------------------------------------------------------------


def drive_templates(url: str) -> dict[str, str]:
    """Drive the three template runs for real; ``{status: run_id}``."""
    import console_demo
    import worker_pool

    os.environ.setdefault("WORKER_POOL_DELAY", "0")  # the example teams' steps answer at once

    async def go() -> None:
        with Store(url) as store:
            await worker_pool.team("template-finished", store=store).run(task="Write the report.")
            await console_demo.approval("template-waiting", store=store).run(task="Refund 42 EUR?")
            with contextlib.suppress(Exception):
                await console_demo.digest("template-failed", store=store).run(task="Digest the news.")

    asyncio.run(go())
    with Store(url) as store:
        for status in ("finished", "waiting", "failed"):
            run = store.get_run(f"template-{status}")
            assert run is not None and run.status == status, (status, run)
    return {status: f"template-{status}" for status in ("finished", "waiting", "failed")}


def _rows(conn: sa.Connection, table: sa.Table, run_id: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(sa.select(table).where(table.c.run_id == run_id))]


def _copy(
    template: dict[str, list[dict[str, Any]]], run_id: str, token: int, at: float
) -> dict[str, list[dict[str, Any]]]:
    """The template's rows for a new run ``run_id``: its keys, times, token and checksums."""
    run = {
        **template["runs"][0],
        "run_id": run_id,
        "fencing_token": token,
        "created_at": at,
        "updated_at": at,
    }
    steps = [
        {
            **s,
            "run_id": run_id,
            "created_at": at,
            "checksum": checksum.step_sum(run_id, s["seq"], s["kind"], s["node"], s["data"], s["scheduler"]),
        }
        for s in template["steps"]
    ]
    messages = [
        {
            **m,
            "run_id": run_id,
            "checksum": checksum.message_sum(run_id, m["seq"], m["step_seq"], m["published"], m["body"]),
        }
        for m in template["messages"]
    ]
    states = [
        {
            **a,
            "run_id": run_id,
            "checksum": checksum.state_sum(run_id, a["node"], a["step_seq"], a["base_step"], a["body"]),
        }
        for a in template["states"]
    ]
    requests = [
        {**r, "run_id": run_id, "idempotency_key": f"{run_id}/{r['request_id']}", "created_at": at}
        for r in template["requests"]
    ]
    return {"runs": [run], "steps": steps, "messages": messages, "states": states, "requests": requests}


TABLES = {
    "runs": S.runs,
    "steps": S.steps,
    "messages": S.messages,
    "states": S.agent_states,
    "requests": S.input_requests,
}


def fill(url: str, count: int, batch: int = 2000) -> dict[str, Any]:
    """Drive the templates, then write ``count`` copies of them; the fill's numbers."""
    t0 = time.perf_counter()
    ids = drive_templates(url)
    target = parse_store_url(url)
    engine = sa.create_engine(target.engine_url)
    try:
        with engine.begin() as conn:
            templates = {
                status: {
                    "runs": _rows(conn, S.runs, run_id),
                    "steps": _rows(conn, S.steps, run_id),
                    "messages": _rows(conn, S.messages, run_id),
                    "states": _rows(conn, S.agent_states, run_id),
                    "requests": _rows(conn, S.input_requests, run_id),
                }
                for status, run_id in ids.items()
            }
            token = int(conn.execute(sa.select(sa.func.max(S.runs.c.fencing_token))).scalar_one()) + 1
        kinds = [status for status, share in TEMPLATES for _ in range(share)]
        start = time.time() - count
        rows_written = 0
        t1 = time.perf_counter()
        for first in range(0, count, batch):
            pending: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
            for i in range(first, min(first + batch, count)):
                copy = _copy(templates[kinds[i % len(kinds)]], f"bench-{i:07d}", token + i, start + i)
                for name, rows in copy.items():
                    pending[name].extend(rows)
            with engine.begin() as conn:
                for name, table in TABLES.items():
                    if pending[name]:
                        conn.execute(table.insert(), pending[name])
                        rows_written += len(pending[name])
        last = token + count
        with engine.begin() as conn:
            if target.dialect == "sqlite":
                conn.execute(S.fencing_tokens.update().values(last_token=last))
            else:
                conn.execute(sa.text("SELECT setval('graphflow_fencing_tokens', :v)"), {"v": last})
            if target.dialect == "postgresql":
                conn.execute(sa.text("ANALYZE"))
    finally:
        engine.dispose()
    seconds = time.perf_counter() - t1
    return {
        "runs": count,
        "rows": rows_written,
        "copy_seconds": round(seconds, 2),
        "runs_per_second": round(count / seconds) if seconds else None,
        "total_seconds": round(time.perf_counter() - t0, 2),
        "template": ids["finished"],
    }


# -- page times, in process ------------------------------------------------------------------------


async def page_times(url: str, requests: int) -> dict[str, dict[str, float]]:
    """Median and p95 server ms of each page of :data:`PAGES` (``requests`` each, after a warm-up)."""
    from graphflow_durable.ui import create_app

    out: dict[str, dict[str, float]] = {}
    with Store(url) as store:
        app = create_app(store)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for page in PAGES:
                samples = []
                for i in range(3 + requests):
                    t0 = time.perf_counter()
                    answer = await client.get(page)
                    elapsed = (time.perf_counter() - t0) * 1e3
                    assert answer.status_code == 200, (page, answer.status_code, answer.text[:300])
                    if i >= 3:
                        samples.append(elapsed)
                samples.sort()
                out[page] = {
                    "median_ms": round(statistics.median(samples), 2),
                    "p95_ms": round(samples[min(len(samples) - 1, int(0.95 * len(samples)))], 2),
                    "bytes": len(answer.content),
                }
    return out


# -- the served console --------------------------------------------------------------------------


@contextlib.contextmanager
def served(url: str) -> Iterator[tuple[str, int]]:
    """``graphflow-durable ui --store URL --port 0`` in a child process: its address and pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphflow_durable.cli.runs", "ui", "--store", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(URL_LINE), f"graphflow-durable ui printed {line!r}"
        yield line[len(URL_LINE) :].strip().rstrip("/"), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def memory(url: str, run_id: str, loads: int) -> dict[str, float]:
    """The served console's RSS over ``loads`` page loads: mean of the first and the last 100."""
    samples: list[float] = []
    with served(url) as (base, pid), httpx.Client(base_url=base, timeout=30) as client:
        for i in range(loads):
            answer = client.get("/" if i % 2 == 0 else f"/runs/{run_id}")
            assert answer.status_code == 200, (answer.status_code, answer.text[:300])
            samples.append(rss_mb(pid))
    window = min(100, max(1, loads // 2))
    first, last = statistics.mean(samples[:window]), statistics.mean(samples[-window:])
    return {
        "loads": loads,
        "first_mb": round(first, 1),
        "last_mb": round(last, 1),
        "max_mb": round(max(samples), 1),
        "ratio": round(last / first, 3),
    }


# -- followers ---------------------------------------------------------------------------------------


async def follow(base: str, run_id: str, count: int) -> int:
    """``count`` clients follow the run's event stream from when it exists until SIGTERM; the
    events they received in all (printed as the last line)."""
    received = [0] * count
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    limits = httpx.Limits(max_connections=count + 5)
    async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as client:

        async def one(i: int) -> None:
            while not stop.is_set():
                try:
                    async with client.stream("GET", f"/runs/{run_id}/events") as answer:
                        if answer.status_code != 200:
                            await asyncio.sleep(0.01)
                            continue
                        async for line in answer.aiter_lines():
                            if line.startswith("data:"):
                                received[i] += 1
                except httpx.HTTPError:
                    await asyncio.sleep(0.01)

        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sum(received)


async def driven(url: str, base: str, case: Case, followers: int) -> tuple[float, int]:
    """One run of ``case`` with ``followers`` following it: the driver's wall ms per transition,
    and the events the followers received."""
    run_id = f"followed-{uuid.uuid4().hex[:12]}"
    proc = None
    if followers:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--follow", base, run_id, str(followers)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    with Store(url) as store:
        team = build_team(case, durable=store, run_id=run_id)
        t0 = time.perf_counter()
        result = await team.run(task=TASK)
        seconds = time.perf_counter() - t0
    received = 0
    if proc is not None:
        await asyncio.sleep(0.5)  # the last events reach the followers
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        received = int(out.split()[-1])
    return seconds * 1e3 / (len(result.messages) - 1), received


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def followers_cost(url: str, case: Case, followers: int, repeats: int) -> dict[str, Any]:
    with served(url) as (base, pid):
        await driven(url, base, Case(case.shape, 20, case.size), 0)  # warm-up
        samples: dict[int, list[float]] = {0: [], followers: []}
        received: list[int] = []
        cpu: list[float] = []  # the console's CPU seconds per followed run
        for repeat in range(repeats):
            for count in [0, followers] if repeat % 2 == 0 else [followers, 0]:
                before = cpu_seconds(pid)
                ms, got = await driven(url, base, case, count)
                samples[count].append(ms)
                if count:
                    received.append(got)
                    cpu.append(cpu_seconds(pid) - before)
    alone, followed = statistics.median(samples[0]), statistics.median(samples[followers])
    return {
        "followers": followers,
        "transitions": case.n,
        "alone_ms": round(alone, 3),
        "followed_ms": round(followed, 3),
        "ratio": round(followed / alone, 3),
        "events_per_follower": round(statistics.median(received) / followers, 1) if received else 0,
        "console_cpu_s": round(statistics.median(cpu), 2) if cpu else 0,
    }


# -- main ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A fresh schema on the server of ``url`` (dropped at the end): the URL of a store in it."""
    engine = sa.create_engine(parse_store_url(url).engine_url, isolation_level="AUTOCOMMIT")
    name = f"gfd_console_bench_{os.getpid()}"
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    try:
        yield (
            sa.make_url(url)
            .update_query_dict({"options": f"-csearch_path={name}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        engine.dispose()


def measure(name: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    def say(what: str, value: Any) -> None:
        print(f"{name}: {what}: {value}", file=sys.stderr, flush=True)

    say("filling", f"{args.runs} runs")
    result: dict[str, Any] = {"store": name, "fill": fill(url, args.runs)}
    say("fill", result["fill"])
    result["pages"] = asyncio.run(page_times(url, args.requests))
    say("pages", result["pages"])
    case = Case("loop", args.n, 100)
    result["followers"] = asyncio.run(followers_cost(url, case, args.followers, args.repeats))
    say("followers", result["followers"])
    result["memory"] = memory(url, result["fill"]["template"], args.loads)
    say("memory", result["memory"])
    return result


def report(results: list[dict[str, Any]]) -> str:
    lines = ["| store | runs | page | median ms | p95 ms |", "|---|---:|---|---:|---:|"]
    for r in results:
        for page, t in r["pages"].items():
            lines.append(
                f"| {r['store']} | {r['fill']['runs']} | `GET {page}` | {t['median_ms']} | {t['p95_ms']} |"
            )
    lines += [
        "",
        "| store | followers | N | alone ms/transition | followed | ratio | events each | console CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        f = r["followers"]
        lines.append(
            f"| {r['store']} | {f['followers']} | {f['transitions']} | {f['alone_ms']} | {f['followed_ms']} "
            f"| {f['ratio']}x | {f['events_per_follower']} | {f['console_cpu_s']} |"
        )
    lines += [
        "",
        "| store | page loads | RSS first 100 (MB) | last 100 | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        m = r["memory"]
        lines.append(f"| {r['store']} | {m['loads']} | {m['first_mb']} | {m['last_mb']} | {m['ratio']}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100_000, help="runs in the store (100000)")
    p.add_argument("--requests", type=int, default=30, help="timed requests per page (30)")
    p.add_argument("--followers", type=int, default=50, help="clients following one run (50)")
    p.add_argument("--n", type=int, default=1000, help="transitions of the followed run (1000)")
    p.add_argument("--repeats", type=int, default=3, help="alternations of followed and alone (3)")
    p.add_argument("--loads", type=int, default=1000, help="page loads for the memory measure (1000)")
    p.add_argument("--postgres", default=None, help="a PostgreSQL URL: adds its rows (a fresh schema there)")
    p.add_argument("--start-postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    p.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    p.add_argument("--json", type=Path, help="write every number to this file")
    p.add_argument("--follow", nargs=3, metavar=("BASE", "RUN", "COUNT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.follow:
        base, run_id, count = args.follow
        print(asyncio.run(follow(base, run_id, int(count))), flush=True)
        return 0
    results = []
    with contextlib.ExitStack() as stack:
        if not args.no_sqlite:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gfd-console-bench-")))
            results.append(measure("sqlite", f"sqlite:///{work / 'console.db'}", args))
        if args.start_postgres:
            sys.path.insert(0, str(ROOT / "tests"))
            from pgcluster import PgCluster

            cluster = PgCluster.start()
            stack.callback(cluster.stop)
            args.postgres = cluster.url
        if args.postgres:
            results.append(measure("postgresql", stack.enter_context(postgres_schema(args.postgres)), args))
    print(report(results))
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
