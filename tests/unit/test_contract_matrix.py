"""The API contract matrix's pure half (qualify.scenarios.matrix): one expected answer per
route x credential kind, and a route table taken from the API's own OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest

from qimpl.api.app import create_app
from qimpl.settings import ApiSettings
from qualify.scenarios.matrix import (
    KINDS,
    LISTINGS,
    RUN,
    UNLISTED_ROUTES,
    Answer,
    expected,
    route_table,
)

pytestmark = pytest.mark.req("R-AUTH-1", "R-AUTH-3", "R-OPS-7")


#: Never connected to: the app is built without its lifespan.
DSN = "postgresql://qimpl_api@127.0.0.1:1/qimpl"


def _doc() -> dict[str, Any]:
    return create_app(ApiSettings(database_url=DSN)).openapi()


def _routes() -> list[tuple[str, str]]:
    return route_table(_doc())


def test_every_route_of_the_app_has_an_answer_for_every_kind() -> None:
    routes = _routes()
    assert ("POST", "/v1/agents/{agent_id}/runs") in routes and set(UNLISTED_ROUTES) <= set(routes)
    missing = [(m, p, k) for m, p in routes for k in KINDS if expected(m, p, k) is None]
    assert not missing


def test_a_route_the_table_does_not_know_has_no_answer() -> None:
    # A new route must not ship without its row: the scenario fails on None.
    assert expected("POST", RUN + "/teleport", "owner") is None
    assert expected("DELETE", "/v1/agents/{agent_id}/runs", "owner") is None


def test_refusals_come_before_the_route() -> None:
    for method, path in _routes():
        if path in ("/healthz", "/readyz", RUN + "/events"):
            continue
        for kind in ("none", "malformed", "revoked", "expired"):
            assert expected(method, path, kind) == Answer(401, "unauthenticated"), (method, path, kind)


def test_no_client_but_the_owner_learns_the_run_exists() -> None:
    for method, path in _routes():
        if path.startswith(RUN):
            for kind in ("peer", "other-tenant"):
                assert expected(method, path, kind) == Answer(404, "run_not_found"), (method, path, kind)
            assert expected(method, path, "operator") in (Answer(403, "client_credential_required"),
                                                          Answer(401, "stream_key_required"))


def test_operator_routes_refuse_clients_and_other_tenants() -> None:
    ops = [(m, p) for m, p in _routes() if p.startswith("/v1/operator/")]
    assert ops
    for method, path in ops:
        assert expected(method, path, "owner") == Answer(403, "operator_credential_required")
        if path == "/v1/operator/runs":  # a listing: its own tenants' runs (checked by what it lists)
            assert expected(method, path, "other-operator") == Answer(200)
        else:
            assert expected(method, path, "other-operator") == Answer(404, "run_not_found")


def test_each_listing_names_who_sees_the_run_and_who_must_not() -> None:
    listed = {p for m, p in _routes() if m == "GET" and p in LISTINGS}
    assert listed == set(LISTINGS)
    for see, blind in LISTINGS.values():
        assert see and blind and not see & blind


def test_an_api_key_is_not_a_stream_credential() -> None:
    events = RUN + "/events"
    assert expected("GET", events, "owner") == Answer(200)
    assert expected("GET", events, "operator") == Answer(401, "stream_key_required")
    assert expected("GET", events, "peer") == Answer(404, "run_not_found")


def test_route_table_reads_operations_only() -> None:
    doc = {"paths": {"/a": {"get": {}, "parameters": []}, "/b": {"post": {}, "summary": "x"}}}
    assert route_table(doc) == sorted({("GET", "/a"), ("POST", "/b"), *UNLISTED_ROUTES})


def test_every_expected_answer_is_documented_on_its_route() -> None:
    # A client reading the OpenAPI document learns every status the matrix can give it.
    doc = _doc()
    undocumented = sorted({(m, p, str(expected(m, p, k))) for m, p in _routes() if (m, p) not in UNLISTED_ROUTES
                           for k in KINDS
                           if str(expected(m, p, k).status) not in doc["paths"][p][m.lower()]["responses"]})
    assert not undocumented
