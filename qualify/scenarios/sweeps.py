"""What the reconciler scenarios share: the tenant they reconcile, the reconciler's
settings, its sweep record (``reconciler_sweeps``) and a bounded poll (R-OPS-3)."""

from __future__ import annotations

import json
from typing import Any

from qualify.errors import HarnessError
from qualify.procs import free_port, poll
from qualify.scenarios.base import ScenarioContext

__all__ = [
    "AFTER_ACCEPT",
    "FAST_RECONCILE",
    "OPERATOR_KEY",
    "RECONCILE",
    "TENANT",
    "poll_until",
    "sweep_rows",
    "sweep_rows_between",
    "unreachable_temporal",
]

TENANT = "t-dev"
OPERATOR_KEY = "ops-key"  # an operator of TENANT
AFTER_ACCEPT = "api.after_acceptance_commit"
RECONCILE = {"DURABLE_AGENT_RECONCILE_TENANTS": json.dumps([TENANT]),
             "QIMPL_RECONCILE_INTERVAL_S": "1", "QIMPL_RECONCILE_GRACE_S": "1"}
#: The reconciler every half second, grace 3 s: several sweeps fit in one held dispatch.
FAST_RECONCILE = {"DURABLE_AGENT_RECONCILE_TENANTS": json.dumps([TENANT]),
                  "QIMPL_RECONCILE_INTERVAL_S": "0.5", "QIMPL_RECONCILE_GRACE_S": "3"}


def poll_until(ctx: ScenarioContext, what: str, check: Any, timeout_s: float = 30.0,
               kind: str = "wait_sweep") -> None:
    """Poll ``check()`` every 50 ms until it holds, counted as a wait of ``kind`` in the
    scenario's time ledger. HarnessError naming ``what`` after ``timeout_s`` seconds."""
    with ctx.waiting(kind):
        if not poll(check, timeout_s):
            raise HarnessError(f"{what}: not within {timeout_s} s")


def sweep_rows(ctx: ScenarioContext) -> list[tuple[Any, ...]]:
    """Every recorded sweep, oldest first: ``(reconciler, candidates, expired, dispatched,
    errors, finished_at)``, the time in epoch seconds by the database's clock."""
    return ctx.sql("SELECT reconciler, candidates, expired, dispatched, errors,"
                   " extract(epoch FROM finished_at)::float8 FROM reconciler_sweeps ORDER BY id")


def sweep_rows_between(ctx: ScenarioContext, since: float, until: float | None = None) -> list[tuple[Any, ...]]:
    """Sweeps (as ``sweep_rows``, with ``started_at`` last) that started at or after ``since`` and finished by ``until``
    (epoch seconds by the database's clock)."""
    return [s for s in ctx.sql(
        "SELECT reconciler, candidates, expired, dispatched, errors,"
        " extract(epoch FROM finished_at)::float8, extract(epoch FROM started_at)::float8"
        " FROM reconciler_sweeps ORDER BY id") if s[6] >= since and (until is None or s[5] <= until)]


def unreachable_temporal() -> dict[str, str]:
    """Environment of an API whose Temporal is unreachable (a port nobody listens on)."""
    return {"QIMPL_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "QIMPL_DISPATCH_TIMEOUT_S": "1"}
