"""Request limits applied before any route runs (pure ASGI middleware):

- a write to ``/v1/...`` without a *known* API key (client or operator, as the routes'
  own authentication would find it) is answered 401 ``unauthenticated`` before its body
  is read: neither an anonymous caller nor one with any made-up ``Authorization`` value
  can make the API buffer or parse anything (R-AUTH-1). A client route reuses the answer
  for the same key if it is at most ``qimpl.api.deps.AUTHENTICATED_FOR_S`` old (a body
  sent slowly past that is judged by a fresh lookup), and answers 403 for the wrong kind
  of key. Should the lookup find the database unavailable (``psycopg.OperationalError``,
  the pool's timeout included), the write is answered 503 ``database_unavailable`` with
  ``Retry-After: 1`` at once, logged as the route's would be: it had waited for the pool a
  second time in the route to give the same answer. Any other failure of the lookup lets
  the route answer its own way. Both read the first ``Authorization`` header;
- a write whose body declares a ``Content-Encoding`` (gzip, br, …) is answered 415
  ``content_encoding_unsupported``: bodies are read as sent;
- a write whose non-empty body declares a ``Content-Type`` other than JSON
  (``application/json`` or ``application/*+json``) is answered 415
  ``content_type_unsupported``: a ``text/plain`` or form body was answered 422
  ``malformed_body``, which did not say what to change (a browser's ``fetch`` with a string
  body and no header sends ``text/plain``; ``curl -d`` sends a form), and a body without
  one, which FastAPI leaves unparsed, was the same 422;
- a body larger than ``max_body_bytes`` (declared by ``Content-Length``, or counted while
  it streams in, chunked included) is answered 413 ``body_too_large`` without being kept
  whole: at most ``max_body_bytes`` are buffered;
- a request of any method that sends ``Authorization``, ``Idempotency-Key``,
  ``Last-Event-ID`` or ``X-Stream-Key`` more than once is answered 400 ``duplicate_header`` before anything
  else: the API would read the first, a proxy or a log in front of it perhaps the last,
  and the two would disagree on who asked or what was asked (R-AUTH-1, R-CREATE-2);
- a request whose query string names a parameter more than once, but for those a route
  takes as a list (``REPEATABLE_QUERY``), is answered 400 ``duplicate_parameter``: FastAPI
  would keep the last value of ``?tenant=a&tenant=b`` and answer for ``b`` alone, a
  caller who meant both would never know;
- a request whose headers (names and values) exceed ``MAX_HEADER_BYTES`` is answered 431
  ``request_headers_too_large`` before anything else (httptools, uvicorn's parser here,
  bounds nothing; h11's own bound is the same 16 KiB). The server has read them by then:
  a proxy in front bounds what it buffers.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qsl

import psycopg

from qimpl.api.errors import UNAUTHENTICATED_HEADERS, database_unavailable

__all__ = ["MAX_HEADER_BYTES", "REPEATABLE_QUERY", "RequestLimits"]

#: Bytes of a request's header names and values, all headers together.
MAX_HEADER_BYTES = 16 * 1024
#: Query parameters a route takes as a list (``?state=queued&state=running``); every other
#: one may be sent once. A unit test holds this equal to the OpenAPI document's arrays.
REPEATABLE_QUERY = frozenset({"state"})

Scope = dict[str, Any]
Message = dict[str, Any]

_WRITES = frozenset({b"POST", b"PUT", b"PATCH", "POST", "PUT", "PATCH"})
#: Headers a request may send once only: ASGI's lowercase name -> as HTTP spells it.
_SINGLE = {b"authorization": "Authorization", b"idempotency-key": "Idempotency-Key",
           b"last-event-id": "Last-Event-ID", b"x-stream-key": "X-Stream-Key"}


class RequestLimits:
    """ASGI middleware; ``max_body_bytes`` in bytes."""

    def __init__(self, app: Any, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            sent = scope.get("headers") or []
            if sum(len(n) + len(v) for n, v in sent) > MAX_HEADER_BYTES:
                await _answer(send, 431, "request_headers_too_large",
                              f"the request's headers exceed {MAX_HEADER_BYTES} bytes")
                return
            if twice := _sent_twice(sent):
                await _answer(send, 400, "duplicate_header", f"the {twice} header is sent more than once")
                return
            if again := _repeated_parameter(scope.get("query_string") or b""):
                await _answer(send, 400, "duplicate_parameter",
                              f"the {again} query parameter is sent more than once")
                return
        if scope["type"] != "http" or scope["method"] not in _WRITES:
            await self.app(scope, receive, send)
            return
        # The first of each header, as Starlette's ``request.headers.get`` (the routes) reads it.
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers") or []:
            headers.setdefault(name, value)
        if scope["path"].startswith("/v1/"):
            try:
                known = await _known(scope, headers)
            except psycopg.OperationalError as exc:
                # The database is unreachable or the pool had no connection within its
                # timeout: the route would wait for the pool a second time and then answer
                # this same 503. Answer it now, as the route's handler does (and logged).
                await _send_json(send, *database_unavailable(exc))
                return
            if not known:
                await _answer(send, 401, "unauthenticated", "a valid API key is required",
                              headers=UNAUTHENTICATED_HEADERS)
                return
        # Every Content-Encoding header and every coding each lists (a second header, or
        # ``identity, gzip``, encodes the body as surely as one).
        codings = {c.strip().lower() for name, value in scope.get("headers") or []
                   if name == b"content-encoding" for c in value.split(b",")}
        if codings - {b"", b"identity"}:
            # The API reads bodies as sent; a compressed one would be parsed as JSON and
            # refused as malformed: say what is wrong instead.
            await _answer(send, 415, "content_encoding_unsupported",
                          "request bodies are read as sent: no Content-Encoding (gzip, br, ...)")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _answer(send, 413, "body_too_large", f"the body exceeds {self.max_body_bytes} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see it
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await _answer(send, 413, "body_too_large", f"the body exceeds {self.max_body_bytes} bytes")
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if size and not _is_json(media):
            await _answer(send, 415, "content_type_unsupported",
                          "request bodies are JSON: send Content-Type: application/json")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)


def _is_json(media: bytes) -> bool:
    """Whether a Content-Type's media type (lowercase, no parameters) names JSON, as
    FastAPI parses a body: ``application/json`` or ``application/<anything>+json``."""
    kind, _, sub = media.partition(b"/")
    return kind == b"application" and (sub == b"json" or sub.endswith(b"+json"))


def _repeated_parameter(query: bytes) -> str | None:
    """The first query parameter named more than once that is not ``REPEATABLE_QUERY``'s;
    None when there is none. Names are compared as FastAPI reads them (percent-decoded)."""
    counts = Counter(name for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    return next((name for name, n in counts.items() if n > 1 and name not in REPEATABLE_QUERY), None)


def _sent_twice(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The first header of ``_SINGLE`` that ``headers`` (ASGI's, names lowercase) carry
    more than once, as HTTP spells it; None when each is sent at most once."""
    names = [name for name, _ in headers if name in _SINGLE]
    return next((spelt for n, spelt in _SINGLE.items() if names.count(n) > 1), None)


async def _known(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """Whether the request's ``Authorization`` names a known client or operator key.
    True when it cannot be told (no services yet, or the lookup failed): the route then
    authenticates and answers itself. The principal of a key ``authenticate`` finds (a
    client's, or an operator's, which client routes refuse) is left in the scope with the
    time (``qimpl.api.deps.AUTHENTICATED``) for the route: the same request's same key."""
    from qimpl.api.deps import AUTHENTICATED, key_of_header

    key = key_of_header(headers.get(b"authorization", b"").decode("latin-1"))
    if not key:
        return False
    services = getattr(getattr(scope.get("app"), "state", None), "services", None)
    if services is None:
        return True
    try:
        auth = services.authenticator
        principal = await auth.authenticate(key)
        if principal is not None:
            scope[AUTHENTICATED] = (key, principal, time.monotonic())
            return True
        return await auth.authenticate_operator(key) is not None
    except psycopg.OperationalError:
        raise  # the database is unavailable: the caller answers 503 at once
    except Exception:  # noqa: BLE001 - the route's own authentication answers anything else
        return True


async def _answer(send: Any, status: int, code: str, message: str,
                  headers: dict[str, str] | None = None) -> None:
    await _send_json(send, status, {"code": code, "message": message}, headers or {})


async def _send_json(send: Any, status: int, doc: dict[str, Any], headers: dict[str, str]) -> None:
    # As the routes' JSONResponse renders it: one error body, whichever layer answers.
    body = json.dumps(doc, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *((k.lower().encode(), v.encode()) for k, v in headers.items())]})
    await send({"type": "http.response.body", "body": body})
