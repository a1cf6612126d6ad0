"""HEAD served as GET without its body (RFC 9110 §9.3.2), as a pure ASGI middleware.

FastAPI routes a HEAD only to routes that declare it, and none does: a load balancer's or
an uptime monitor's ``HEAD /healthz`` was 405. Here a HEAD runs as the GET of the same
path, with the same status and headers (``Content-Length`` included), and no body: the
first body message ends the response, and the app then reads a disconnect, so a stream
(``GET .../events``) stops at once instead of streaming to nobody. A path without a GET
stays 405, its ``Allow`` naming HEAD beside GET where GET is served.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["HeadAsGet"]

Scope = dict[str, Any]
Message = dict[str, Any]


class HeadAsGet:
    """ASGI middleware: a ``HEAD`` request is run as ``GET``; only the response's start
    and one empty, final body message are sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = asyncio.Event()

        async def head_receive() -> Message:
            if not ended.is_set():
                client = asyncio.ensure_future(receive())
                end = asyncio.ensure_future(ended.wait())
                done, _ = await asyncio.wait({client, end}, return_when=asyncio.FIRST_COMPLETED)
                if client in done:
                    end.cancel()
                    return dict(client.result())
                client.cancel()
            return {"type": "http.disconnect"}

        async def head_send(message: Message) -> None:
            if ended.is_set():
                return
            if message["type"] == "http.response.body":
                ended.set()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, head_receive, head_send)
