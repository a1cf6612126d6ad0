"""The FastAPI application: ``uvicorn --factory qimpl.api.app:create_app``.

``create_app`` only assembles: the services (``qimpl.api.deps``), the error handlers
(``qimpl.api.errors``) and one router per resource (``qimpl.api.routers``, and the tool
journal's ``qimpl.api.routers.tools``). Routes (R-CREATE-1..7, R-READ-1):

- ``POST /v1/agents/{agent_id}/runs``            create a run (durable, or legacy inline), 202 + receipt
- ``GET  /v1/agents/{agent_id}/runs``            the caller's runs; ``GET /v1/operator/runs`` an operator's (R-READ-5)
- ``GET  /v1/agents/{agent_id}/runs/{run_id}``   read a run
- ``POST /v1/agents/{agent_id}/runs/{run_id}/cancel``  cancel (R-CANCEL-1)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/resume``  resume (R-RESUME-1..3)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}``  decide (R-APPROVAL-1)
- ``GET  /v1/agents/{agent_id}/runs/{run_id}/events``  the event stream (R-EVENT-2)
- ``POST /v1/answer`` and the legacy controls    (R-CREATE-7, R-LEGACY-1)
- tool results and the operator's reconciliation: ``qimpl.api.routers.tools`` (R-TOOL-3/4)
- ``GET  /metrics``                               Prometheus metrics (R-OPS-6, R-OPS-7)
- ``GET  /healthz``                               liveness (no database or Temporal call)
- ``GET  /readyz``                                readiness (the database and Temporal answer)
- ``GET  /docs``                                  Swagger UI 5 (it reads OpenAPI 3.1), its assets served from the swagger-ui-bundle-v2 package (offline)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from psycopg_pool import PoolTimeout

from qimpl.api.cors import CodedCORSMiddleware
from qimpl.api.deps import Services
from qimpl.api.errors import install_error_handlers
from qimpl.api.head import HeadAsGet
from qimpl.api.limits import RequestLimits
from qimpl.api.routers import controls, events, legacy, listing, operations, runs, tools
from qimpl.db.roles import refuse_unsafe_role
from qimpl.logs import setup_logging
from qimpl.settings import (
    ApiSettings,
    exit_config,
    load_or_exit,
    plugin_error,
    warn_no_watcher_margin,
)

__all__ = ["create_app"]

log = logging.getLogger("qimpl.api")

#: How long the API's start waits for its first database connection.
DB_START_TIMEOUT_S = 10.0


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """Build the application.

    Without ``settings`` (how ``uvicorn --factory`` calls it) this is the process's start:
    logging is set up first, so that every line, uvicorn's own start lines included, is
    JSON; the settings are read from the environment (``ApiSettings``) and the provider
    (``QIMPL_PROVIDER``) is loaded. A missing or malformed setting, or a provider that
    does not load, stops the process with one line on stderr naming the variable and exit
    code 64 (``qimpl.settings.EXIT_CONFIG``). With ``settings`` (tests) the caller's
    logging is left alone and a bad provider raises ValueError."""
    if settings is None:
        setup_logging()
        settings = load_or_exit(ApiSettings, "api")
        services = Services(settings)
        try:
            services.provider  # noqa: B018 - loaded now: a bad plugin stops the start
        except ValueError as exc:
            exit_config(plugin_error(ApiSettings, "provider", exc), "api")
    else:
        services = Services(settings)
        services.provider  # noqa: B018 - validated at build time

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            # Wait for one connection: an unreachable database stops the start here, in
            # seconds, with one line naming it (not a pool timeout at the first request).
            await services.open(DB_START_TIMEOUT_S)
        except PoolTimeout:
            # The pool keeps no reason: one direct connect tells a refused login (a wrong
            # password, role or database name) from a server out of reach.
            problem = await services.connect_problem()
            log.error("the API has no database connection (QIMPL_DATABASE_URL) within %s s: %s",
                      DB_START_TIMEOUT_S, problem.summary, extra={"event": f"api.{problem.code}"})
            await services.pool.close()
            raise
        app.state.services = services
        warn_no_watcher_margin(services.settings, log)  # the API dispatches both
        async with services.pool.connection() as conn:
            await refuse_unsafe_role(conn, "API", log, worker_functions=False)
        services.events.start()
        yield
        await services.events.stop()
        await services.pool.close()

    # /docs is served by the operations router from packaged assets (no CDN); no /redoc.
    # No redirect from a path with a trailing slash: a 307 whose Location is built from the
    # request's Host header (a tester's finding); such a path is 404 ``not_found``.
    app = FastAPI(title="qimpl durable agent runs", version="0.1.0", lifespan=lifespan,
                  docs_url=None, redoc_url=None, redirect_slashes=False)
    app.mount(operations.DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path),
              name="docs-assets")
    install_error_handlers(app)
    app.add_middleware(HeadAsGet)  # innermost: the limits and the access log see the HEAD
    app.add_middleware(RequestLimits, max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        # Outermost: a browser's preflight is answered before the limits read anything.
        # Only the listed origins (an allow-list, never "*"); no cookies are involved.
        app.add_middleware(CodedCORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_credentials=False, max_age=600,
                           allow_headers=["Authorization", "Content-Type", "Idempotency-Key",
                                          "Last-Event-ID", "X-Stream-Key"],
                           expose_headers=["Idempotent-Replayed", "Retry-After"])
    # The order is the OpenAPI document's (and matching's): unchanged from the closures.
    for router in (tools.router, legacy.router, operations.router, runs.router,
                   events.router, controls.router, listing.router):
        app.include_router(router)
    return app
