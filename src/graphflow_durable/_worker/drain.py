"""The worker's stop: its in-flight runs get a grace period, then are halted (a second signal halts
them at once, without waiting for their running agents)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["drain"]


async def drain(
    tasks: set[asyncio.Task[None]], wake: asyncio.Event, grace_seconds: float, halting: Callable[[], bool]
) -> None:
    """Wait for ``tasks`` (removing each as it ends) up to ``grace_seconds``, then cancel the rest and
    wait for them; ``wake`` is set on every stop request, and ``halting()`` says whether to halt now.

    A cancelled team stops dispatching and waits for its running agents' answers, at most its
    ``interrupt_grace_seconds``; once ``halting()``, each is cancelled a second time and stops waiting.
    """
    if not tasks:
        return
    deadline = time.monotonic() + grace_seconds
    while tasks and not halting():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        wake.clear()
        waker = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait({*tasks, waker}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        waker.cancel()
        tasks -= done
    # Halt: each team stops dispatching and waits for its running agents' answers, at most its
    # interrupt_grace_seconds. A signal during that wait (the second one) halts them at once.
    for task in tasks:
        task.cancel()
    recancelled = False
    while tasks:
        if halting() and not recancelled:
            recancelled = True
            await asyncio.sleep(0.01)  # the teams took the first cancellation and are waiting
            for task in tasks:
                task.cancel()  # a second one: each team stops waiting for its agents
            continue
        wake.clear()
        waker = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait({*tasks, waker}, return_when=asyncio.FIRST_COMPLETED)
        waker.cancel()
        tasks -= done
