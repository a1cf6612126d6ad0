"""A request that cannot get or keep a database connection is answered within the pool
timeout with a coded, retryable 503, and logged (issue 22, items 7 and 11)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest

from qimpl.api.app import create_app
from qimpl.api.deps import Services
from qimpl.settings import ApiSettings

KEY = "k-1-0123456789abcdefghijklmn"
#: Nothing listens there: every connection attempt fails.
DSN = "postgresql://qimpl_api@127.0.0.1:1/qimpl"


def _timed(settings: ApiSettings, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    """One request to an app whose database is unreachable; ``(response, seconds)``."""
    app = create_app(settings)
    services = Services(settings)
    app.state.services = services

    async def call() -> tuple[httpx.Response, float]:
        await services.pool.open(wait=False)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                                         base_url="http://api") as client:
                t0 = time.monotonic()
                resp = await client.request(method, path, **kwargs)
                return resp, time.monotonic() - t0
        finally:
            await services.pool.close()

    return asyncio.run(call())


@pytest.mark.req("R-READ-1")
def test_no_database_is_a_coded_503_within_the_pool_timeout(caplog: pytest.LogCaptureFixture) -> None:
    settings = ApiSettings(database_url=DSN, auth="static", api_pool_timeout_s=0.5,
                           api_keys={KEY: {"tenant": "t-1", "principal": "p-1"}})
    with caplog.at_level(logging.WARNING, logger="qimpl.api"):
        resp, took = _timed(settings, "GET", "/v1/agents/a-1/runs/00000000-0000-0000-0000-000000000001",
                            headers={"Authorization": f"Bearer {KEY}"})
    assert (resp.status_code, resp.json()["code"]) == (503, "database_unavailable"), resp.text
    assert resp.headers.get("Retry-After") == "1"
    assert took < 3, f"answered after {took:.1f} s (pool timeout 0.5 s)"
    assert any(getattr(r, "event", "") == "api.database_unavailable" for r in caplog.records)


@pytest.mark.req("R-READ-1")
def test_a_write_waits_for_the_pool_once(caplog: pytest.LogCaptureFixture) -> None:
    """An operator's finding: with the database gone a create took two pool timeouts to
    answer 503 (the key's lookup before the route, then the route's own). The lookup's
    outage is the answer: one pool timeout, the same coded 503, logged."""
    settings = ApiSettings(database_url=DSN, auth="db", api_pool_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="qimpl.api"):
        resp, took = _timed(settings, "POST", "/v1/agents/a-1/runs", json={"prompt": "hi", "durable_temporal": True},
                            headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": "k"})
    assert (resp.status_code, resp.json()["code"]) == (503, "database_unavailable"), resp.text
    assert resp.headers.get("Retry-After") == "1" and resp.json()["retryable"] is True
    assert took < 1.8, f"answered after {took:.1f} s: more than one pool timeout (1 s)"
    assert any(getattr(r, "event", "") == "api.database_unavailable" for r in caplog.records)
