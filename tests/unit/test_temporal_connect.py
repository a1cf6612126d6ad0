"""Concurrent requests share one Temporal connect (issue 22, item 8): during an outage
each waits at most one dispatch timeout, not one per request ahead of it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from qimpl.api import deps
from qimpl.settings import ApiSettings

DSN = "postgresql://qimpl_api@127.0.0.1:1/qimpl"  # never connected to


@pytest.mark.req("R-CREATE-5")
def test_concurrent_requests_wait_one_timeout_not_n(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        await asyncio.sleep(3600)

    monkeypatch.setattr(deps.Client, "connect", unreachable)
    timeout = 0.3
    services = deps.Services(ApiSettings(database_url=DSN, dispatch_timeout_s=timeout))

    async def requests() -> tuple[float, list[BaseException | Any]]:
        start = time.monotonic()
        answers = await asyncio.gather(*(services.temporal() for _ in range(8)), return_exceptions=True)
        return time.monotonic() - start, answers

    took, answers = asyncio.run(requests())
    assert all(isinstance(a, TimeoutError) for a in answers), answers
    assert len(calls) == 1  # one connect for all eight
    assert took < 3 * timeout, f"eight concurrent requests took {took:.2f} s (one timeout: {timeout} s)"
