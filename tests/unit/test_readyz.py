"""``/readyz`` (readiness): 200 only when the database and Temporal both answer; a 503
``not_ready`` names which did not, and nothing else (a tester saw ``/healthz`` answer ok
with PostgreSQL down, and the README waited on it)."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

import pytest

from qimpl.api.routers import operations


class _Conn:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    async def execute(self, query: str) -> None:
        if not self.ok:
            raise OSError("connection refused by 10.0.0.7:5432")


class _Client:
    def __init__(self, ok: bool) -> None:
        self.service_client = self
        self.ok = ok

    async def check_health(self, *, timeout: Any) -> bool:
        if not self.ok:
            await asyncio.sleep(10)  # an address that never answers
        return True


class _Svc:
    def __init__(self, db: bool, temporal: bool) -> None:
        self.db, self.client = db, _Client(temporal)

    @asynccontextmanager
    async def connection(self) -> Any:
        yield _Conn(self.db)

    async def temporal(self) -> _Client:
        return self.client


@pytest.mark.parametrize(("db", "temporal", "down"), [
    (True, True, None), (False, True, "the database"), (True, False, "Temporal"),
    (False, False, "the database and Temporal")])
def test_ready_only_when_both_answer(monkeypatch: pytest.MonkeyPatch, db: bool, temporal: bool,
                                     down: str | None) -> None:
    monkeypatch.setattr(operations, "READY_TIMEOUT_S", 0.2)
    resp = asyncio.run(operations.readyz(_Svc(db, temporal)))  # type: ignore[arg-type]
    body = json.loads(bytes(resp.body))
    if down is None:
        assert (resp.status_code, body) == (200, {"status": "ready"})
    else:
        assert resp.status_code == 503
        assert body == {"code": "not_ready", "message": f"not ready: {down} did not answer", "retryable": True}
