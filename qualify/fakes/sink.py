"""The side-effect sink: a small HTTP service that behaves like a real payment API, run as
a subprocess of the harness (one per scenario) and called by the harness tools
(``qualify.fakes.tools``) from inside the real worker::

    python -m qualify.fakes.sink --port P --dir D

- ``POST /calls/{call_id}`` (instrumented tools) is idempotent per call id: the first
  request performs the effect (one line in ``D/executions.jsonl``) and answers 200
  ``{"receipt": call_id, "executed": true}``; a later request with the same id executes
  nothing and answers the stored reply with ``"executed": false``.
- ``POST /actions/{call_id}`` (uninstrumented actions) is not idempotent: every request
  executes.
- Every request, first or repeated, is appended to ``D/requests.jsonl`` (with
  ``"repeat"`` and the ``"arguments"`` it carried) before anything else: the harness
  counts requests, since the sink's own idempotency would hide a repeated call, and
  compares what ran with what was journaled.

The body is ``{"run_id", "tool", "arguments", "attempt", "pid"}``; fault controls ride in
``arguments``: ``{"sink_hold_s": 3}`` performs the effect, then holds the reply that long
(the client times out: the reply is lost); ``{"sink_refuse": true}`` answers 422
``{"code": "refused"}`` and executes nothing (a definite failure).

Ready once ``D/sink.ready`` holds its port (``--port 0`` binds any free port) or
``GET /healthz`` answers. Each line is written with one ``write`` of the whole line under
a lock. Idempotency survives a restart on the same directory (replies are rebuilt from
``executions.jsonl``). Standard library only, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Sink", "main"]

_PATH = re.compile(r"^/(calls|actions)/([A-Za-z0-9._:-]{1,200})$")
_KIND = {"calls": "instrumented", "actions": "uninstrumented"}
MAX_BODY = 1 << 20


class Sink:
    """The sink's state and files; thread-safe (one lock for every decision and write)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        #: Stored replies of executed instrumented calls, by call id.
        self.replies: dict[str, dict[str, Any]] = {}
        #: (kind, call id) of every request seen: ``repeat`` of the next one.
        self.seen: set[tuple[str, str]] = set()
        self._rebuild()

    def _rebuild(self) -> None:
        for name, kinded in (("requests.jsonl", True), ("executions.jsonl", False)):
            path = self.dir / name
            if not path.exists():
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                if kinded:
                    self.seen.add((str(doc.get("kind")), str(doc.get("call_id"))))
                elif doc.get("kind") == "instrumented":
                    self.replies[str(doc["call_id"])] = {"receipt": doc["call_id"], "executed": True}

    def _append(self, name: str, doc: dict[str, Any]) -> None:
        line = (json.dumps(doc, sort_keys=True) + "\n").encode()
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def handle(self, kind: str, call_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """Record the request and act on it: (status, reply, seconds to hold the reply)."""
        arguments = body.get("arguments")
        controls = arguments if isinstance(arguments, dict) else {}
        run_id, tool = body.get("run_id"), body.get("tool")
        with self.lock:
            now = time.time()
            repeat = (kind, call_id) in self.seen
            self.seen.add((kind, call_id))
            self._append("requests.jsonl", {
                "call_id": call_id, "run_id": run_id, "tool": tool, "kind": kind,
                "attempt": body.get("attempt"), "pid": body.get("pid"), "t": now, "repeat": repeat,
                "arguments": arguments})
            if kind == "instrumented" and call_id in self.replies:
                return 200, {**self.replies[call_id], "executed": False}, 0.0
            if controls.get("sink_refuse"):
                return 422, {"code": "refused"}, 0.0
            self._append("executions.jsonl", {"call_id": call_id, "run_id": run_id, "tool": tool,
                                              "kind": kind, "t": now})
            reply = {"receipt": call_id, "executed": True}
            if kind == "instrumented":
                self.replies[call_id] = reply
        hold = controls.get("sink_hold_s") or 0
        return 200, dict(reply), float(hold) if isinstance(hold, int | float) else 0.0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: one line per request would drown the scenario's logs

    def _reply(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a held reply): the reply is lost, as intended

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"code": "not_found"})

    def do_POST(self) -> None:
        match = _PATH.match(self.path)
        if match is None:
            self._reply(404, {"code": "not_found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"code": "too_large"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._reply(400, {"code": "bad_json"})
            return
        status, doc, hold_s = self.server.sink.handle(_KIND[match.group(1)], match.group(2), body)
        if hold_s > 0:
            time.sleep(hold_s)  # the effect is recorded; the reply comes too late
        self._reply(status, doc)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, sink: Sink) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.sink = sink

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            return
        # One line, no trace: the harness reads a trace in any log as a product failure.
        print(f"sink.error {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m qualify.fakes.sink", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    sink = Sink(args.dir)
    server = _Server(args.port, sink)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    port = server.server_address[1]
    ready = args.dir / "sink.ready"
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": port, "pid": os.getpid()}))
    tmp.replace(ready)
    print(json.dumps({"event": "sink.ready", "port": port, "pid": os.getpid()}), flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
