"""Where the durable loop spends its time: cProfile of one run.

Usage::

    python benchmarks/profile_loop.py [--n 500] [--size 100] [--config sqlite-full] [--top 25]

Prints the top functions by own time (tottime) and by cumulative time, and the share of the run
spent inside the store driver's commits, ``save_state`` and the codec.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Case, run_graphflow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--shape", default="loop")
    p.add_argument("--config", default="sqlite-full")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    case = Case(args.shape, args.n, args.size)
    work = Path(tempfile.mkdtemp(prefix="gfd-prof-"))
    asyncio.run(run_graphflow(case, args.config, work))  # warm-up: imports, statement cache
    prof = cProfile.Profile()
    prof.enable()
    res = asyncio.run(run_graphflow(case, args.config, work))
    prof.disable()
    print(
        f"{case.key} {args.config}: {res.seconds * 1e3 / res.transitions:.3f} ms/transition (under cProfile)"
    )
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
        print(f"\n=== top {args.top} by {key} ===")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-6000:])
    print("\n=== share of the profiled run (cumulative) ===")
    wanted = {
        "Driver.submit_commit": ("_storage/driver.py", "submit_commit"),
        "CommitWriter.write": ("_storage/writer.py", "write"),
        "DurableGraphFlowManager._on_response": ("_runtime/manager.py", "_on_response"),
        "Cursor.to_json": ("_model/cursor.py", "to_json"),
        "encode_commit": ("_storage/driver.py", "encode_commit"),
        "StateLog.encode (agent-state splices)": ("_agentstate/encoder.py", "encode"),
        "state_text": ("_model/codec.py", "state_text"),
        "codec dumps": ("_model/codec.py", "dumps"),
        "agent save_state (container)": ("_runtime/container.py", "save_state"),
        "sqlite3 commit": ("~", "<method 'commit' of 'sqlite3.Connection' objects>"),
        "sqlite3 execute": ("~", "<method 'execute' of 'sqlite3.Cursor' objects>"),
        "sqlite3 executemany": ("~", "<method 'executemany' of 'sqlite3.Cursor' objects>"),
    }
    for label, (file, func) in wanted.items():
        cum = sum(
            v[3]
            for (f, _line, fn), v in stats.stats.items()
            if fn == func and f.endswith(file)  # type: ignore[attr-defined]
        )
        print(f"{label:40s} {cum:8.3f} s  {100 * cum / total:5.1f} %")
    print(f"{'total':40s} {total:8.3f} s")


if __name__ == "__main__":
    main()
