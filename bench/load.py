"""Closed-loop load: keep ``concurrency`` operations in flight until ``total`` are done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["closed_loop", "timed"]


async def closed_loop(op: Callable[[int], Awaitable[object]], *, concurrency: int,
                      total: int) -> tuple[float, list[float]]:
    """Run ``op(i)`` for i in 0..total-1 with at most ``concurrency`` in flight; returns
    (wall time in seconds from the first start to the last completion, seconds of each
    ``op``). An exception of any ``op`` is raised in an ExceptionGroup (the others are
    cancelled)."""
    next_i = 0
    latencies: list[float] = []

    async def lane() -> None:
        nonlocal next_i
        while next_i < total:
            i = next_i
            next_i += 1
            t0 = time.monotonic()
            await op(i)
            latencies.append(time.monotonic() - t0)

    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, total)):
            tg.create_task(lane())
    return time.monotonic() - t0, latencies


async def timed(op: Callable[[], Awaitable[object]]) -> float:
    """Seconds one awaited ``op()`` took (monotonic clock)."""
    t0 = time.monotonic()
    await op()
    return time.monotonic() - t0
