"""The benchmark's closed loop keeps exactly ``concurrency`` operations in flight."""

from __future__ import annotations

import asyncio

import pytest

from bench.load import closed_loop


@pytest.mark.parametrize(("concurrency", "total"), [(1, 5), (3, 10), (10, 4)])
def test_closed_loop_runs_each_operation_once_with_bounded_concurrency(concurrency: int, total: int) -> None:
    started: list[int] = []
    in_flight = peak = 0

    async def op(i: int) -> None:
        nonlocal in_flight, peak
        started.append(i)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)  # yield: let the other lanes start theirs
        in_flight -= 1

    elapsed, latencies = asyncio.run(closed_loop(op, concurrency=concurrency, total=total))
    assert sorted(started) == list(range(total))
    assert peak == min(concurrency, total)
    assert len(latencies) == total and elapsed >= 0


def test_closed_loop_propagates_a_failure() -> None:
    async def op(i: int) -> None:
        if i == 2:
            raise RuntimeError("boom")

    with pytest.raises(ExceptionGroup):
        asyncio.run(closed_loop(op, concurrency=2, total=5))
