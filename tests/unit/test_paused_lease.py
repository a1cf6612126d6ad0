"""The pause scenarios run with the lease their deployment names (bench judges their
figure against it, R-EXEC-11)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qualify.processes import Deployment
from qualify.scenarios.lease import _paused


def _ctx(**kw: Any) -> Any:
    deployment = Deployment(dsn="postgresql://x/y", temporal_address="t:1", task_queue="q",
                            control_dir=Path("/c"), logs_dir=Path("/l"), **kw)
    return SimpleNamespace(deployment=deployment, figures={})


@pytest.mark.req("R-EXEC-11")
def test_the_harness_pauses_owners_with_a_3_s_lease() -> None:
    ctx = _ctx()
    assert _paused(ctx) == {"QIMPL_LEASE_S": "3.0"}
    assert ctx.figures == {"paused_lease_s": 3.0}


@pytest.mark.req("R-EXEC-11")
def test_the_bench_gives_them_the_default_lease() -> None:
    ctx = _ctx(heartbeat_timeout_s=2.0, paused_lease_s=2.0)
    assert _paused(ctx) == {"QIMPL_LEASE_S": "2.0"}
    assert ctx.figures == {"paused_lease_s": 2.0}
