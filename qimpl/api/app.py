"""The FastAPI application: ``uvicorn --factory qimpl.api.app:create_app``.

``create_app`` only assembles: the services (``qimpl.api.deps``), the error handlers
(``qimpl.api.errors``) and one router per resource (``qimpl.api.routers``, and the tool
journal's ``qimpl.api.tool_routes``). Routes (R-CREATE-1..7, R-READ-1):

- ``POST /v1/agents/{agent_id}/runs``            create a run (durable, or legacy inline), 202 + receipt
- ``GET  /v1/agents/{agent_id}/runs/{run_id}``   read a run
- ``POST /v1/agents/{agent_id}/runs/{run_id}/cancel``  cancel (R-CANCEL-1)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/resume``  resume (R-RESUME-1..3)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}``  decide (R-APPROVAL-1)
- ``GET  /v1/agents/{agent_id}/runs/{run_id}/events``  the event stream (R-EVENT-2)
- ``POST /v1/answer`` and the legacy controls    (R-CREATE-7, R-LEGACY-1)
- tool results and the operator's reconciliation: ``qimpl.api.tool_routes`` (R-TOOL-3/4)
- ``GET  /metrics``                               Prometheus metrics (R-OPS-6, R-OPS-7)
- ``GET  /healthz``                               liveness (no database or Temporal call)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from qimpl.api import tool_routes
from qimpl.api.deps import Services
from qimpl.api.errors import install_error_handlers
from qimpl.api.routers import controls, events, legacy, operations, runs
from qimpl.db.roles import refuse_unsafe_role
from qimpl.logs import setup_logging
from qimpl.settings import Settings, get_settings

__all__ = ["create_app"]

log = logging.getLogger("qimpl.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application; settings default to the environment's."""
    settings = settings or get_settings()
    services = Services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        setup_logging()
        await services.pool.open()
        app.state.services = services
        async with services.pool.connection() as conn:
            await refuse_unsafe_role(conn, "API", log)
        yield
        await services.pool.close()

    app = FastAPI(title="qimpl durable agent runs", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    # The order is the OpenAPI document's (and matching's): unchanged from the closures.
    for router in (tool_routes.router, legacy.router, operations.router, runs.router,
                   events.router, controls.router):
        app.include_router(router)
    return app
