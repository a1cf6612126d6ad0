"""Operator surfaces of the API process: ``/metrics`` (R-OPS-6, R-OPS-7) and ``/healthz``."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from qimpl import metrics
from qimpl.api.deps import OperatorPrincipal, Svc

__all__ = ["router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics_endpoint(svc: Svc, principal: OperatorPrincipal) -> Response:
    """Prometheus metrics (R-OPS-6) for an operator key (R-OPS-7): without a key 401
    ``unauthenticated``, with a client key 403 ``operator_credential_required``. The run
    gauges are the operator's own tenant's, recomputed per scrape from the database under
    row-level security (an index-only scan of that tenant's entries); worker availability
    comes from Temporal's view of the task queue (best effort: when Temporal does not
    answer within 2 s the pollers gauge is left out, unknown, rather than reporting a
    stale count)."""
    async with svc.tenant(principal.tenant_id) as conn:
        stats = await metrics.tenant_run_stats(conn, principal.tenant_id)
    pollers = True
    try:
        client = await svc.temporal()
        await asyncio.wait_for(metrics.refresh_pollers(client, svc.settings), timeout=2)
    except Exception as exc:  # noqa: BLE001 - metrics never fail the scrape
        pollers = False
        log.info("poller metrics unavailable: %s", type(exc).__name__)
    body = metrics.scrape(metrics.run_families(principal.tenant_id, stats), pollers=pollers)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
