"""The routers refactor (issue 13, item 10) changes no route of the OpenAPI document: every
operation keeps its path, method, operationId, parameters, body, security and each
response code with its documented error codes. ``tests/data/openapi_routes.json`` is that
contract as served *before* the refactor (generated from the closure-based ``create_app``);
regenerate it only for an intended change of the document:

    python -m tests.unit.test_openapi_layout > tests/data/openapi_routes.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from qimpl.api.app import create_app
from qimpl.settings import ApiSettings

SNAPSHOT = Path(__file__).parents[1] / "data" / "openapi_routes.json"


def contract(doc: dict[str, Any]) -> dict[str, Any]:
    """The comparable part of an OpenAPI document: ``{"METHOD path": {...}}`` plus the
    component schema names (their bodies are pydantic's, unchanged by the layout)."""
    ops: dict[str, Any] = {}
    for path, by_method in doc["paths"].items():
        for method, op in by_method.items():
            ops[f"{method.upper()} {path}"] = {
                "operationId": op["operationId"],
                "summary": op.get("summary"),
                "parameters": [[p["in"], p["name"], p.get("required", False)]
                               for p in op.get("parameters", [])],
                "requestBody": json.dumps(op.get("requestBody"), sort_keys=True),
                "security": op.get("security"),
                "responses": {code: r.get("description", "") for code, r in op["responses"].items()},
            }
    return {"operations": ops, "schemas": sorted(doc["components"]["schemas"])}


@pytest.mark.req("R-CREATE-1")
def test_openapi_document_unchanged_by_the_router_layout() -> None:
    expected = json.loads(SNAPSHOT.read_text())
    actual = json.loads(json.dumps(contract(create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x")).openapi())))
    assert sorted(actual["operations"]) == sorted(expected["operations"])
    for op, want in expected["operations"].items():
        assert actual["operations"][op] == want, op
    assert actual["schemas"] == expected["schemas"]


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):  # an included router (FastAPI >= 0.16x)
            found.extend(_api_routes(route.original_router.routes))
    return found


def test_create_app_only_assembles_routers() -> None:
    """Every route (the 22 documented ones, ``/metrics``, ``/healthz`` and ``/readyz`` among them, and ``/docs``) comes from a
    resource router module; none is defined in ``qimpl.api.app``."""
    routes = _api_routes(create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x")).routes)
    assert len(routes) == 23, [r.path for r in routes]
    modules = {r.endpoint.__module__ for r in routes}
    assert "qimpl.api.app" not in modules, modules



def test_docs_work_offline_from_packaged_assets() -> None:
    """Issue 25, item 13: ``/docs`` loads Swagger UI from the API itself, never a CDN."""
    from fastapi.testclient import TestClient

    client = TestClient(create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x")))
    page = client.get("/docs")
    assert page.status_code == 200
    assert "cdn." not in page.text and "http" not in page.text.replace("/openapi.json", "")
    assert "/docs-assets/swagger-ui-bundle.js" in page.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        got = client.get(f"/docs-assets/{asset}")
        assert got.status_code == 200 and len(got.content) > 10_000, asset
    assert client.get("/redoc").status_code == 404



def test_replays_and_the_legacy_path_are_documented() -> None:
    """Issue 25, item 15: ``Idempotent-Replayed`` on the 202 of create and resume, and a
    receipt's ``durability`` says ``legacy`` is a path of its own."""
    doc = create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x")).openapi()
    for path in ("/v1/agents/{agent_id}/runs", "/v1/agents/{agent_id}/runs/{run_id}/resume"):
        assert "Idempotent-Replayed" in doc["paths"][path]["post"]["responses"]["202"]["headers"], path
    receipt = doc["components"]["schemas"]["Receipt"]
    assert receipt["properties"]["durability"]["enum"] == ["temporal", "legacy"]
    assert "legacy" in receipt["description"] and "restart" in receipt["description"]
    body = doc["components"]["schemas"]["CreateRunRequest"]["properties"]["durable_temporal"]
    assert "legacy" in body["description"]


if __name__ == "__main__":
    json.dump(contract(create_app(ApiSettings(database_url="postgresql://u@127.0.0.1:1/x")).openapi()), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
