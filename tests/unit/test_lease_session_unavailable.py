"""An agent attempt that gets no ready lease session within the lease (the database
refusing connections, or every session in use) is retried as its own kind, counted and
logged apart from a fenced owner (``qimpl.db.lease_carriers``, R-EXEC-2)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from qimpl import metrics
from qimpl.errors import LeaseSessionUnavailable
from qimpl.provider import EchoProvider
from qimpl.workflows.activities import AgentActivities
from qimpl.workflows.types import RunInput

DSN = "postgresql://qimpl_worker@127.0.0.1:1/qimpl"


class _NoReadySession:
    """Lease sessions that never have room for one more run."""

    def serves(self, dsn: str, lease_s: float) -> bool:
        return True

    async def carry(self, run_id: str, *, scope: tuple[str, str]) -> Any:
        raise LeaseSessionUnavailable("no lease session with room within 2 s")

    async def release(self, carried: Any, *, clean: bool = True) -> None:
        raise AssertionError("nothing was carried")


@pytest.mark.req("R-EXEC-2")
def test_no_lease_session_is_retried_as_its_own_kind_not_as_a_fenced_owner(
        caplog: pytest.LogCaptureFixture) -> None:
    activities = AgentActivities(dsn=DSN, provider=EchoProvider(), carriers=_NoReadySession())  # type: ignore[arg-type]
    inp = RunInput(run_id="00000000-0000-0000-0000-000000000001", tenant_id="t", generation=1,
                   deadline_at="2999-01-01T00:00:00+00:00", lease_s=2.0)
    before = metrics.LEASE_SESSIONS_UNAVAILABLE._value.get()
    with caplog.at_level(logging.INFO), pytest.raises(ApplicationError) as raised:
        asyncio.run(ActivityEnvironment().run(activities.run_agent, inp))
    assert raised.value.type == "LeaseSessionUnavailable"
    assert not raised.value.non_retryable
    assert metrics.LEASE_SESSIONS_UNAVAILABLE._value.get() == before + 1
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "owner.no_lease_session" in events
    assert "owner.fenced" not in events
