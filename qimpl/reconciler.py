"""The reconciler (R-OPS-3, R-OPS-4, R-EXEC-8): one sweep of one tenant.

A sweep takes at most ``limit`` candidates, claimed with ``FOR UPDATE SKIP LOCKED`` so
that any number of reconcilers can sweep at once without touching the same run:

1. **Expire** every overdue run in a non-terminal state — including runs no worker ever
   touched — in one transaction with a savepoint per run (an error on one run is logged
   and counted and the sweep goes on); then tell Temporal, best effort, by cancelling the
   run's current workflow.
2. **Prune idempotency keys** older than their retention (24 h by default).
3. **Confirm dispatch** of ``accepted`` runs (and ``queued`` ones whose new generation
   was never started, after an approval) older than ``grace_s``: start the same
   workflow id with duplicates rejected ("already started" counts as confirmed), then
   ``accepted -> queued``. The first unknown outcome stops dispatching for this sweep
   (Temporal is probably down), so no run is held locked for long.

Row locks are the only claim: they end with the transaction, so a crashed reconciler
never leaves a run claimed and forgotten. Each sweep leaves one row in
``reconciler_sweeps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from temporalio.client import Client

from qimpl import metrics
from qimpl.db import runs as repo
from qimpl.dispatch import dispatch
from qimpl.errors import DispatchUnknown
from qimpl.lifecycle import workflow_id
from qimpl.settings import Settings

__all__ = ["SWEEP_LIMIT", "SweepResult", "sweep_tenant"]

log = logging.getLogger("qimpl.reconciler")

SWEEP_LIMIT = 100
_TERMINAL = "('completed', 'failed', 'expired', 'cancelled')"


@dataclass
class SweepResult:
    """What one sweep of one tenant did (counts of runs)."""

    tenant: str
    reconciler: str
    candidates: int = 0
    expired: int = 0
    dispatched: int = 0
    errors: int = 0
    pruned_keys: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _expire(conn: psycopg.AsyncConnection[Any], res: SweepResult, limit: int) -> list[tuple[str, int]]:
    expired: list[tuple[str, int]] = []
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT run_id::text, generation, dispatch_confirmed_at FROM runs"
            f" WHERE tenant_id = %s AND state NOT IN {_TERMINAL} AND deadline_at <= clock_timestamp()"
            " ORDER BY deadline_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (res.tenant, limit),
        )
        rows = await cur.fetchall()
        res.candidates += len(rows)
        for row in rows:
            try:
                async with conn.transaction():  # a savepoint per run
                    await cur.execute(
                        "UPDATE runs SET state = 'expired', row_version = row_version + 1,"
                        " error_code = 'deadline_exceeded', error_message = 'the run''s deadline passed',"
                        " completed_at = clock_timestamp() WHERE run_id = %s",
                        (row["run_id"],),
                    )
                expired.append((row["run_id"], int(row["generation"])))
            except psycopg.Error as exc:
                res.errors += 1
                metrics.RECONCILE_WARNINGS.labels(res.tenant, "expire_failed").inc()
                log.warning("could not expire run %s: %s", row["run_id"], exc.sqlstate,
                            extra={"run_id": row["run_id"]})
    res.expired += len(expired)
    metrics.DEADLINE_EXPIRIES.labels(res.tenant, "reconciler").inc(len(expired))
    return expired


async def _confirm(conn: psycopg.AsyncConnection[Any], client: Client | None, settings: Settings,
                   res: SweepResult, limit: int, grace_s: float) -> None:
    if limit <= 0:
        return
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM runs WHERE tenant_id = %s AND state IN ('accepted', 'queued')"
            " AND lifecycle_version = 2"
            " AND dispatch_confirmed_at IS NULL AND deadline_at > clock_timestamp()"
            " AND accepted_at < clock_timestamp() - make_interval(secs => %s)"
            " ORDER BY accepted_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (res.tenant, grace_s, limit),
        )
        rows = await cur.fetchall()
        res.candidates += len(rows)
        for row in rows:
            if client is None:
                res.errors += 1
                continue
            try:
                await dispatch(client, row, settings)
            except DispatchUnknown as exc:
                res.errors += 1
                metrics.RECONCILE_WARNINGS.labels(res.tenant, "dispatch_unknown").inc()
                log.warning("dispatch of run %s still unknown: %s", row["run_id"], exc,
                            extra={"run_id": str(row["run_id"])})
                client = None  # Temporal is probably down: do not hold the rest locked
                continue
            if row["state"] == "accepted":
                async with conn.transaction():
                    await cur.execute(
                        "UPDATE runs SET state = 'queued', row_version = row_version + 1,"
                        " dispatch_confirmed_at = clock_timestamp() WHERE run_id = %s",
                        (row["run_id"],),
                    )
            # A `queued` run (a new generation after an approval) keeps its state: the
            # worker that claims it records the confirmation.
            res.dispatched += 1
            metrics.DISPATCH_CONFIRMED.labels(res.tenant).inc()


async def _tell_temporal(client: Client | None, expired: list[tuple[str, int]], timeout_s: float) -> None:
    if client is None:
        return
    for run_id, generation in expired:
        try:
            handle = client.get_workflow_handle(workflow_id(run_id, generation))
            await asyncio.wait_for(handle.cancel(), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - best effort: the row is already expired
            log.info("temporal not told of expiry of %s: %s", run_id, type(exc).__name__)


async def sweep_tenant(
    conn: psycopg.AsyncConnection[Any],
    client: Client | None,
    settings: Settings,
    tenant: str,
    *,
    reconciler: str,
    limit: int = SWEEP_LIMIT,
    grace_s: float = 2.0,
) -> SweepResult:
    """One sweep of ``tenant`` on ``conn`` (autocommit). ``client`` None means Temporal is
    unreachable: expiry still happens, dispatch is counted as an error. Raises only for
    database errors outside a single candidate (connection lost)."""
    res = SweepResult(tenant=tenant, reconciler=reconciler)
    started = datetime.now(UTC)
    # The sweep sees and changes this tenant's rows only (row-level security, R-AUTH-4).
    await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
    t0 = time.monotonic()
    expired = await _expire(conn, res, limit)
    await _confirm(conn, client, settings, res, limit - res.candidates, grace_s)
    await conn.execute(
        "INSERT INTO reconciler_sweeps (reconciler, tenant_id, started_at, candidates, expired,"
        " dispatched, errors) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (reconciler, tenant, started, res.candidates, res.expired, res.dispatched, res.errors),
    )
    res.pruned_keys = await repo.prune_idempotency(conn, tenant,
                                                   retention_s=settings.idempotency_retention_s)
    await _tell_temporal(client, expired, settings.dispatch_timeout_s)
    if res.candidates:
        log.info("swept tenant %s: %s", tenant, res.as_dict(),
                 extra={"event": "reconciler.sweep", "duration_ms": round((time.monotonic() - t0) * 1000)})
    return res
