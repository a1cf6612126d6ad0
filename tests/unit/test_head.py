"""HEAD is GET without its body (RFC 9110 §9.3.2; ``qimpl.api.head``): a load balancer's
``HEAD /healthz`` was 405, and a HEAD on a stream must not stream to nobody."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.responses import StreamingResponse

from qimpl.api.head import HeadAsGet
from tests.unit.test_openapi import KEY, RESUME, RUNS, app  # noqa: F401 - the fixture

pytestmark = pytest.mark.req("R-AUTH-1")


def test_head_answers_as_get_without_the_body(app: FastAPI) -> None:  # noqa: F811
    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            got, head = await client.get("/healthz"), await client.head("/healthz")
            assert got.status_code == head.status_code == 200 and got.content and head.content == b""
            assert head.headers["content-length"] == got.headers["content-length"]
            anonymous = await client.head(RUNS)  # the route's own answer, status and headers
            assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
            post_only = await client.head(RESUME, headers={"Authorization": f"Bearer {KEY}"})
            assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"
            both = await client.delete(RUNS, headers={"Authorization": f"Bearer {KEY}"})
            assert both.headers["allow"] == "GET, HEAD, POST"

    asyncio.run(calls())


def test_a_head_on_a_stream_ends_it() -> None:
    """The app's stream reads a disconnect as soon as the headers are sent: its generator
    stops instead of running for a client that will never read it."""
    stopped = asyncio.Event()

    async def endless() -> Any:
        try:
            while True:
                yield b"data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            stopped.set()

    bare = FastAPI()

    @bare.get("/events")
    async def events() -> StreamingResponse:
        return StreamingResponse(endless(), media_type="text/event-stream")

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=HeadAsGet(bare)),
                                     base_url="http://api") as client:
            head = await asyncio.wait_for(client.head("/events"), timeout=10)
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-type"].startswith("text/event-stream")
            await asyncio.wait_for(stopped.wait(), timeout=10)

    asyncio.run(calls())
