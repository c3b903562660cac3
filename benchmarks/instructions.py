"""Instructions and system calls per transition, counted rather than timed: a noise-free measure.

Usage::

    python benchmarks/instructions.py                      # loop, 100 B, plain / NORMAL / FULL
    python benchmarks/instructions.py --size 10240 --configs plain,normal
    PYTHONPATH=/tmp/old/src python benchmarks/instructions.py   # an older tree, same counts
    python benchmarks/instructions.py --check benchmarks/budget.json   # the test command's budget check

On a shared machine the time of one transition moves by 2-3x from one minute to the next (plain
GraphFlow was seen at 0.53 ms and at 1.7 ms per loop transition on the same idle VM), which hides
any change smaller than that. Counts do not move: this runs the loop case twice per configuration,
at ``--n`` and ``--n + --extra`` transitions, each in a new process under Valgrind's callgrind
(every instruction executed, per thread) and, when ``strace`` is installed, under ``strace -c``
(every system call), and divides the difference by ``--extra``. Whatever a run does once (imports,
the store's schema, the team, the run's creation) cancels out; what is left is the cost of one
transition of a started run. ``PYTHONHASHSEED`` is fixed so that both runs hash alike.

Prints per configuration: millions of instructions per transition on the event-loop thread and on
all threads (FULL's writer thread is the difference), the ratio of the loop thread's to plain's,
and the system calls per transition by name. Instructions are not time: a system call, a cache
miss or an fsync costs far more than its instructions, which is why the calls are listed beside
them. Needs ``valgrind`` (each configuration takes 1-3 minutes; two run at once).

``--check BUDGET`` is the counted budget the test command holds every change to: it counts plain,
NORMAL and FULL (instructions only, no ``strace``) and compares each with the budget file (see
:func:`judge`); it exits 1 with the figures when a change costs more than the budget allows, and
says so when a change improves on it, so that the budget is lowered in the same commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one_run(config: str, n: int, size: int) -> None:
    """The measured program: one run of the loop case under ``config`` (plain | normal | full).
    Not ``harness.run_graphflow``: its size measurement after the run checkpoints the WAL, work
    that grows with the run and would be counted as the transitions' (0.4 system calls each)."""
    sys.path.insert(0, str(HERE))
    from graphflow_durable.store import Store
    from harness import Case, build_team

    async def main() -> None:
        store = None
        if config != "plain":
            path = Path(tempfile.mkdtemp(prefix="gfd-ir-")) / "run.db"
            store = Store(f"sqlite:///{path}", synchronous=config.upper())
        # A lease far longer than the run: its renewal is work per second, not per transition, and
        # under valgrind's slowdown the longer run would count more renewals than the shorter.
        options = {} if store is None else {"lease_seconds": 3600.0}
        team = build_team(Case("loop", n, size), durable=store, run_id="instructions", **options)
        result = await team.run(task="benchmark task")
        if len(result.messages) != n + 1:
            raise SystemExit(f"expected {n + 1} messages, got {len(result.messages)}")
        if store is not None:
            store.close()

    asyncio.run(main())


def _child(config: str, n: int, size: int) -> list[str]:
    return [sys.executable, __file__, "--child", config, str(n), str(size)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0"}


def instructions(config: str, n: int, size: int, work: Path) -> tuple[int, int]:
    """Instructions of one run: (event-loop thread, all threads)."""
    out = work / f"{config}-{n}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}.%p",
            *_child(config, n, size),
        ],
        env=_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    per_thread: dict[int, int] = {}
    for file in work.glob(f"{config}-{n}.*"):
        text = file.read_text()
        thread, total = re.search(r"^thread: (\d+)", text, re.M), re.search(r"^summary: (\d+)", text, re.M)
        if thread and total:
            per_thread[int(thread.group(1))] = int(total.group(1))
    return per_thread[1], sum(per_thread.values())


def syscalls(config: str, n: int, size: int, work: Path) -> dict[str, int]:
    """System calls of one run, all threads, by name."""
    out = work / f"{config}-{n}.strace"
    subprocess.run(
        ["strace", "-f", "-c", "-o", str(out), *_child(config, n, size)],
        env=_env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) != "total":
            counts[m.group(2)] = int(m.group(1))
    return counts


def measure(config: str, args: argparse.Namespace, work: Path) -> dict[str, object]:
    """Per-transition counts of ``config``: the difference of two runs, over ``args.extra``."""
    small, large = args.n, args.n + args.extra
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda n: instructions(config, n, args.size, work), (small, large))
    row: dict[str, object] = {
        "loop_mir": (b[0] - a[0]) / args.extra / 1e6,
        "all_threads_mir": (b[1] - a[1]) / args.extra / 1e6,
    }
    if args.syscalls and shutil.which("strace"):
        s, t = syscalls(config, small, args.size, work), syscalls(config, large, args.size, work)
        calls = {k: (t.get(k, 0) - s.get(k, 0)) / args.extra for k in set(s) | set(t)}
        row["syscalls"] = {k: round(v, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v}
    return row


#: How far past its budget a figure may go before the check fails (and below it before the check
#: asks for the budget to be lowered). Two runs of one tree agree within about 0.15%.
TOLERANCE = 0.03


def judge(
    budget: dict[str, float], measured: dict[str, float], tolerance: float = TOLERANCE
) -> tuple[bool, list[str]]:
    """Measured loop-thread instructions per transition against the budget: (within it, one line
    per figure). ``plain`` is judged whole (a change there is AutoGen's or the interpreter's: the
    budget was made elsewhere, and is re-made); a durable configuration is judged on what it adds
    over plain in the same run, the part our code owns, so that 3% of it is a 3% change of ours and
    not 0.4% of a total that plain dominates."""
    ok, lines = True, []
    for name, allowed in budget.items():
        figure = measured[name]
        change = figure / allowed - 1
        what = "plain GraphFlow" if name == "plain" else f"{name.removesuffix('_added').upper()} over plain"
        line = f"{what}: {figure / 1e6:.4f} M instructions per transition, budget {allowed / 1e6:.4f} M ({change:+.1%})"
        if change > tolerance:
            ok = False
            line += f": OVER BUDGET by more than {tolerance:.0%}"
        elif change < -tolerance:
            line += f": under budget by more than {tolerance:.0%}, lower it to {figure:.0f} in benchmarks/budget.json"
        lines.append(line)
    return ok, lines


def check(path: Path, work: Path) -> int:
    """The budget check: count as the budget file says, judge, print; 0 within budget, 1 past it."""
    spec = json.loads(path.read_text())
    args = argparse.Namespace(n=spec["n"], extra=spec["extra"], size=spec["size"], syscalls=False)
    loop = {
        config: float(measure(config, args, work)["loop_mir"]) * 1e6 for config in ("plain", "normal", "full")
    }
    budget = spec["loop_thread_per_transition"]

    def added() -> dict[str, float]:
        return {"plain": loop["plain"], **{f"{c}_added": loop[c] - loop["plain"] for c in ("normal", "full")}}

    # A durable configuration's loop thread waits for the commit (FULL: the writer's fsync), and how
    # many times the loop turns meanwhile depends on timing: on a loaded machine FULL was seen 6%
    # over and 2% under within minutes. A figure over budget is counted once more and the lower
    # count kept: a real cost shows in both counts, a timing artefact rarely twice.
    for config in ("normal", "full"):
        if not judge({f"{config}_added": budget[f"{config}_added"]}, added())[0]:
            again = float(measure(config, args, work)["loop_mir"]) * 1e6
            loop[config] = min(loop[config], again)
    ok, lines = judge(budget, added())
    sys.stdout.write("".join(f"instruction budget: {line}\n" for line in lines))
    if not ok:
        sys.stdout.write(
            "instruction budget: a change adds work per transition; find it (callgrind_annotate on a run of"
            " benchmarks/instructions.py) or, if the cost is deliberate, raise the budget and say why in the commit\n"
        )
    return 0 if ok else 1


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        one_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="plain,normal,full", help="plain, normal, full (SQLite)")
    p.add_argument("--n", type=int, default=20, help="transitions of the shorter run")
    p.add_argument("--extra", type=int, default=200, help="transitions the longer run adds")
    p.add_argument("--size", type=int, default=100, help="message size in bytes")
    p.add_argument("--no-syscalls", dest="syscalls", action="store_false", help="count instructions only")
    p.add_argument("--check", type=Path, metavar="BUDGET", help="judge against a budget file; exit 1 past it")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: install it (apt-get install valgrind) and run again")
    work = Path(tempfile.mkdtemp(prefix="gfd-ir-"))
    if args.check is not None:
        status = check(args.check, work)
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(status)
    rows = {config: measure(config, args, work) for config in args.configs.split(",")}
    plain = rows.get("plain")
    for config, row in rows.items():
        if plain is not None and config != "plain":
            loop, base = float(row["loop_mir"]), float(plain["loop_mir"])  # type: ignore[arg-type]
            row["loop_x_plain"] = loop / base
            row["loop_added_mir"] = loop - base
            if "syscalls" in row and "syscalls" in plain:
                mine, theirs = row["syscalls"], plain["syscalls"]
                row["syscalls_added"] = round(sum(mine.values()) - sum(theirs.values()), 2)  # type: ignore[union-attr]
    shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(json.dumps({"size": args.size, "per_transition": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
