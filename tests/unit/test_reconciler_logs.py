"""A sweep that cannot check a tenant's workflows says why in a machine-readable way: the
event, the exception's type and Temporal's gRPC status, never the error's message (R-OPS-3)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from qimpl.reconciler import SweepResult, _check_workflows, _rpc_status, _why

REFUSED = "connection to 10.0.0.7:7233 refused"


def test_an_unchecked_sweep_names_the_rpc_status_and_nothing_else() -> None:
    err = RPCError(REFUSED, RPCStatusCode.UNAVAILABLE, b"")
    assert (_rpc_status(err), _why(err)) == ("UNAVAILABLE", "RPCError (UNAVAILABLE)")
    assert "10.0.0.7" not in _why(err)
    assert (_rpc_status(TimeoutError()), _why(TimeoutError())) == (None, "TimeoutError")


@pytest.mark.req("R-OPS-3")
def test_a_sweep_that_cannot_reach_temporal_logs_its_event(caplog: pytest.LogCaptureFixture) -> None:
    async def unreachable(*_: Any, **__: Any) -> None:
        raise RPCError(REFUSED, RPCStatusCode.UNAVAILABLE, b"")

    client = SimpleNamespace(namespace="default",
                             workflow_service=SimpleNamespace(describe_namespace=unreachable))
    settings = SimpleNamespace(dispatch_timeout_s=1.0)
    res = SweepResult(tenant="acme", reconciler="r")
    with caplog.at_level(logging.INFO, logger="qimpl"):
        asyncio.run(_check_workflows(None, client, settings, res, 10, 6.0))  # type: ignore[arg-type]
    lines = [r for r in caplog.records if getattr(r, "event", None) == "reconcile.workflows_unchecked"]
    assert [(r.tenant, r.exc_type, r.rpc_status) for r in lines] == [  # type: ignore[attr-defined]
        ("acme", "RPCError", "UNAVAILABLE")]
    assert REFUSED not in caplog.text
    assert res.workflows_checked == 0
