"""A real browser follows a run's events (issue 25, item 5; R-EVENT-6): headless Chromium
on a page of another origin opens ``EventSource`` on the events URL with a stream token
(``EventSource`` cannot send ``X-Stream-Key``), through the API's CORS allow-list. It sees
every event of the run's journal exactly once, in order, ending with the terminal event,
and its automatic reconnection after the end gets 204 and stops: the source is CLOSED and
no reconnect loop follows.

Needs Debian's Chromium (``/usr/bin/chromium``) and the ``playwright`` package (the dev
extra); ``.ci/run`` installs both and sets ``QIMPL_REQUIRE_BROWSER=1``, so there a missing
browser fails the test instead of skipping it."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from qualify.fakes.synthetic import make_prompt
from qualify.processes import Deployment, Processes
from tests.integration.browser import CHROMIUM, CHROMIUM_ARGS, browser_or_skip

KINDS = ("state", "checkpoint", "tool_call", "tool_result", "claim", "failure", "usage", "output", "terminal")

PAGE = """<!doctype html><meta charset="utf-8"><title>follow a run</title><script>
window.got = []; window.opens = 0; window.errors = 0;
const es = window.es = new EventSource(new URLSearchParams(location.search).get("src"));
es.onopen = () => { window.opens += 1; };
for (const kind of KINDS) es.addEventListener(kind, (e) => window.got.push([e.lastEventId, kind]));
es.onerror = () => { window.errors += 1; };
</script>""".replace("KINDS", json.dumps(KINDS))


@pytest.fixture
def page_server() -> Iterator[str]:
    """A page of another origin than the API's (another port), serving ``PAGE``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.req("R-EVENT-6", "R-EVENT-2")
def test_a_browser_follows_a_run_with_eventsource_and_a_stream_token(stack: Any, page_server: str) -> None:
    sync_playwright = browser_or_skip()
    work = Path(tempfile.mkdtemp(prefix="qualify-browser-"))
    (work / "control").mkdir()
    dsn = stack.create_database()
    processes = Processes(Deployment(
        dsn=dsn, temporal_address=stack.info.temporal_address, task_queue=f"browser-{uuid.uuid4().hex[:8]}",
        control_dir=work / "control", logs_dir=work / "logs",
        extra_env={"QIMPL_CORS_ORIGINS": json.dumps([page_server])}))
    try:
        api = processes.spawn_api(access_log=True).wait_ready()
        processes.worker()
        auth = {"Authorization": "Bearer dev-key"}
        created = httpx.post(f"{api.base_url}/v1/agents/agent-1/runs", timeout=30,
                             json={"prompt": make_prompt(steps=3, answer="seen in a browser", delay_ms=300),
                                   "durable_temporal": True},
                             headers={**auth, "Idempotency-Key": str(uuid.uuid4())})
        assert created.status_code == 202, created.text
        run_id = created.json()["run_id"]
        minted = httpx.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/stream-token", json={"ttl_s": 120},
                            headers=auth, timeout=30)
        assert minted.status_code == 200, minted.text
        src = f"{api.base_url}{minted.json()['events_path']}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(f"{page_server}/?{httpx.QueryParams({'src': src})}")
                page.wait_for_function("window.got.some(e => e[1] === 'terminal')", timeout=60_000)
                # EventSource reconnects once the server ends the stream; the 204 stops it for good.
                page.wait_for_function("window.es.readyState === EventSource.CLOSED", timeout=30_000)
                got = page.evaluate("window.got")
                opens = page.evaluate("window.opens")
                time.sleep(4.0)  # a loop would open again within its retry delay (3 s); none may
                assert page.evaluate("window.opens") == opens == 1
                assert page.evaluate("window.es.readyState") == 2  # CLOSED
            finally:
                browser.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            journal = [(str(seq), kind) for seq, kind in conn.execute(
                "SELECT seq, kind FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,))]
        assert [tuple(e) for e in got] == journal, (got, journal)
        assert journal[-1][1] == "terminal"
        # The API saw the stream and one reconnection, answered 204; nothing after it.
        requests = [line for line in (work / "logs" / "api-1.log").read_text().splitlines()
                    if f"/runs/{run_id}/events?" in line]
        assert [r.rsplit(" ", 1)[-1].rstrip('"}') for r in requests] == ["200", "204"], requests
        assert all("stream_token=<redacted>" in r for r in requests), "the access log redacts the token"
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
