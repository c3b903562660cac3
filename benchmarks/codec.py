"""What encryption at rest costs a transition: the loop with a codec against the same loop without.

Usage::

    python benchmarks/codec.py [--n 200] [--repeats 5] [--sizes 100,10240] [--json FILE]
    python benchmarks/codec.py --profile --n 300 --size 10240   # cProfile of the codec run

Per message size (100 B and 10 KB by default), the loop shape of ``harness.py`` (A -> B -> A,
text agents, every message fresh random text) runs as plain ``GraphFlow``, as ``DurableGraphFlow``
on SQLite ``synchronous=NORMAL`` (``normal``) and the same with ``Store(url, codec=AESGCMCodec(...))``
(``codec``: every message body, agent state, task and result sealed with AES-256-GCM), the three
configurations interleaved (rotated order) inside every repeat, so the ratios compare numbers
taken seconds apart. Per configuration: the median wall and CPU time (``time.process_time``, every
thread) per transition; ``codec / normal`` is the target's ratio (at most 1.15x at 10 KB).

Beside it, one value's own cost at each size (``Sealer.seal`` and ``Sealer.open``, and the parts of
a seal: AES-GCM with a cached cipher, a nonce from ``os.urandom``, base64), to say where a
difference comes from. Prints a Markdown table, and with ``--json FILE`` writes every sample.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import gc
import io
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphflow_durable._storage.sealing import Sealer
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.store import Store
from harness import Case, build_team, random_text

CONFIGS = ("plain", "normal", "codec")


def codec() -> AESGCMCodec:
    """A codec under one fresh key (``k1``), as ``Keys.from_env()`` would give it."""
    return AESGCMCodec({"k1": os.urandom(32)}, active="k1")


async def once(case: Case, config: str, work: Path) -> tuple[float, float]:
    """Wall and CPU milliseconds per transition of one run of ``case`` under ``config``."""
    store = None
    if config != "plain":
        url = f"sqlite:///{work / (uuid.uuid4().hex + '.db')}"
        store = Store(url, synchronous="NORMAL", codec=codec() if config == "codec" else None)
    team = build_team(case, durable=store, run_id=uuid.uuid4().hex)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = await team.run(task="benchmark task")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if store is not None:
        store.close()
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            (body,) = conn.execute("SELECT body FROM graphflow_messages ORDER BY seq DESC LIMIT 1").fetchone()
        if body.startswith("gfd1:") != (config == "codec"):
            raise SystemExit(
                f"{config}: the stored message body is {body[:12]!r}...: not what {config} stores"
            )
    n = len(result.messages) - 1
    return wall * 1e3 / n, cpu * 1e3 / n


def value_costs(size: int, count: int) -> dict[str, float]:
    """Microseconds per value of ``size`` characters of JSON text: a whole seal and open, and the parts."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    text = json.dumps({"content": random_text(size), "source": "A", "type": "TextMessage"})
    sealer = Sealer(codec())
    sealed = [sealer.seal(text, "graphflow_messages", "run-1", i, "body") for i in range(count)]
    cipher = AESGCM(os.urandom(32))
    data, aad = text.encode(), b"graphflow_messages\x1frun-1\x1f1\x1fbody"
    body = os.urandom(12) + cipher.encrypt(os.urandom(12), data, aad)

    def timed(function: Any) -> float:
        start = time.perf_counter()
        for i in range(count):
            function(i)
        return (time.perf_counter() - start) * 1e6 / count

    return {
        "seal_us": timed(lambda i: sealer.seal(text, "graphflow_messages", "run-1", i, "body")),
        "open_us": timed(lambda i: sealer.open(sealed[i], "graphflow_messages", "run-1", i, "body")),
        "aesgcm_us": timed(lambda i: cipher.encrypt(b"\0" * 12, data, aad)),
        "aesgcm_new_us": timed(lambda i: AESGCM(b"\1" * 32)),
        "nonce_us": timed(lambda i: os.urandom(12)),
        "base64_us": timed(lambda i: base64.b64encode(body).decode("ascii")),
        "encode_us": timed(lambda i: text.encode()),
    }


async def measure(sizes: list[int], n: int, repeats: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gfd-codec-"))
    rows = []
    for size in sizes:
        case = Case("loop", n, size)
        await once(case, "codec", work)  # warm-up: imports, the statement cache, the cipher
        wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
        cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for rep in range(repeats):
            for config in CONFIGS[rep % len(CONFIGS) :] + CONFIGS[: rep % len(CONFIGS)]:
                w, c = await once(case, config, work)
                wall[config].append(w)
                cpu[config].append(c)
        med = {c: (statistics.median(wall[c]), statistics.median(cpu[c])) for c in CONFIGS}
        rows.append(
            {
                "size": size,
                "n": n,
                "repeats": repeats,
                **{f"{c}_ms": med[c][0] for c in CONFIGS},
                **{f"{c}_cpu_ms": med[c][1] for c in CONFIGS},
                "codec_x_normal": med["codec"][0] / med["normal"][0],
                "codec_x_normal_cpu": med["codec"][1] / med["normal"][1],
                "normal_x_plain": med["normal"][0] / med["plain"][0],
                "codec_x_plain": med["codec"][0] / med["plain"][0],
                "added_ms": med["codec"][0] - med["normal"][0],
                "samples": {"wall_ms": wall, "cpu_ms": cpu},
                "value": value_costs(size, 200 if n < 100 else 2000),
            }
        )
    return {"machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}", "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Machine: {result['machine']}",
        "",
        "| msg | N | plain ms | NORMAL ms | codec ms | codec / NORMAL (wall, CPU) | NORMAL / plain | codec / plain "
        "| seal / open us per value |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        size = f"{r['size'] // 1024} KB" if r["size"] >= 1024 else f"{r['size']} B"
        v = r["value"]
        lines.append(
            f"| {size} | {r['n']} | {r['plain_ms']:.3f} | {r['normal_ms']:.3f} | {r['codec_ms']:.3f} "
            f"| {r['codec_x_normal']:.3f}x, {r['codec_x_normal_cpu']:.3f}x | {r['normal_x_plain']:.2f}x "
            f"| {r['codec_x_plain']:.2f}x | {v['seal_us']:.1f} / {v['open_us']:.1f} |"
        )
    lines += ["", "One value's parts (us): AES-GCM (cached cipher), a new AESGCM object, nonce, base64"]
    for r in result["rows"]:
        v = r["value"]
        lines.append(
            f"- {r['size']} B: aesgcm {v['aesgcm_us']:.1f}, new cipher {v['aesgcm_new_us']:.1f}, "
            f"nonce {v['nonce_us']:.1f}, base64 {v['base64_us']:.1f}, encode {v['encode_us']:.1f}"
        )
    return "\n".join(lines)


def profile(n: int, size: int, top: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="gfd-codec-prof-"))
    case = Case("loop", n, size)
    asyncio.run(once(case, "codec", work))
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(once(case, "codec", work))
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("cumulative")
    stats.print_stats(r"sealing|crypto|aead|base64", top)
    sys.stdout.write(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="transitions per run (default 200)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    p.add_argument("--sizes", default="100,10240", help="message sizes in characters")
    p.add_argument("--json", type=Path, help="write every sample to this file")
    p.add_argument("--profile", action="store_true", help="cProfile one codec run (--n, --size)")
    p.add_argument("--size", type=int, default=10240, help="the message size --profile uses")
    args = p.parse_args()
    if args.profile:
        profile(args.n, args.size, 30)
        return
    result = asyncio.run(measure([int(s) for s in args.sizes.split(",")], args.n, args.repeats))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    sys.stdout.write(table(result) + "\n")


if __name__ == "__main__":
    main()
