"""A fake OpenAI-compatible chat-completions server (R-PROV-1), run by the harness in a
thread of its own; the real worker reaches it over HTTP through the real adapter
(``QIMPL_PROVIDER=openai``, ``QIMPL_OPENAI_BASE_URL=<url>/v1``).

``POST /v1/chat/completions`` answers a streamed (SSE) completion scripted by the run's
prompt (the first user message), a JSON object::

    {"chat": {"tool": {"name": "charge", "arguments": {"amount": 5}},
              "fail": {"1": 500, "2": "timeout"}, "answer": "done"}}

- ``fail`` maps a step (the request's assistant turns + 1) to how the *first* request of
  that step fails: an HTTP status (a JSON error body that quotes the request's
  ``Authorization`` header, as careless servers do: a canary for leaks) or ``"timeout"``
  (the answer is held for ``hold_s`` seconds, past the adapter's request timeout) or
  ``"truncated"`` (two thirds of the text answer, then a clean end of the stream with no
  ``finish_reason`` and no ``[DONE]``) or another way a stream breaks: ``"bad_chunk"`` (a
  chunk that is not JSON), ``"cut_body"`` (the connection closed halfway through the
  announced body), ``"error_event"`` (an error event inside the 200), ``"cut_tool_arguments"``
  (a tool call whose arguments stop halfway, though the turn says ``tool_calls``); a 429
  comes with ``Retry-After: 1``. Later requests of the step are answered normally.
- With ``tool`` and no ``tool`` message yet, the answer is that tool call (``call_1``,
  its arguments in two pieces, ``finish_reason`` ``tool_calls``); otherwise the text ``<answer> <tool message contents>``
  in three deltas. Every answer ends with a usage chunk: ``prompt_tokens`` is the number
  of messages sent, ``completion_tokens`` 3.

Every request is recorded first, as one JSON line in ``<control_dir>/chat_requests.jsonl``
(the body, whether an ``Authorization`` header came and its SHA-256, the step, how it was
answered): the
harness's independent record of what the provider was asked.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["ChatServer", "chat_prompt"]


def chat_prompt(**script: Any) -> str:
    """The prompt that carries a chat script (see the module docstring)."""
    return json.dumps({"chat": script}, sort_keys=True)


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def _chunk(delta: Mapping[str, Any] | None = None, usage: Mapping[str, int] | None = None,
           finish: str | None = None) -> dict[str, Any]:
    return {"id": "fake-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [] if delta is None else [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
            "usage": dict(usage) if usage else None}


class ChatServer:
    """The fake server on 127.0.0.1 (a free port); ``start``/``stop``; ``url`` is its base."""

    def __init__(self, control_dir: Path, *, hold_s: float = 3.0) -> None:
        self.control_dir = control_dir
        self.hold_s = hold_s
        self._seen: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # the harness keeps its own record
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                status, payload, hold = server.answer(body, self.headers.get("Authorization"))
                cut = hold == "cut"
                if hold is True:
                    server._release.wait(server.hold_s)
                try:
                    self.send_response(status)
                    kind = "text/event-stream" if status == 200 else "application/json"
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(payload)))
                    if status == 429:
                        self.send_header("Retry-After", "1")
                    self.end_headers()
                    self.wfile.write(payload[:len(payload) // 2] if cut else payload)
                    if cut:  # half the announced body, then the connection goes
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the client gave up (its timeout): nothing to answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chat-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def answer(self, body: Mapping[str, Any], authorization: str | None) -> tuple[int, bytes, bool | str]:
        """``(status, payload, hold)`` for one request, recorded before it is answered;
        ``hold`` True: held ``hold_s``; ``"cut"``: the body is cut halfway."""
        messages = list(body.get("messages") or [])
        prompt = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        try:
            script = json.loads(prompt).get("chat") or {}
        except (ValueError, AttributeError):
            script = {}
        step = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        with self._lock:
            self._seen[(prompt, step)] += 1
            first = self._seen[(prompt, step)] == 1
        failure = (script.get("fail") or {}).get(str(step)) if first else None
        tool_messages = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        usage = {"prompt_tokens": len(messages), "completion_tokens": 3,
                 "total_tokens": len(messages) + 3}
        if isinstance(failure, int):
            outcome, status = f"http_{failure}", failure
            payload = json.dumps({"error": {"message": f"upstream refused (auth {authorization})"}}).encode()
        elif script.get("tool") and not tool_messages:
            outcome, status = "tool_call", 200
            tool = script["tool"]
            arguments = json.dumps(tool.get("arguments") or {})
            half = len(arguments) // 2
            rest = "" if failure == "cut_tool_arguments" else arguments[half:]
            if failure == "cut_tool_arguments":
                outcome = "cut_tool_arguments"
            payload = _sse([
                _chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": tool["name"], "arguments": arguments[:half]}}]}),
                _chunk({"tool_calls": [{"index": 0, "function": {"arguments": rest}}]},
                       finish="tool_calls"),
                _chunk(usage=usage)])
        else:
            outcome, status = "answer", 200
            text = " ".join([str(script.get("answer", "fake answer")), *tool_messages])
            third = max(len(text) // 3, 1)
            chunks = [_chunk({"role": "assistant", "content": text[:third]}),
                      _chunk({"content": text[third:2 * third]}),
                      _chunk({"content": text[2 * third:]}, finish="stop"), _chunk(usage=usage)]
            if failure == "truncated":
                # Two thirds of the answer, then a clean end: no finish_reason, no [DONE].
                outcome, payload = "truncated", "".join(
                    f"data: {json.dumps(c)}\n\n" for c in chunks[:2]).encode()
            elif failure == "bad_chunk":
                outcome, payload = "bad_chunk", (
                    f"data: {json.dumps(chunks[0])}\n\n" + "data: {\"choices\": [{\"delta\"\n\n"
                    + "data: [DONE]\n\n").encode()
            elif failure == "error_event":
                outcome, payload = "error_event", (
                    f"data: {json.dumps(chunks[0])}\n\n"
                    + 'data: {"error": {"message": "model overloaded", "type": "server_error"}}\n\n').encode()
            else:
                payload = _sse(chunks)
                if failure == "cut_body":
                    outcome = "cut_body"
        if failure == "timeout":
            outcome = "held"
        line = {"t": time.time(), "step": step, "outcome": outcome, "usage": usage,
                "authorized": authorization is not None, "body": dict(body),
                # Which credential came, without writing it down: its digest.
                "authorization_sha256": (hashlib.sha256(authorization.encode()).hexdigest()
                                         if authorization is not None else None)}
        with self._lock, open(self.control_dir / "chat_requests.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
        return status, payload, "cut" if failure == "cut_body" else failure == "timeout"
