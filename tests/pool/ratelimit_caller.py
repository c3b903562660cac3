"""A process that calls through one rate limit (``rate_limited``), for the cross-process tests.

``python ratelimit_caller.py URL reserve N SPACING``: take N turns of key ``shared`` (spacing
SPACING s) as fast as it can; print them as JSON. ``python ratelimit_caller.py URL call N``: make N
calls through ``rate_limited(..., RateLimit("paused", 6000))``; the model's first call answers a 429
with ``Retry-After: 2`` when ``$GFD_FIRST_429`` is set; print the times the model was reached.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import httpx
from autogen_core.models import CreateResult, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

from graphflow_durable import RateLimit, Store, rate_limited


class Model(ReplayChatCompletionClient):
    def __init__(self, n: int, fail_first: bool) -> None:
        super().__init__(["ok"] * n)
        self.fail_first = fail_first
        self.times: list[float] = []
        self.failed_at: float | None = None

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        if self.fail_first:
            self.fail_first = False
            self.failed_at = time.time()
            request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
            response = httpx.Response(429, headers={"retry-after": "2"}, request=request)
            raise httpx.HTTPStatusError("Too Many Requests", request=request, response=response)
        self.times.append(time.time())
        return await super().create(messages, **kwargs)


async def call(url: str, n: int) -> dict[str, Any]:
    with Store(url) as store:
        model = Model(n, bool(os.environ.get("GFD_FIRST_429")))
        client = rate_limited(model, RateLimit("paused", requests_per_minute=6000), store=store)
        for _ in range(n):
            await client.create([UserMessage(content="hi", source="user")])
        return {"times": model.times, "failed_at": model.failed_at}


def main() -> None:
    url, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "reserve":
        spacing = float(sys.argv[4])
        with Store(url) as store:
            starts = [store.limits.reserve("shared", spacing=spacing) for _ in range(n)]
        print(json.dumps({"starts": starts}))
    else:
        print(json.dumps(asyncio.run(call(url, n))))


if __name__ == "__main__":
    main()
