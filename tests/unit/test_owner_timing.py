"""A run dispatched with a lease or heartbeat timeout other than the worker's own gets the
API's (it travels in the run's input), but the worker's ready lease sessions and heartbeat
throttle were sized for its own: the worker says so, once per pair (R-EXEC-2, R-EXEC-13)."""

from __future__ import annotations

import logging

import pytest

from qimpl.provider import EchoProvider
from qimpl.workflows.activities import AgentActivities
from qimpl.workflows.types import RunInput
from qualify.up import _product_lease


def _input(lease_s: float, heartbeat_timeout_s: float) -> RunInput:
    return RunInput(run_id="r", tenant_id="t", generation=1, deadline_at="2999-01-01T00:00:00+00:00",
                    lease_s=lease_s, heartbeat_timeout_s=heartbeat_timeout_s)


@pytest.mark.req("R-EXEC-13")
def test_a_run_dispatched_with_other_timing_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    activities = AgentActivities(dsn="postgresql://w@127.0.0.1:1/q", provider=EchoProvider())
    activities.own_timing = (2.0, 4.0)

    def warned() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "owner.timing_differs"]

    with caplog.at_level(logging.WARNING):
        activities._check_timing(_input(2.0, 4.0))
        assert warned() == []
        activities._check_timing(_input(4.0, 4.0))
        activities._check_timing(_input(4.0, 4.0))
        assert [(r.lease_s, r.heartbeat_timeout_s) for r in warned()] == [(4.0, 4.0)]  # type: ignore[attr-defined]
        activities._check_timing(_input(2.0, 8.0))
        assert len(warned()) == 2


def test_qualify_up_derives_the_lease_as_the_product_does() -> None:
    """``qualify up`` gives its processes the lease an unset ``QIMPL_LEASE_S`` means: half
    the heartbeat timeout, the user's ``--set`` one included."""
    assert _product_lease({}) == 2.0
    assert _product_lease({"QIMPL_HEARTBEAT_TIMEOUT_S": "8"}) == 4.0
    assert _product_lease({"QIMPL_HEARTBEAT_TIMEOUT_S": "soon"}) is None
