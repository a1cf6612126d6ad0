"""An operator's finding: in a 55 s PostgreSQL outage the takeover watcher wrote 546
``takeover.session_lost`` lines, one per 0.1 s look. It writes one when the session is
lost, then one per ``_LOST_LOG_EVERY_S`` while it stays lost, and one when it is back."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from qimpl import watcher as watcher_module
from qimpl.watcher import LeaseWatcher


@pytest.mark.req("R-EXEC-13")
def test_a_lost_session_is_logged_once_per_interval_not_per_look(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = {"n": 0}

    async def look(self: Any) -> None:
        looks["n"] += 1
        if looks["n"] <= 40:
            raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(LeaseWatcher, "look", look)
    watcher = LeaseWatcher(None, dsn="postgresql://nowhere", lease_s=1.0, poll_s=0.005,  # type: ignore[arg-type]
                           unclaimed_s=1.0)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        deadline = asyncio.get_running_loop().time() + 10
        while looks["n"] < 45:
            assert asyncio.get_running_loop().time() < deadline, f"{looks['n']} looks in 10 s"
            await asyncio.sleep(0.01)
        stop.set()
        await task

    with caplog.at_level(logging.INFO, logger="qimpl.takeover"):
        asyncio.run(go())
    events = [getattr(r, "event", "") for r in caplog.records]
    assert events.count("takeover.session_lost") == 1, events
    restored = [r for r in caplog.records if getattr(r, "event", "") == "takeover.session_restored"]
    assert len(restored) == 1 and restored[0].tries == 40
    assert watcher_module._LOST_LOG_EVERY_S >= 1
