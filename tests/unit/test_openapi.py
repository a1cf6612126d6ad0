"""The served OpenAPI document lists every route, its body and every error code it can
return (issue: API contract)."""

from __future__ import annotations

import pytest

from qimpl.api.app import create_app
from qimpl.api.validation import VALIDATION_CODES
from qimpl.settings import Settings

EXPECTED = {
    ("post", "/v1/agents/{agent_id}/runs"): {"202", "400", "401", "409", "422", "503"},
    ("get", "/v1/agents/{agent_id}/runs/{run_id}"): {"200", "401", "404", "422"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/cancel"): {"200", "401", "404", "422"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/resume"): {"202", "400", "401", "404", "409", "422", "503"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}"): {"200", "401", "404", "409", "422"},
    ("get", "/v1/agents/{agent_id}/runs/{run_id}/events"): {"200", "401", "404", "422"},
    ("post", "/v1/answer"): {"200", "401", "422", "502"},
    ("post", "/v1/agents/{agent_id}/runs/{run_id}/pause"): {"401", "404", "409", "501"},
}


@pytest.mark.req("R-CREATE-1")
def test_every_route_lists_its_error_codes() -> None:
    doc = create_app(Settings()).openapi()
    for (method, path), statuses in EXPECTED.items():
        op = doc["paths"][path][method]
        assert statuses <= set(op["responses"]), (method, path, sorted(op["responses"]))
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                assert resp["description"].startswith("codes: "), (path, status)
    create_422 = doc["paths"]["/v1/agents/{agent_id}/runs"]["post"]["responses"]["422"]["description"]
    assert all(code in create_422 for code in VALIDATION_CODES)
    assert "requestBody" in doc["paths"]["/v1/agents/{agent_id}/runs"]["post"]
    legacy = [p for p in doc["paths"] if p.endswith(("/pause", "/handoff", "/branch", "/rollback"))]
    assert len(legacy) == 4
