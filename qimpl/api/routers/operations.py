"""Operator surfaces of the API process: ``/metrics`` (R-OPS-6) and ``/healthz``."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from qimpl import metrics
from qimpl.api.deps import Svc

__all__ = ["router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics_endpoint(svc: Svc) -> Response:
    """Prometheus metrics (R-OPS-6); gauges are recomputed from the database per scrape,
    worker availability from Temporal's view of the task queue (best effort: when
    Temporal does not answer within 2 s the pollers gauge is left out, unknown, rather
    than reporting a stale count)."""
    async with svc.pool.connection() as conn:
        await metrics.refresh_from_db(conn)  # through a SECURITY DEFINER aggregate
    try:
        client = await svc.temporal()
        await asyncio.wait_for(metrics.refresh_pollers(client, svc.settings), timeout=2)
    except Exception as exc:  # noqa: BLE001 - metrics never fail the scrape
        metrics.WORKER_POLLERS.clear()
        log.info("poller metrics unavailable: %s", type(exc).__name__)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
