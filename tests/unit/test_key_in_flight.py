"""A key whose first request is still being answered: 409 ``idempotency_key_in_flight``
with ``Retry-After: 1`` (R-CREATE-2). It said the in-flight bound's remaining seconds
(6 s by default) while the first request is usually answered within milliseconds: a
client that obeyed waited 6 s for a replay already there (a tester's finding)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qimpl.api import receipts
from qimpl.api.errors import ApiError
from qimpl.settings import Settings


@pytest.mark.req("R-CREATE-2")
@pytest.mark.parametrize("age_s", [0.0, 0.05, 3.0])
def test_a_key_in_flight_asks_for_a_retry_in_one_second(monkeypatch: pytest.MonkeyPatch, age_s: float) -> None:
    async def get_run(_conn: Any, _run_id: str) -> dict[str, Any]:
        return {"run_id": "r", "state": "accepted", "dispatch_confirmed_at": None}

    monkeypatch.setattr(receipts.repo, "get_run", get_run)
    record = {"fingerprint": "f", "run_id": "r", "completed_at": None, "age_s": age_s}
    settings = Settings.model_construct(dispatch_timeout_s=5.0)
    with pytest.raises(ApiError) as err:
        asyncio.run(receipts.replayable(None, record, "f", settings))
    assert (err.value.status, err.value.code, err.value.extra) == (409, "idempotency_key_in_flight",
                                                                   {"retry_after": 1})
