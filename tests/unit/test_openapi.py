"""The served OpenAPI document lists every route, its body and every error code it can
return (issue: API contract), its bearer security scheme and the headers a route requires
(issue 15, item 6) — documenting them changes no runtime behaviour."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response

from qimpl.api import models
from qimpl.api.app import create_app
from qimpl.api.deps import Services
from qimpl.api.limits import MAX_HEADER_BYTES, REPEATABLE_QUERY
from qimpl.api.routers import runs as runs_module
from qimpl.api.validation import VALIDATION_CODES, code_for
from qimpl.settings import ApiSettings

#: Never connected to: these tests build the app without its lifespan.
DSN = "postgresql://qimpl_api@127.0.0.1:1/qimpl"

EXPECTED = {
    ("post", "/v1/agents/{agent_id}/runs"): {"202", "400", "401", "409", "422", "503"},
    ("get", "/v1/agents/{agent_id}/runs/{run_id}"): {"200", "401", "404", "422"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/cancel"): {"200", "401", "404", "422"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/resume"): {"202", "400", "401", "404", "409", "422", "503"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}"): {"200", "401", "404", "409", "422"},
    ("get", "/v1/agents/{agent_id}/runs/{run_id}/events"): {"200", "401", "404", "410", "422"},
    ("post", "/v1/answer"): {"200", "401", "422", "502"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/pause"): {"401", "404", "409", "501"},
}


@pytest.mark.req("R-CREATE-1")
def test_every_route_lists_its_error_codes() -> None:
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    for (method, path), statuses in EXPECTED.items():
        op = doc["paths"][path][method]
        assert statuses <= set(op["responses"]), (method, path, sorted(op["responses"]))
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                assert resp["description"].startswith("codes: "), (path, status)
    create_422 = doc["paths"]["/v1/agents/{agent_id}/runs"]["post"]["responses"]["422"]["description"]
    assert "prompt_empty" in create_422 and "idempotency_key_reused" in create_422
    assert "requestBody" in doc["paths"]["/v1/agents/{agent_id}/runs"]["post"]
    legacy = [p for p in doc["paths"] if p.endswith(("/pause", "/handoff", "/branch", "/rollback"))]
    assert len(legacy) == 4


#: A valid body of each request model; each field is then spoiled in turn.
VALID_BODIES: dict[str, dict[str, Any]] = {
    "CreateRunRequest": {"prompt": "x"}, "ResumeRequest": {}, "AnswerIn": {"prompt": "x"},
    "ApprovalDecision": {"approved": True, "action_version": "ab"}, "ToolResult": {"result": {}},
    "Resolution": {"outcome": "succeeded", "note": "n"}, "StreamTokenRequest": {}, "CancelRequest": {},
}
SPOILERS: tuple[Any, ...] = (5, "", " ", "a\x00", "x" * 40_000, -1, 10**9, 1.5, None, True, {}, [], "zz")


def _codes_of(model: type[Any], valid: dict[str, Any]) -> set[str]:
    """Every code a body of ``model`` can get: each field missing, then each spoiled."""
    from pydantic import ValidationError

    bodies = [{k: v for k, v in valid.items() if k != name} for name in model.model_fields]
    bodies += [{**valid, name: bad} for name in model.model_fields for bad in SPOILERS]
    bodies += [{**valid, "surprise": 1}]
    got = set()
    for body in bodies:
        try:
            model.model_validate(body)
        except ValidationError as err:
            got |= {code_for({**e, "loc": ("body", *e["loc"])}) for e in err.errors()}
    return got


@pytest.mark.req("R-CREATE-1")
def test_each_route_lists_the_validation_codes_its_body_can_get_and_no_others() -> None:
    """A route's 422 lists every code its own body (and parameters) can get, and a route
    without a body lists no body's codes (every route listed every validation code)."""
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    seen = set()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            listed = op.get("responses", {}).get("422", {}).get("description", "")
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            refs = [r["$ref"] for r in (schema, *schema.get("anyOf", ())) if "$ref" in r]  # an optional body: anyOf
            name = refs[0].rsplit("/", 1)[-1] if refs else ""
            if name:
                seen.add(name)
                for code in _codes_of(getattr(models, name), VALID_BODIES[name]):
                    assert code in listed, (method, path, code)
            elif listed:
                body_only = {c for c in VALIDATION_CODES if c != "invalid_parameter"}
                assert not [c for c in body_only if f"{c}" in listed.replace("invalid_parameter", "")], (
                    method, path, listed)
    assert seen == set(VALID_BODIES)


@pytest.mark.req("R-OPS-7")
def test_every_route_that_reads_the_database_documents_its_503s() -> None:
    """Any route that takes an API key looks it up in PostgreSQL, so it can answer 503
    ``run_busy`` or ``database_unavailable`` (with Retry-After); the document says so
    (a tester held a table lock: create, read, list and events answered codes they did
    not document)."""
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if (method, path) in BEARER_FREE - {("get", "/v1/agents/{agent_id}/runs/{run_id}/events")}:
                continue
            if path.startswith("/docs") or path == "/openapi.json":
                continue
            got = op.get("responses", {}).get("503", {})
            assert "run_busy" in got.get("description", "") and "database_unavailable" in got["description"], (
                method, path)
            assert "Retry-After" in got.get("headers", {}), (method, path)
    resume = doc["paths"]["/v1/agents/{agent_id}/runs/{run_id}/resume"]["post"]["responses"]
    assert "idempotency_key_in_flight" in resume["409"]["description"]
    assert "Retry-After" in resume["409"]["headers"]
    listing = doc["paths"]["/v1/operator/runs/{run_id}/tool-invocations"]["get"]["responses"]
    assert "409" not in listing and "resolution_result" not in listing["422"]["description"]


BEARER_FREE = {("get", "/v1/agents/{agent_id}/runs/{run_id}/events"),  # the stream key instead
               ("get", "/healthz"),  # liveness: no credential
               ("get", "/readyz")}  # readiness: no credential
REQUIRED_HEADERS = {
    ("post", "/v1/agents/{agent_id}/runs"): "Idempotency-Key",
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/resume"): "Idempotency-Key",
}


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


@pytest.mark.req("R-AUTH-1")
def test_bearer_security_scheme_on_every_authenticated_route() -> None:
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    schemes = doc["components"]["securitySchemes"]
    assert schemes == {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "API key",
                                  "description": schemes["bearer"]["description"]}}
    assert "unauthenticated" in schemes["bearer"]["description"]
    for method, path, op in _operations(doc):
        headers = {p["name"].lower() for p in op.get("parameters", []) if p["in"] == "header"}
        assert "authorization" not in headers, (method, path)  # the scheme carries it
        if (method, path) in BEARER_FREE:
            assert "security" not in op, (method, path)
        else:
            assert op.get("security") == [{"bearer": []}], (method, path)
            assert "unauthenticated" in op["responses"]["401"]["description"], (method, path)


@pytest.mark.req("R-CREATE-2")
@pytest.mark.req("R-RESUME-1")
@pytest.mark.req("R-AUTH-3")
def test_required_headers_are_marked_required() -> None:
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    for (method, path), name in REQUIRED_HEADERS.items():
        params = [p for p in doc["paths"][path][method]["parameters"]
                  if p["in"] == "header" and p["name"].lower() == name.lower()]
        assert len(params) == 1, (method, path, params)  # declared once, not twice
        assert params[0]["required"] is True, (method, path)
        assert params[0]["schema"]["type"] == "string"
    # The events route takes the stream key in X-Stream-Key, or a browser's stream token in
    # the query (R-EVENT-6): either one, so neither is required; both are documented.
    events = {p["name"]: p for p in doc["paths"]["/v1/agents/{agent_id}/runs/{run_id}/events"]["get"]["parameters"]}
    assert events["X-Stream-Key"]["required"] is False and events["X-Stream-Key"]["in"] == "header"
    assert events["stream_token"]["in"] == "query"
    key = doc["paths"]["/v1/agents/{agent_id}/runs"]["post"]["parameters"][-1]
    assert key["schema"] == {"type": "string", "maxLength": 255, "pattern": r"^[\x21-\x7e]+$"}


KEY = "k-1-0123456789abcdefghijklmn"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    """The app without its lifespan: static keys, a pool never opened (no database), and
    the legacy inline path stubbed (it needs the database)."""
    settings = ApiSettings(database_url=DSN, auth="static", api_keys={KEY: {"tenant": "t-1", "principal": "p-1"}})
    app = create_app(settings)
    app.state.services = Services(settings)

    async def legacy(*_: Any) -> Response:
        return Response(status_code=202)

    monkeypatch.setattr(runs_module, "create_legacy", legacy)
    return app


RUNS = "/v1/agents/a-1/runs"
RESUME = f"/v1/agents/a-1/runs/{uuid.uuid4()}/resume"
EVENTS = f"/v1/agents/a-1/runs/{uuid.uuid4()}/events"


@pytest.mark.req("R-AUTH-1")
@pytest.mark.req("R-CREATE-2")
def test_documenting_headers_changes_no_runtime_behaviour(app: FastAPI) -> None:
    """Required in the document, yet still the routes' own coded errors at runtime (not
    FastAPI's 401/403/422), and the legacy create still takes no key (R-CREATE-6)."""
    durable = {"prompt": "hi", "durable_temporal": True}

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}):
                r = await client.post(RUNS, json=durable, headers=headers)
                assert r.status_code == 401, (headers, r.status_code)
                assert r.json() == {"code": "unauthenticated", "message": "a valid API key is required"}
            for auth in (f"Bearer {KEY}", f"bearer {KEY}", KEY):  # any case; a bare key as before
                r = await client.post(RUNS, json=durable, headers={"Authorization": auth})
                assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required"), auth
            r = await client.post(RESUME, json={}, headers={"Authorization": f"Bearer {KEY}"})
            assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required")
            for route in (RUNS, RESUME):  # an empty header is no key (was 422 invalid_parameter)
                r = await client.post(route, json=durable if route == RUNS else {},
                                      headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": ""})
                assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required"), route
            r = await client.get(EVENTS)
            assert (r.status_code, r.json()["code"]) == (401, "stream_key_required")
            r = await client.post(RUNS, json={"prompt": "hi"}, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 202  # legacy: no Idempotency-Key needed

    asyncio.run(calls())


@pytest.mark.req("R-CREATE-1", "R-AUTH-1")
def test_bodies_are_bounded_and_anonymous_writes_are_not_parsed(app: FastAPI) -> None:
    """A body over the limit is 413 ``body_too_large`` whether declared or streamed in
    chunks, never read whole; a write without a key is 401 before its body is parsed."""
    limit = app.state.services.settings.max_body_bytes

    async def chunks() -> Any:
        for _ in range(limit // 65536 + 2):
            yield b"a" * 65536

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
            big = await client.post(RUNS, content=b"a" * (limit + 1), headers=auth)
            assert (big.status_code, big.json()["code"]) == (413, "body_too_large")
            streamed = await client.post(RUNS, content=chunks(), headers=auth)
            assert (streamed.status_code, streamed.json()["code"]) == (413, "body_too_large")
            anonymous = await client.post(RUNS, content=b"{not json", headers={"Content-Type": "application/json"})
            assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthenticated")
            # Any made-up value is no key: 401 before the body is parsed (was 422) or
            # buffered (was 413), issue 22 item 11.
            for value in ("x", "Bearer nope", f"Basic {KEY}"):
                made_up = {"Authorization": value, "Content-Type": "application/json"}
                bad = await client.post(RUNS, content=b"{not json", headers=made_up)
                assert (bad.status_code, bad.json()["code"]) == (401, "unauthenticated"), value
                huge = await client.post(RUNS, content=b"a" * (limit + 1), headers=made_up)
                assert (huge.status_code, huge.json()["code"]) == (401, "unauthenticated"), value
            small = await client.post(RUNS, json={"prompt": "hi", "durable_temporal": True}, headers=auth)
            assert (small.status_code, small.json()["code"]) == (400, "idempotency_key_required")
            # A compressed body is refused as such (a tester's gzip header was ignored).
            import gzip

            for encoding in ("gzip", "br", " GZIP "):
                zipped = await client.post(RUNS, content=gzip.compress(b'{"prompt": "hi"}'),
                                           headers={**auth, "Content-Encoding": encoding})
                assert (zipped.status_code, zipped.json()["code"]) == (415, "content_encoding_unsupported"), encoding
            for codings in ([("Content-Encoding", "identity"), ("Content-Encoding", "gzip")],
                            [("Content-Encoding", "identity, gzip")]):  # a second header, a list
                zipped = await client.post(RUNS, content=gzip.compress(b'{"prompt": "hi"}'),
                                           headers=[*auth.items(), *codings])
                assert (zipped.status_code, zipped.json()["code"]) == (415, "content_encoding_unsupported"), codings
            plain = await client.post(RUNS, json={"prompt": "hi", "durable_temporal": True},
                                      headers={**auth, "Content-Encoding": "identity"})
            assert (plain.status_code, plain.json()["code"]) == (400, "idempotency_key_required")

    asyncio.run(calls())


@pytest.mark.req("R-CREATE-1")
def test_a_body_that_is_not_declared_json_is_415(app: FastAPI) -> None:
    """A JSON body sent as ``text/plain`` (a browser's ``fetch`` with a string body) or as a
    form (``curl -d`` without a header) was 422 ``malformed_body``; it is 415
    ``content_type_unsupported``, which says what to change; so is a body without a
    Content-Type (FastAPI leaves it unparsed). JSON's own types, with parameters, are read
    as JSON; an empty body is judged by its route."""
    body = b'{"prompt": "hi", "durable_temporal": true}'

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            key = {"Authorization": f"Bearer {KEY}"}
            for kind in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", "application/jsonx", "text/json", None):
                headers = {**key, **({"Content-Type": kind} if kind else {})}
                r = await client.post(RUNS, content=body, headers=headers)
                assert (r.status_code, r.json()["code"]) == (415, "content_type_unsupported"), kind
            for kind in ("application/json", "Application/JSON; charset=utf-8", "application/merge-patch+json"):
                r = await client.post(RUNS, content=body, headers={**key, "Content-Type": kind})
                assert (r.status_code, r.json()["code"]) == (400, "idempotency_key_required"), kind
            empty = await client.post(RUNS, content=b"", headers={**key, "Content-Type": "text/plain",
                                                                  "Idempotency-Key": "k-empty"})
            assert (empty.status_code, empty.json()["code"]) == (422, "malformed_body")

    asyncio.run(calls())


@pytest.mark.req("R-CREATE-1")
def test_a_body_that_cannot_be_parsed_has_the_validation_shape(app: FastAPI) -> None:
    """Not UTF-8 or not JSON, a body is 422 ``malformed_body`` with ``errors`` listing the
    problem (``loc``, ``code``, ``msg``), as every other validation error; the first
    shape had no ``errors``."""

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as client:
            headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
                       "Idempotency-Key": "k-malformed"}
            deep = b"[" * 100_000 + b"]" * 100_000  # past the JSON decoder's recursion limit
            for body in (b"\xff\xfe{", b"{not json", deep):
                r = await client.post(RUNS, content=body, headers=headers)
                assert (r.status_code, r.json()["code"]) == (422, "malformed_body"), body[:20]
                (item,) = r.json()["errors"]
                assert item["code"] == "malformed_body" and item["loc"][0] == "body" and item["msg"], body[:20]
                if body is deep:  # said as what it is, not "not JSON"
                    assert "nested too deeply" in item["msg"], item

    asyncio.run(calls())


@pytest.mark.req("R-CREATE-1")
def test_a_value_the_database_cannot_store_is_422_not_500() -> None:
    """A NUL or an unpaired surrogate deep inside a JSON value reaches PostgreSQL, which
    refuses it: 422 ``value_unstorable``, never a 500."""
    import psycopg

    from qimpl.api.errors import install_error_handlers

    bare = FastAPI()
    install_error_handlers(bare)

    @bare.post("/nul")
    async def nul() -> None:
        raise psycopg.errors.UntranslatableCharacter("\\u0000 cannot be converted to text")

    @bare.post("/surrogate")
    async def surrogate() -> None:
        "\ud800".encode()

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bare), base_url="http://t") as c:
            for path in ("/nul", "/surrogate"):
                r = await c.post(path)
                assert (r.status_code, r.json()["code"]) == (422, "value_unstorable"), path
                assert "cannot be converted" not in r.text

    asyncio.run(calls())


@pytest.mark.req("R-AUTH-1", "R-CREATE-2")
@pytest.mark.parametrize(("method", "path", "twice", "spelt"), [
    ("POST", RUNS, "Authorization", "Authorization"),
    ("GET", f"/v1/agents/a-1/runs/{uuid.uuid4()}", "Authorization", "Authorization"),
    ("POST", RUNS, "Idempotency-Key", "Idempotency-Key"),
    ("GET", EVENTS, "last-event-id", "Last-Event-ID"),
    ("GET", EVENTS, "X-Stream-Key", "X-Stream-Key"),  # a tester's: the first one won
], ids=["create-authorization", "read-authorization", "create-idempotency-key", "events-last-event-id",
        "events-stream-key"])
def test_a_header_read_once_sent_twice_is_400_before_anything_runs(app: FastAPI, method: str, path: str,
                                                                    twice: str, spelt: str) -> None:
    """Two ``Authorization`` (or ``Idempotency-Key``, ``Last-Event-ID``) headers: the API
    would read the first and a proxy perhaps the last. 400 ``duplicate_header``, whatever
    the values (the same twice too), before authentication or the body is read; one of
    each goes through (here to the route's own answer)."""
    values = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "k", "last-event-id": "1",
              "X-Stream-Key": "s"}
    single = [("Authorization", f"Bearer {KEY}"), ("Idempotency-Key", "k"), ("Content-Type", "application/json")]

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            for second in (values[twice], "other"):
                headers = [h for h in single if h[0] != twice] + [(twice, values[twice]), (twice, second)]
                resp = await client.request(method, path, headers=headers, content=b'{"prompt": "hi"}')
                assert (resp.status_code, resp.json()["code"]) == (400, "duplicate_header"), resp.text
                assert spelt in resp.json()["message"]
            once = await client.request(method, path, headers=single, content=b'{"prompt": "hi"}')
            assert once.status_code != 400 or once.json()["code"] != "duplicate_header"

    asyncio.run(calls())


@pytest.mark.req("R-AUTH-1", "R-READ-5")
def test_a_query_parameter_read_once_sent_twice_is_400(app: FastAPI) -> None:
    """``?tenant=a&tenant=b`` was answered for ``b`` alone (FastAPI keeps the last value; a
    new user's finding). A parameter sent twice is 400 ``duplicate_parameter`` before
    anything runs, the same value twice too; a list parameter (``state``) repeats freely."""
    ops = {"Authorization": "Bearer nope"}

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            for query in ("tenant=a&tenant=b", "tenant=a&tenant=a", "limit=1&limit=2", "t%65nant=a&tenant=b"):
                resp = await client.get(f"/v1/operator/runs?{query}", headers=ops)
                assert (resp.status_code, resp.json()["code"]) == (400, "duplicate_parameter"), (query, resp.text)
                assert "query parameter is sent more than once" in resp.json()["message"]
            listing = "/v1/agents/a-1/runs?state=queued&state=running"
            resp = await client.get(listing, headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status_code != 400, resp.text

    asyncio.run(calls())


def test_the_repeatable_query_parameters_are_the_documented_lists() -> None:
    """``REPEATABLE_QUERY`` names exactly the query parameters a route takes as a list."""
    doc = create_app(ApiSettings(database_url=DSN)).openapi()
    arrays = set()
    for methods in doc["paths"].values():
        for op in methods.values():
            for param in op.get("parameters", []):
                schema = param.get("schema", {})
                kinds = [schema, *schema.get("anyOf", [])]
                if param["in"] == "query" and any(k.get("type") == "array" for k in kinds):
                    arrays.add(param["name"])
    assert arrays == set(REPEATABLE_QUERY)


@pytest.mark.req("R-CANCEL-1")
def test_cancel_refuses_a_body_it_would_ignore(app: FastAPI) -> None:
    """``{"reason": ...}`` was accepted and dropped (a new user's finding): now 422
    ``unknown_field`` and nothing cancelled; no body or ``{}`` reach the route."""
    cancel = f"/v1/agents/a-1/runs/{uuid.uuid4()}/cancel"
    auth = {"Authorization": f"Bearer {KEY}"}

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            for body in ({"reason": "user asked"}, {"cancelled": True}):
                resp = await client.post(cancel, headers=auth, json=body)
                assert (resp.status_code, resp.json()["code"]) == (422, "unknown_field"), resp.text
            for content in (None, b"{}"):
                resp = await client.post(cancel, headers={**auth, "Content-Type": "application/json"},
                                         content=content)  # the route runs: no database here
                assert resp.status_code == 503 and resp.json()["code"] == "database_unavailable", resp.text

    asyncio.run(calls())


@pytest.mark.req("R-AUTH-1")
def test_headers_past_the_bound_are_431_before_anything_runs(app: FastAPI) -> None:
    """A 300 KB header was accepted (a new user's finding; httptools bounds nothing)."""

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            for headers in ({"X-Padding": "x" * 300_000},
                            {f"X-Pad-{i}": "x" * 1000 for i in range(20)}):
                resp = await client.post(RUNS, headers={"Authorization": f"Bearer {KEY}", **headers},
                                         json={"prompt": "hi"})
                assert (resp.status_code, resp.json()["code"]) == (431, "request_headers_too_large"), resp.text
            near = {"X-Padding": "x" * (MAX_HEADER_BYTES - 2000)}
            resp = await client.post(RUNS, headers={"Authorization": f"Bearer {KEY}", **near},
                                     json={"prompt": "hi", "durable_temporal": True})
            assert (resp.status_code, resp.json()["code"]) == (400, "idempotency_key_required"), resp.text

    asyncio.run(calls())


@pytest.mark.req("R-AUTH-1")
def test_http_semantics_a_client_library_relies_on(app: FastAPI) -> None:
    """From a tester's findings: a 405 names the path's methods (``Allow``); a 401 names
    its scheme (``WWW-Authenticate``), whichever layer answers it; a path with a trailing
    slash is 404, not a 307 to a Location built from the request's Host header."""

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            r = await client.delete(RUNS, headers={"Authorization": f"Bearer {KEY}"})
            assert (r.status_code, r.json()["code"]) == (405, "method_not_allowed")
            assert "POST" in r.headers["allow"] and "GET" in r.headers["allow"], r.headers
            for method, path in (("POST", RUNS), ("GET", RUNS)):  # the limits' 401, the route's
                r = await client.request(method, path, json={"prompt": "x"})
                assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), (method, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer"), (method, r.headers)
            r = await client.post(RUNS + "/", json={"prompt": "x"},
                                  headers={"Authorization": f"Bearer {KEY}", "Host": "evil.example.com"})
            assert (r.status_code, r.json()["code"]) == (404, "not_found") and "location" not in r.headers

    asyncio.run(calls())


@pytest.mark.req("R-EVENT-6")
def test_a_refused_cors_preflight_is_a_coded_error() -> None:
    """It was the API's one error without a ``code`` (text/plain "Disallowed CORS origin")."""
    from fastapi.testclient import TestClient

    api = create_app(ApiSettings(database_url=DSN, cors_origins=["https://app.example.com"]))
    client = TestClient(api)  # no lifespan: the preflight needs no database
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = client.options(RUNS, headers={"Origin": "https://app.example.com", **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example.com"
    refused = client.options(RUNS, headers={"Origin": "https://evil.example.com", **ask})
    assert refused.status_code == 400 and refused.headers["content-type"] == "application/json"
    assert refused.json()["code"] == "cors_preflight_refused" and "origin" in refused.json()["message"]
    assert "access-control-allow-origin" not in refused.headers
