"""Operator surfaces of the API process: ``/metrics`` (R-OPS-6, R-OPS-7), ``/healthz``
(liveness) and ``/readyz`` (readiness)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from fastapi import APIRouter, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from qimpl import metrics
from qimpl.api.deps import OperatorPrincipal, Svc
from qimpl.api.models import ErrorBody
from qimpl.api.openapi import errors

__all__ = ["DOCS_ASSETS", "READY_TIMEOUT_S", "router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition (`text/plain; version=0.0.4`)",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
    **errors(s401="unauthenticated", s403="operator_credential_required (a client key, R-OPS-7)")})
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


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: ``{"status": "ok"}`` while the process serves requests. It asks neither the
    database nor Temporal (``/readyz`` does); no credential."""
    return {"status": "ok"}


#: How long ``/readyz`` waits for each dependency, seconds.
READY_TIMEOUT_S = 2.0


@router.get("/readyz", responses={
    200: {"description": '`{"status": "ready"}`'},
    503: {"model": ErrorBody, "description": "codes: not_ready (the message names what did not answer: "
                                             "the database, Temporal, or both)"}})
async def readyz(svc: Svc) -> JSONResponse:
    """Readiness for a load balancer or an orchestrator: 200 ``{"status": "ready"}`` when a
    pooled database connection answers ``SELECT 1`` and Temporal answers its health check,
    each within READY_TIMEOUT_S seconds; else 503 ``not_ready`` (retryable) naming which did
    not. No credential; it says nothing but that (never an address or an error's text)."""

    async def database() -> None:
        async with svc.connection() as conn:
            await conn.execute("SELECT 1")

    async def temporal() -> None:
        client = await svc.temporal()
        await client.service_client.check_health(timeout=timedelta(seconds=READY_TIMEOUT_S))

    probes = {"the database": database(), "Temporal": temporal()}
    # Both at once: a probe answers within READY_TIMEOUT_S however many dependencies are down.
    results = await asyncio.gather(*(asyncio.wait_for(p, timeout=READY_TIMEOUT_S) for p in probes.values()),
                                   return_exceptions=True)
    down = []
    for name, result in zip(probes, results, strict=True):
        if isinstance(result, BaseException):  # any failure means not ready
            log.info("not ready: %s did not answer (%s)", name, type(result).__name__)
            down.append(name)
    if down:
        return JSONResponse({"code": "not_ready", "message": f"not ready: {' and '.join(down)} did not answer",
                             "retryable": True}, 503)
    return JSONResponse({"status": "ready"})


#: Where the API serves Swagger UI's own files (``swagger_ui_bundle``, mounted by the app).
DOCS_ASSETS = "/docs-assets"


@router.get("/docs", include_in_schema=False)
async def docs() -> Response:
    """Swagger UI for the OpenAPI document, from assets this process serves itself
    (``DOCS_ASSETS``): it works on a machine with no route to a CDN."""
    return get_swagger_ui_html(openapi_url="/openapi.json", title="qimpl durable agent runs — API",
                               swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")
