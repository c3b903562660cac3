"""Benchmark DurableGraphFlow against plain GraphFlow, one raw SQLite commit, and LangGraph.

Usage::

    python benchmarks/run.py [--quick] [--out DIR] [--postgres URL] [--repeats R]
    python benchmarks/run.py --concurrency [...]   # only concurrency.py's workload (issue 13)

Writes ``DIR/results.json`` and ``DIR/results.md`` (default DIR: ``benchmarks/results/``). Every
case runs all its configurations interleaved, ``R`` times, in one process; numbers are medians and
ratios are taken inside the same run. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import (  # noqa: E402
    Case,
    commit_parts,
    has_call_records,
    has_langgraph,
    has_policies,
    has_replay_client,
    raw_commit,
    recorded_call,
    run_graphflow,
    run_langgraph,
)

POSTGRES_ENV = "GRAPHFLOW_BENCH_POSTGRES_URL"
KB10 = 10 * 1024


def plan(quick: bool, assistant: bool, big: bool = False) -> list[Case]:
    if quick:
        cases = [Case(shape, n, 100) for shape in ("loop", "chain", "fanout") for n in (10, 40)]
        if assistant:
            cases.append(Case("loop", 10, 100, "assistant"))
        return cases
    cases = []
    for size in (100, KB10):
        cases += [Case("loop", n, size) for n in (10, 100, 500, 2000)]
        # Chain capped at 500 agents (AutoGen's broadcast makes plain O(N^2)); with 10 KB messages
        # at 100: plain's saved state of a 500 x 10 KB chain is ~1.2 GB of JSON (use --big).
        chain = (10, 100, 500) if size == 100 or big else (10, 100)
        cases += [Case("chain", n, size) for n in chain]
        cases += [Case("fanout", n, size) for n in (10, 100, 500, 2000)]
        if assistant:  # its whole model context is re-saved every turn: capped like the chain
            cases += [
                Case("loop", n, size, "assistant")
                for n in ((10, 100, 500) if size == 100 or big else (10, 100))
            ]
    return cases


def langgraph_plan(quick: bool) -> list[Case]:
    if quick:
        return [Case("loop", 40, 100)]
    return [Case("loop", n, size) for size in (100, KB10) for n in (10, 100, 500)]


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in (
        "autogen-agentchat",
        "autogen-ext",
        "SQLAlchemy",
        "langgraph",
        "langgraph-checkpoint-sqlite",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    import sqlite3

    def git(*cmd: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *cmd], cwd=HERE, capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "src_dirty": bool(git("status", "--porcelain", "--", "src")),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
    }


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


async def bench_case(
    case: Case, configs: list[str], repeats: int, work: Path, postgres: str | None, resume: bool
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    samples: dict[str, list[float]] = {c: [] for c in configs}
    raw: dict[str, list[float]] = {"FULL": [], "NORMAL": []}
    extra: dict[str, dict[str, Any]] = {c: {} for c in configs}
    keep: dict[str, Any] = {}
    for rep in range(repeats):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]  # rotate: interleave
        last = rep == repeats - 1
        for config in order:
            res = await run_graphflow(
                case, config, work, postgres_url=postgres, save_plain_state=last and resume
            )
            samples[config].append(res.seconds * 1e3 / max(res.transitions, 1))
            extra[config]["transitions"] = res.transitions
            if res.db_bytes is not None:
                extra[config]["db_bytes"] = res.db_bytes
            if last and resume and config in ("plain", "sqlite-full"):
                keep[config] = res
            elif res.db_url and res.db_url.startswith("sqlite:///"):
                _unlink_db(res.db_url)
        for sync in raw:
            count = min(max(case.n, 20), 200)
            raw[sync].append(raw_commit(work, case.size, sync, count=count)["median_ms"])
    # One more run per configuration under tracemalloc (not timed): peak Python memory.
    for config in configs:
        res = await run_graphflow(case, config, work, postgres_url=postgres, trace_memory=True)
        extra[config]["peak_mb"] = (res.peak_bytes or 0) / 1e6
        if res.db_url and res.db_url.startswith("sqlite:///"):
            _unlink_db(res.db_url)

    plain_ms = median(samples["plain"])
    rows = []
    for config in configs:
        ms = median(samples[config])
        row: dict[str, Any] = {
            **case.as_dict(),
            "config": config,
            "per_transition_ms": ms,
            "samples_ms": samples[config],
            **extra[config],
        }
        if config != "plain" and plain_ms and ms is not None:
            row["ratio_to_plain"] = ms / plain_ms
            row["overhead_ms"] = ms - plain_ms
            sync = "NORMAL" if config.startswith("sqlite-normal") else "FULL"
            if config.startswith("sqlite-"):
                row["raw_commit_ms"] = median(raw[sync])
                row["overhead_minus_raw_ms"] = row["overhead_ms"] - row["raw_commit_ms"]
        base, _, policy = config.partition("+")
        if policy and median(samples.get(base, [])):
            # Same run, same alternation: the cost of a policy that never triggers.
            row["ratio_to_no_policy"] = ms / median(samples[base])  # type: ignore[operator]
        if "db_bytes" in row and row.get("transitions"):
            row["bytes_per_transition"] = row["db_bytes"] / row["transitions"]
            row["bytes_over_message"] = row["bytes_per_transition"] / case.size
        rows.append(row)
    rows.append({**case.as_dict(), "config": "raw-full", "per_transition_ms": median(raw["FULL"])})
    rows.append({**case.as_dict(), "config": "raw-normal", "per_transition_ms": median(raw["NORMAL"])})

    resumed = None
    if resume and "sqlite-full" in keep:
        durable = keep["sqlite-full"]
        spec = {
            "case": case.as_dict(),
            "db_url": durable.db_url,
            "run_id": durable.run_id,
            "state_path": keep["plain"].state_path if "plain" in keep else None,
        }
        proc = subprocess.run(
            [sys.executable, str(HERE / "resume_worker.py"), json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            resumed = {**case.as_dict(), **json.loads(proc.stdout.strip().splitlines()[-1])}
            resumed["plain_state_bytes"] = keep["plain"].state_bytes if "plain" in keep else None
            resumed["durable_db_bytes"] = durable.db_bytes
        else:
            print(f"  resume worker failed: {proc.stderr.strip()[-2000:]}", file=sys.stderr)
        _unlink_db(durable.db_url)
        if "plain" in keep and keep["plain"].state_path:
            Path(keep["plain"].state_path).unlink(missing_ok=True)
    return rows, resumed


async def bench_calls(quick: bool, repeats: int, work: Path, postgres: str | None) -> list[dict[str, Any]]:
    """One recorded model call (``store.calls.record``: a fenced row and its commit) per backend and
    result size, beside the raw commit of a row of that size; the configurations interleaved per
    repeat, as the cases are."""
    configs = ["sqlite-full", "sqlite-normal"] + (["postgres"] if postgres else [])
    count = 50 if quick else 200
    rows = []
    for size in [100] if quick else [100, KB10]:
        samples: dict[str, list[float]] = {c: [] for c in configs}
        raw: dict[str, list[float]] = {"FULL": [], "NORMAL": []}
        for rep in range(repeats):
            for config in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
                measured = await recorded_call(config, work, size, count, postgres_url=postgres)
                samples[config].append(measured["median_ms"])
            for sync in raw:
                raw[sync].append(raw_commit(work, size, sync, count=count)["median_ms"])
        for config in configs:
            sync = "NORMAL" if config == "sqlite-normal" else "FULL"
            raw_ms = median(raw[sync]) if config.startswith("sqlite-") else None
            rows.append(
                {
                    "config": config,
                    "size": size,
                    "record_ms": median(samples[config]),
                    "raw_commit_ms": raw_ms,
                }
            )
        print(
            f"[calls] size={size}: "
            + ", ".join(f"{r['config']}={r['record_ms']:.3f}" for r in rows if r["size"] == size)
            + " ms per record",
            flush=True,
        )
    return rows


def _unlink_db(url: str | None) -> None:
    if not url or not url.startswith("sqlite:///"):
        return
    path = url[len("sqlite:///") :]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def bench_langgraph(case: Case, repeats: int, work: Path) -> dict[str, Any]:
    bare: list[float] = []
    saved: list[float] = []
    db = 0
    for rep in range(repeats):
        for checkpointed in (rep % 2 == 0, rep % 2 != 0):
            res = run_langgraph(case, work, checkpointed=checkpointed)
            (saved if checkpointed else bare).append(res.seconds * 1e3 / max(res.transitions, 1))
            if checkpointed:
                db = res.db_bytes or 0
    b, s = median(bare), median(saved)
    return {
        **case.as_dict(),
        "bare_ms": b,
        "sqlitesaver_ms": s,
        "ratio": s / b if b and s else None,
        "db_bytes": db,
        "bytes_per_step": db / case.n,
    }


# -- markdown --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def markdown(result: dict[str, Any]) -> str:
    rows = result["results"]
    by: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["shape"], r["agent"], r["n"], r["size"]), {})[r["config"]] = r
    pg = any(r["config"] == "postgres" for r in rows)
    policy = any(r["config"] == "sqlite-normal+policy" for r in rows)
    out = [
        f"Machine: {result['machine']['cpu']}, {result['machine']['cpus']} CPUs, "
        f"Python {result['machine']['python']}, SQLite {result['machine']['sqlite']}; "
        f"mode {result['mode']}, {result['repeats']} repeats, medians; ratios within this run.",
        "",
    ]
    out += ["### Per-transition time (ms) and ratio to plain GraphFlow", ""]
    head = "| shape | agent | N | msg | plain | FULL (x) | NORMAL (x) |"
    sep = "|---|---|---:|---:|---:|---:|---:|"
    if pg:
        head += " PostgreSQL (x) |"
        sep += "---:|"
    if policy:
        head += " NORMAL + policy (x plain, x NORMAL) |"
        sep += "---:|"
    head += " raw commit FULL / NORMAL | overhead - raw FULL / NORMAL |"
    sep += "---:|---:|"
    out += [head, sep]
    for (shape, agent, n, size), c in by.items():
        plain = c["plain"]["per_transition_ms"]

        def cell(name: str, c: dict[str, dict[str, Any]] = c) -> str:
            r = c.get(name)
            if not r:
                return "—"
            return f"{_f(r['per_transition_ms'])} ({_f(r.get('ratio_to_plain'), '{:.2f}')}x)"

        line = f"| {shape} | {agent} | {n} | {size} B | {_f(plain)} |"
        line += f" {cell('sqlite-full')} | {cell('sqlite-normal')} |"
        if pg:
            line += f" {cell('postgres')} |"
        if policy:
            r = c.get("sqlite-normal+policy", {})
            line += (
                f" {_f(r.get('per_transition_ms'))} ({_f(r.get('ratio_to_plain'), '{:.2f}')}x,"
                f" {_f(r.get('ratio_to_no_policy'), '{:.3f}')}x) |"
            )
        line += (
            f" {_f(c['raw-full']['per_transition_ms'])} / {_f(c['raw-normal']['per_transition_ms'])} |"
            f" {_f(c['sqlite-full'].get('overhead_minus_raw_ms'))} /"
            f" {_f(c['sqlite-normal'].get('overhead_minus_raw_ms'))} |"
        )
        out.append(line)
    out += ["", "### Storage and memory", ""]
    out += [
        "| shape | agent | N | msg | bytes/transition (FULL) | x message size |"
        " peak MB plain / FULL / NORMAL |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (shape, agent, n, size), c in by.items():
        full = c["sqlite-full"]
        out.append(
            f"| {shape} | {agent} | {n} | {size} B | {_f(full.get('bytes_per_transition'), '{:.0f}')} |"
            f" {_f(full.get('bytes_over_message'), '{:.2f}')} |"
            f" {_f(c['plain'].get('peak_mb'), '{:.1f}')} / {_f(full.get('peak_mb'), '{:.1f}')} /"
            f" {_f(c['sqlite-normal'].get('peak_mb'), '{:.1f}')} |"
        )
    if result["resume"]:
        out += ["", "### Cold resume (new process)", ""]
        out += [
            "| shape | agent | N | msg | durable open+restore ms | plain json.loads+load_state ms | ratio |"
            " durable db / plain state MB | peak MB durable / plain |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["resume"]:
            ratio = r["durable_ms"] / r["plain_ms"] if r.get("plain_ms") else None
            out.append(
                f"| {r['shape']} | {r['agent']} | {r['n']} | {r['size']} B |"
                f" {_f(r['durable_ms'], '{:.1f}')} |"
                f" {_f(r.get('plain_ms'), '{:.1f}')} | {_f(ratio, '{:.2f}')} |"
                f" {_f((r.get('durable_db_bytes') or 0) / 1e6, '{:.2f}')} /"
                f" {_f((r.get('plain_state_bytes') or 0) / 1e6, '{:.2f}')} |"
                f" {_f(r.get('durable_peak_mb'), '{:.1f}')} / {_f(r.get('plain_peak_mb'), '{:.1f}')} |"
            )
    if result.get("commit_parts"):
        case = result["commit_parts"][0]["case"]
        out += ["", f"### Where a commit's time goes ({case}, one run each, us per commit)", ""]
        out += [
            "| backend | statements/commit | transaction (BEGIN..COMMIT) | encoding | of which checksums |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in result["commit_parts"]:
            out.append(
                f"| {r['config']} | {_f(r['statements_per_commit'], '{:.2f}')} | {_f(r['transaction_us'], '{:.0f}')} |"
                f" {_f(r['encoding_us'], '{:.0f}')} | {_f(r['checksums_us'], '{:.0f}')} |"
            )
    if result.get("calls"):
        out += ["", "### One recorded model call (a row and a commit)", ""]
        out += [
            "| backend | result | record ms (median) | raw commit ms (same sync) |",
            "|---|---:|---:|---:|",
        ]
        for r in result["calls"]:
            out.append(
                f"| {r['config']} | {r['size']} B | {_f(r['record_ms'])} | {_f(r.get('raw_commit_ms'))} |"
            )
    if result["langgraph"]:
        out += ["", "### LangGraph + SqliteSaver (two nodes alternating, same message sizes)", ""]
        out += [
            "| N | msg | bare ms/step | SqliteSaver ms/step | ratio | db bytes/step |"
            " our FULL ms/transition | our bytes/transition |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["langgraph"]:
            ours = by.get(("loop", "text", r["n"], r["size"]), {}).get("sqlite-full", {})
            out.append(
                f"| {r['n']} | {r['size']} B | {_f(r['bare_ms'])} | {_f(r['sqlitesaver_ms'])} |"
                f" {_f(r['ratio'], '{:.1f}')}x | {_f(r['bytes_per_step'], '{:.0f}')} |"
                f" {_f(ours.get('per_transition_ms'))} | {_f(ours.get('bytes_per_transition'), '{:.0f}')} |"
            )
    return "\n".join(out) + "\n"


async def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--concurrency" in argv:  # the other options go to concurrency.py, which takes the same ones
        from concurrency import main as concurrency_main

        return await concurrency_main([a for a in argv if a != "--concurrency"])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, small messages (smoke check)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    p.add_argument(
        "--postgres", default=os.environ.get(POSTGRES_ENV), help=f"PostgreSQL URL (or ${POSTGRES_ENV})"
    )
    p.add_argument("--repeats", type=int, default=None, help="repeats per case (default 2 quick, 3 full)")
    p.add_argument("--no-resume", action="store_true", help="skip the cold-resume subprocesses")
    p.add_argument("--no-langgraph", action="store_true", help="skip LangGraph even if installed")
    p.add_argument("--big", action="store_true", help="also the 500 x 10 KB chain and assistant loop")
    p.add_argument("--shapes", default="loop,chain,fanout", help="comma-separated shapes to run")
    p.add_argument(
        "--concurrency", action="store_true", help="only the concurrency workload (concurrency.py)"
    )
    p.add_argument(
        "--no-policy",
        action="store_true",
        help="skip the NORMAL + policy column (retry and timeout set on every node, never triggered)",
    )
    p.add_argument(
        "--no-calls", action="store_true", help="skip the cost of one recorded model call (store.calls)"
    )
    args = p.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 3)
    assistant = has_replay_client()
    shapes = set(args.shapes.split(","))
    cases = [c for c in plan(args.quick, assistant, args.big) if c.shape in shapes]
    configs = ["plain", "sqlite-full", "sqlite-normal"] + (["postgres"] if args.postgres else [])
    if not args.no_policy and has_policies():
        configs.append("sqlite-normal+policy")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gfd-bench-"))
    started = time.time()
    result: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "repeats": repeats,
        "configs": configs,
        "machine": machine(),
        "started_at": started,
        "skipped": [],
        "results": [],
        "resume": [],
        "langgraph": [],
        "calls": [],
        "commit_parts": [],
    }
    if not assistant:
        result["skipped"].append("assistant agent (pip install autogen-ext)")
    if not args.no_policy and not has_policies():
        result["skipped"].append("NORMAL + policy (this tree has no retry=/timeout=)")
    try:
        for i, case in enumerate(cases, 1):
            t0 = time.perf_counter()
            case_repeats = repeats if case.n * (case.size // 1000 + 1) <= 20000 else max(3, repeats - 2)
            # Quick mode resumes only the largest case of each shape (each resume is a new process).
            resume = not args.no_resume and (not args.quick or case.n == max(c.n for c in cases))
            rows, resumed = await bench_case(case, configs, case_repeats, work, args.postgres, resume)
            result["results"] += rows
            if resumed:
                result["resume"].append(resumed)
            summary = ", ".join(
                f"{r['config']}={r['per_transition_ms']:.3f}"
                for r in rows
                if r["per_transition_ms"] is not None
            )
            print(
                f"[{i}/{len(cases)}] {case.key}: {summary} ms ({time.perf_counter() - t0:.1f}s)", flush=True
            )
        parts_case = Case("loop", 40 if args.quick else 300, 100)
        for config in ("sqlite-normal", "sqlite-full", "postgres"):
            if config in configs:
                row = await commit_parts(parts_case, config, work, postgres_url=args.postgres)
                result["commit_parts"].append(row)
                print(f"[parts] {config}: {row['statements_per_commit']:.2f} statements/commit", flush=True)
        if has_call_records() and not args.no_calls:
            result["calls"] = await bench_calls(args.quick, repeats, work, args.postgres)
        elif not has_call_records():
            result["skipped"].append("recorded model call (this tree has no store.calls)")
        if has_langgraph() and not args.no_langgraph and "loop" in shapes:
            for case in langgraph_plan(args.quick):
                t0 = time.perf_counter()
                lg_repeats = 1 if case.n * case.size > 1_000_000 else repeats
                row = bench_langgraph(case, lg_repeats, work)
                result["langgraph"].append(row)
                print(
                    f"[langgraph] n={case.n} size={case.size}: bare={row['bare_ms']:.3f} "
                    f"saver={row['sqlitesaver_ms']:.3f} ms ({time.perf_counter() - t0:.1f}s)",
                    flush=True,
                )
        elif not has_langgraph():
            result["skipped"].append("langgraph (pip install langgraph langgraph-checkpoint-sqlite)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = time.time() - started
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (args.out / "results.md").write_text(md)
    print(md)
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
