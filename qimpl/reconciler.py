"""The reconciler (R-OPS-3, R-OPS-4, R-OPS-8, R-EXEC-8): one sweep of one tenant.

A sweep looks at most ``limit`` candidates per phase and never holds a row lock across
a call to Temporal:

1. **Expire** every overdue run in a non-terminal state — including runs no worker ever
   touched — claimed with ``FOR UPDATE SKIP LOCKED`` (so any number of reconcilers can
   sweep at once) in one transaction with a savepoint per run (an error on one run is
   logged and counted and the sweep goes on); after the commit, tell Temporal, best
   effort, by cancelling the run's current workflow.
2. **Prune idempotency keys** older than their retention (24 h by default), and **event
   streams** of runs that ended more than ``event_retention_s`` ago, at most 100 runs per
   sweep, claimed with ``SKIP LOCKED`` (R-EVENT-5; ``qimpl.db.events``).
3. **Confirm dispatch** of ``accepted`` runs (and ``queued`` ones whose new generation
   was never confirmed, after an approval) whose current generation was handed to
   dispatch more than ``grace_s`` ago (``dispatch_requested_at``: creation, resume or
   approval — so the reconciler does not race the API's own dispatch): read them
   without a lock, start the same workflow id with duplicates rejected, then confirm
   *that generation* with a compare-and-set. "Already started" confirms only while the
   execution is open; a closed one fails the run ``workflow_vanished``. The first
   unknown outcome stops dispatching for this sweep (Temporal is probably down).
4. **Vanished workflows** (R-OPS-8): ``queued`` and ``running`` runs whose dispatch was
   confirmed more than ``grace_s`` ago are checked against Temporal, up to ``limit`` per
   sweep, round-robin over the tenant's runs. A run whose execution is closed
   (terminated by an operator, timed out) or missing (lost with a non-persistent
   Temporal store) ends ``failed`` with ``workflow_vanished``, its tenant slot is free,
   and a ``qimpl_reconcile_warnings_total`` warning is counted. It is not re-dispatched:
   starting the same workflow id again would restart Temporal's attempt numbers inside
   the same generation, which the forward-only fencing token refuses, and a new
   generation would be a resume nobody asked for.

Every statement waits at most ``api_lock_timeout_s`` for a row lock, and PostgreSQL ends
the session if it stalls inside a transaction that long (``qimpl.db.sessions``). Each sweep leaves
one row in ``reconciler_sweeps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from qimpl import metrics
from qimpl.crashpoints import declare
from qimpl.db import runs as repo
from qimpl.db.events import prune_event_streams
from qimpl.db.sessions import bound_session
from qimpl.dispatch import dispatch, workflow_status
from qimpl.errors import SAFE_MESSAGES, DispatchUnknown
from qimpl.lifecycle import RunState, workflow_id
from qimpl.settings import Settings

__all__ = ["SWEEP_LIMIT", "SweepResult", "sweep_tenant"]

log = logging.getLogger("qimpl.reconciler")

SWEEP_LIMIT = 100

BEFORE_SWEEP_DISPATCH = declare(
    "reconciler.before_dispatch",
    "a sweep read an orphaned run (without a lock) and is about to start its workflow")
AFTER_SWEEP_DISPATCH = declare(
    "reconciler.after_dispatch",
    "a sweep started an orphaned run's workflow; its dispatch not yet confirmed in the database")
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
    workflows_checked: int = 0
    vanished: int = 0
    pruned_keys: int = 0
    pruned_streams: int = 0
    pruned_sweeps: int = 0

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
                        f"UPDATE runs SET {repo.EXPIRE_SET} WHERE run_id = %s",
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
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM runs WHERE tenant_id = %s AND state IN ('accepted', 'queued')"
            " AND lifecycle_version = 2"
            " AND dispatch_confirmed_at IS NULL AND deadline_at > clock_timestamp()"
            " AND coalesce(dispatch_requested_at, accepted_at)"
            "     < clock_timestamp() - make_interval(secs => %s)"
            " ORDER BY coalesce(dispatch_requested_at, accepted_at) LIMIT %s",
            (res.tenant, grace_s, limit),
        )
        rows = await cur.fetchall()
    res.candidates += len(rows)
    for row in rows:
        if client is None:
            res.errors += 1
            continue
        run_id, generation = str(row["run_id"]), int(row["generation"])
        await BEFORE_SWEEP_DISPATCH.areach(run_id=run_id, generation=generation)
        try:
            started = await dispatch(client, row, settings)
        except DispatchUnknown as exc:
            res.errors += 1
            metrics.RECONCILE_WARNINGS.labels(res.tenant, "dispatch_unknown").inc()
            log.warning("dispatch of run %s still unknown: %s", run_id, exc, extra={"run_id": run_id})
            client = None  # Temporal is probably down: try again next sweep
            continue
        await AFTER_SWEEP_DISPATCH.areach(run_id=run_id, generation=generation, started=started)
        try:
            if started == "closed":
                await _vanished(conn, res, run_id, generation, "closed")
            elif await repo.confirm_dispatch(conn, run_id, generation) is not None:
                res.dispatched += 1
                metrics.DISPATCH_CONFIRMED.labels(res.tenant).inc()
        except psycopg.Error as exc:
            res.errors += 1
            log.warning("could not confirm run %s: %s", run_id, exc.sqlstate, extra={"run_id": run_id})


#: Runs whose workflow one sweep found missing: a second sweep must agree before the run
#: is ended (a closed execution is final on one answer).
_missing_since: dict[tuple[str, str, int], float] = {}
#: Per tenant, the last run id checked for a vanished workflow (round-robin cursor).
_vanish_cursor: dict[str, str] = {}
#: Where a round of the cursor starts (every run id is greater).
_FIRST_RUN_ID = "00000000-0000-0000-0000-000000000000"


def _rpc_status(exc: BaseException) -> str | None:
    """The gRPC status name of a Temporal ``RPCError`` (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``,
    …); None for any other error. Never the error's message (it can carry addresses)."""
    return exc.status.name if isinstance(exc, RPCError) else None


def _why(exc: BaseException) -> str:
    """``RPCError (UNAVAILABLE)``, or the exception's type name."""
    status = _rpc_status(exc)
    return f"{type(exc).__name__} ({status})" if status else type(exc).__name__


async def _check_workflows(conn: psycopg.AsyncConnection[Any], client: Client | None,
                           settings: Settings, res: SweepResult, limit: int, grace_s: float) -> None:
    if client is None or limit <= 0:
        return
    try:  # NOT_FOUND must mean "no such execution", never "no such namespace"
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace),
            timeout=timedelta(seconds=settings.dispatch_timeout_s))
    except Exception as exc:  # noqa: BLE001 - Temporal unreachable or misconfigured: next sweep
        log.info("workflows of tenant %s not checked: %s", res.tenant, _why(exc),
                 extra={"event": "reconcile.workflows_unchecked", "tenant": res.tenant,
                        "exc_type": type(exc).__name__, "rpc_status": _rpc_status(exc)})
        return
    after = _vanish_cursor.get(res.tenant, _FIRST_RUN_ID)
    cur = await conn.execute(
        "SELECT run_id::text, generation FROM runs WHERE tenant_id = %s AND lifecycle_version = 2"
        " AND state IN ('queued', 'running') AND deadline_at > clock_timestamp()"
        " AND dispatch_confirmed_at < clock_timestamp() - make_interval(secs => %s)"
        " AND run_id > %s::uuid ORDER BY run_id LIMIT %s",
        (res.tenant, grace_s, after, limit))
    rows = await cur.fetchall()
    # A full page: go on after its last run next sweep; otherwise start the next round
    # from the beginning (never "": not a uuid, it failed every later sweep).
    _vanish_cursor[res.tenant] = rows[-1][0] if len(rows) == limit else _FIRST_RUN_ID
    for run_id, generation in rows:
        try:
            status = await workflow_status(client, workflow_id(run_id, int(generation)),
                                           settings.dispatch_timeout_s)
        except Exception as exc:  # noqa: BLE001 - Temporal unreachable: next sweep
            log.info("workflow of run %s not checked: %s", run_id, _why(exc),
                     extra={"event": "reconcile.workflows_unchecked", "tenant": res.tenant,
                            "run_id": run_id, "exc_type": type(exc).__name__,
                            "rpc_status": _rpc_status(exc)})
            return
        res.workflows_checked += 1
        key = (res.tenant, run_id, int(generation))
        if status == "open":
            _missing_since.pop(key, None)
            continue
        if status == "missing" and key not in _missing_since:
            # Missing is judged on two sweeps, not one answer.
            _missing_since[key] = time.monotonic()
            continue
        _missing_since.pop(key, None)
        try:
            await _vanished(conn, res, run_id, int(generation), status)
        except psycopg.Error as exc:
            res.errors += 1
            log.warning("vanished workflow of run %s not handled: %s", run_id, type(exc).__name__,
                        extra={"run_id": run_id})


async def _vanished(conn: psycopg.AsyncConnection[Any], res: SweepResult, run_id: str,
                    generation: int, status: str) -> None:
    """End a live run whose current workflow closed without it (R-OPS-8)."""
    ended = await repo.end_unowned(conn, run_id, generation=generation, state=RunState.FAILED,
                                   error_code="workflow_vanished", error_message=SAFE_MESSAGES["workflow_vanished"])
    if ended is None:
        return  # it ended (or moved on) by itself meanwhile
    res.vanished += 1
    metrics.RECONCILE_WARNINGS.labels(res.tenant, "workflow_vanished").inc()
    log.warning("run %s: its workflow is %s; the run failed workflow_vanished", run_id, status,
                extra={"run_id": run_id, "event": "reconciler.workflow_vanished"})


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
    await bound_session(conn, lock_timeout_s=settings.api_lock_timeout_s)
    t0 = time.monotonic()
    expired = await _expire(conn, res, limit)
    await _confirm(conn, client, settings, res, limit - res.candidates, grace_s)
    await _check_workflows(conn, client, settings, res, limit, grace_s)
    try:
        res.pruned_streams = await prune_event_streams(
            conn, retention_s=settings.event_retention_s, reconciler=reconciler, limit=limit)
    except psycopg.Error as exc:
        res.errors += 1
        log.warning("event streams of tenant %s not pruned: %s", tenant, exc.sqlstate)
    await conn.execute(
        "INSERT INTO reconciler_sweeps (reconciler, tenant_id, started_at, candidates, expired,"
        " dispatched, errors, pruned) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (reconciler, tenant, started, res.candidates, res.expired, res.dispatched, res.errors,
         res.pruned_streams),
    )
    res.pruned_keys = await repo.prune_idempotency(conn, tenant,
                                                   retention_s=settings.idempotency_retention_s)
    res.pruned_sweeps = await repo.prune_sweeps(conn, tenant, retention_s=settings.sweep_retention_s)
    await _tell_temporal(client, expired, settings.dispatch_timeout_s)
    if res.candidates or res.vanished or res.pruned_streams:
        log.info("swept tenant %s: %s", tenant, res.as_dict(),
                 extra={"event": "reconciler.sweep", "duration_ms": round((time.monotonic() - t0) * 1000)})
    return res
