"""The API application in this test's process, on the real database as the API's restricted
role (R-AUTH-4), reached through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from qimpl.api.app import create_app
from qimpl.api.deps import Services
from qimpl.settings import ApiSettings
from qualify.stack._embedded import API_ROLE, with_user

__all__ = ["Client", "with_api"]

Client = httpx.AsyncClient


def with_api(db: str, stack: Any, test: Callable[[Client], Awaitable[None]], *, queue_prefix: str = "t",
             services_hook: Callable[[Services], None] | None = None) -> None:
    """Run ``test`` against the app with database keys (``auth=db``). Temporal is the
    stack's, on a task queue no worker polls, so created runs stay ``queued``.
    ``services_hook`` sees the app's services before the first request."""
    settings = ApiSettings(database_url=with_user(db, API_ROLE), auth="db",
                           temporal_address=stack.info.temporal_address,
                           task_queue=f"{queue_prefix}-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        app = create_app(settings)
        services = Services(settings)
        await services.pool.open()
        app.state.services = services
        if services_hook is not None:
            services_hook(services)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://api") as client:
                await test(client)
        finally:
            await services.pool.close()

    asyncio.run(main())
