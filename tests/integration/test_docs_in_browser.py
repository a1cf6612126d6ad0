"""``/docs`` renders the API's own OpenAPI document in a real browser, offline (issue 59,
item 1): Swagger UI 4.15.5 (swagger-ui-bundle 1.1.0) could not read FastAPI's OpenAPI
3.1.0 and showed "Unable to render this definition". Headless Chromium loads the page with
every request off the API's own host refused, and must show one operation per operation
of ``/openapi.json`` and no error. Needs no database: the app is served without its
lifespan (``/docs`` and ``/openapi.json`` touch none)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from qimpl.api.app import create_app
from qimpl.settings import ApiSettings
from tests.integration.browser import CHROMIUM, CHROMIUM_ARGS, browser_or_skip

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@pytest.fixture
def api_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API did not start within 20 s"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_docs_render_the_openapi_document_offline(api_url: str, tmp_path: Path) -> None:
    sync_playwright = browser_or_skip()
    doc = httpx.get(f"{api_url}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    operations = sum(1 for by_method in doc["paths"].values() for m in by_method if m in METHODS)
    assert operations >= 20
    refused: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def offline(route: Any) -> None:
                if route.request.url.startswith(api_url + "/"):
                    route.continue_()
                else:   # a CDN, a font, a validator badge: the page must not need it
                    refused.append(route.request.url)
                    route.abort()

            page.route("**/*", offline)
            page.goto(f"{api_url}/docs")
            # Rendered: its operations, or its error (either ends the wait; 30 s on a loaded machine).
            page.wait_for_function(
                "document.querySelector('.opblock, .errors-wrapper')"
                " || /Unable to render|Failed to load/.test(document.body.innerText)", timeout=30_000)
            page.screenshot(path=str(tmp_path / "docs-1280.png"), full_page=False)
            text = page.inner_text("body")
            assert "Unable to render" not in text and page.locator(".errors-wrapper").count() == 0, text[:500]
            shown = page.locator(".opblock").count()
            assert shown == operations, f"{shown} operations shown of {operations}"
            assert doc["info"]["title"] in text
        finally:
            browser.close()
    assert not refused, refused
