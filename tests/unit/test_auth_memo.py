"""A write's key is looked up once per request (``qimpl.api.limits``), but the answer only
stands for ``AUTHENTICATED_FOR_S``: a body sent slowly past it is judged by a fresh lookup,
so a key revoked meanwhile is refused (R-AUTH-1, R-AUTH-2)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from qimpl.api.auth import Principal
from qimpl.api.deps import AUTHENTICATED, AUTHENTICATED_FOR_S, principal_of
from qimpl.api.errors import ApiError

CLIENT = Principal("t", "p", "client")


def _request(memo: tuple[str, Principal, float] | None, revoked: bool) -> tuple[Request, list[str]]:
    looked_up: list[str] = []

    async def authenticate(key: str) -> Principal | None:
        looked_up.append(key)
        return None if revoked else CLIENT

    app = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(
        authenticator=SimpleNamespace(authenticate=authenticate))))
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/agents/a/runs",
                             "headers": [(b"authorization", b"Bearer k1")], "app": app}
    if memo is not None:
        scope[AUTHENTICATED] = memo
    return Request(scope), looked_up


@pytest.mark.req("R-AUTH-2")
def test_the_guards_answer_is_reused_only_while_fresh_and_for_the_same_key() -> None:
    fresh, looked_up = _request(("k1", CLIENT, time.monotonic()), revoked=True)
    assert asyncio.run(principal_of(fresh)) == CLIENT and looked_up == []
    stale, looked_up = _request(("k1", CLIENT, time.monotonic() - AUTHENTICATED_FOR_S - 0.1), revoked=True)
    with pytest.raises(ApiError) as refused:
        asyncio.run(principal_of(stale))
    assert (refused.value.status, refused.value.code, looked_up) == (401, "unauthenticated", ["k1"])
    other, looked_up = _request(("k0", CLIENT, time.monotonic()), revoked=False)
    assert asyncio.run(principal_of(other)) == CLIENT and looked_up == ["k1"]
