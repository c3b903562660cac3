"""What a rate limit costs a model call that has budget left (benchmarks/README.md, Rate limits).

    python benchmarks/rate_limit_call.py [--n 2000] [--repeats 3] [--postgres URL | --start-postgres]

A model call is AutoGen's scripted ``ReplayChatCompletionClient`` (no network: the floor, so the
limiter's own cost shows whole). Three clients, interleaved in every repeat: ``unlimited`` (the
client itself), ``requests`` (``rate_limited`` by a request limit far above the rate reached: one
statement per call) and ``requests+tokens`` (a request and a token limit on two keys: two
statements, and a correction when the reported tokens differ from the estimate). Prints the
median microseconds per call of each, and the limiter's extra cost per call, per store.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autogen_core.models import ChatCompletionClient, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from graphflow_durable import RateLimit, Store, rate_limited

HERE = Path(__file__).resolve().parent
MESSAGES = [UserMessage(content="Where is my order?", source="user")]


async def per_call_us(client: ChatCompletionClient, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await client.create(MESSAGES)
    return (time.perf_counter() - start) / n * 1e6


def clients(store: Store, n: int) -> dict[str, Any]:
    def model() -> ReplayChatCompletionClient:
        return ReplayChatCompletionClient(["Your order ships today."] * (n + 10))

    fast = RateLimit("bench-requests", requests_per_minute=1e9)
    tokens = RateLimit("bench-tokens", tokens_per_minute=1e12)
    return {
        "unlimited": model,
        "requests": lambda: rate_limited(model(), fast, store=store),
        "requests+tokens": lambda: rate_limited(model(), [fast, tokens], store=store),
    }


async def measure(url: str, n: int, repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    with Store(url) as store:
        made = clients(store, n)
        for make in made.values():
            await per_call_us(make(), 50)  # warm-up: the row, the compiled statements
        for repeat in range(repeats):
            names = list(made) if repeat % 2 == 0 else list(reversed(made))
            for name in names:
                samples.setdefault(name, []).append(await per_call_us(made[name](), n))
    return {name: statistics.median(values) for name, values in samples.items()}


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="calls per sample (2000)")
    p.add_argument("--repeats", type=int, default=3, help="repeats (3)")
    p.add_argument("--postgres", default=None, help="a PostgreSQL URL: adds its row")
    p.add_argument("--start-postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    args = p.parse_args(argv)
    cluster = None
    if args.start_postgres:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from pgcluster import PgCluster

        cluster = PgCluster.start(settings={"fsync": "on", "full_page_writes": "on"})
        args.postgres = cluster.url
    work = Path(tempfile.mkdtemp(prefix="gfd-limits-"))
    urls = {
        "sqlite-full": f"sqlite:///{work}/full.db?synchronous=FULL",
        "sqlite-normal": f"sqlite:///{work}/normal.db?synchronous=NORMAL",
    }
    if args.postgres:
        urls["postgres"] = args.postgres
    rows = []
    try:
        for name, url in urls.items():
            got = await measure(url, args.n, args.repeats)
            base = got["unlimited"]
            rows.append(
                f"| {name} | {base:.0f} | {got['requests']:.0f} (+{got['requests'] - base:.0f}) | "
                f"{got['requests+tokens']:.0f} (+{got['requests+tokens'] - base:.0f}) |"
            )
    finally:
        if cluster is not None:
            cluster.stop()
    print(
        "| store | unlimited µs/call | 1 request limit µs/call (extra) | request + token limits µs/call (extra) |"
    )
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
