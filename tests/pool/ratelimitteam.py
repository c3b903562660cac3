"""The rate-limit pool team: one AssistantAgent whose model is AutoGen's scripted
``ReplayChatCompletionClient``, its calls limited by ``$GFD_RATE_RPM`` requests a minute (key
``scripted``) through ``DurableGraphFlow(rate_limits=...)``.

``team(run_id, **durable)`` is the factory workers load (``ratelimitteam:team``). Each call that
reaches the model appends ``call <pid> <time>`` to ``$GFD_EXEC_LOG``; the first call of the run
``$GFD_429_RUN`` raises a provider's 429 (httpx) with ``Retry-After: 2`` instead, logged as
``429 <pid> <time>``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import DiGraphBuilder
from autogen_core.models import CreateResult
from autogen_ext.models.replay import ReplayChatCompletionClient

from graphflow_durable import DurableGraphFlow, RateLimit

KEY = "scripted"


def log(kind: str) -> None:
    path = os.environ.get("GFD_EXEC_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{kind} {os.getpid()} {time.time():.6f}\n")


class LoggedModel(ReplayChatCompletionClient):
    """The scripted model, each call logged; ``fail_first``: the first call answers 429."""

    def __init__(self, fail_first: bool) -> None:
        super().__init__(["resolved"])
        self.fail_first = fail_first

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        if self.fail_first:
            self.fail_first = False
            log("429")
            request = httpx.Request("POST", "https://api.example.com/v1/chat/completions")
            response = httpx.Response(429, headers={"retry-after": "2"}, request=request)
            raise httpx.HTTPStatusError("Too Many Requests", request=request, response=response)
        log("call")
        return await super().create(messages, **kwargs)


def team(run_id: str, **durable: Any) -> DurableGraphFlow:
    agent = AssistantAgent("support", model_client=LoggedModel(run_id == os.environ.get("GFD_429_RUN")))
    builder = DiGraphBuilder()
    builder.add_node(agent)
    limit = RateLimit(KEY, requests_per_minute=float(os.environ.get("GFD_RATE_RPM", "600")))
    return DurableGraphFlow([agent], builder.build(), run_id=run_id, rate_limits=[limit], **durable)
