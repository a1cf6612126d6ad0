"""Contract fuzzing: schemathesis generates requests from the served OpenAPI document
for every operation; no route may answer 5xx. Bounded examples per operation."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from qualify.processes import Deployment, Processes

EXAMPLES_PER_OPERATION = 25


@pytest.mark.req("R-CREATE-1")
def test_no_route_answers_5xx(stack: Any) -> None:
    work = Path(tempfile.mkdtemp(prefix="qualify-fuzz-"))
    (work / "control").mkdir()
    deployment = Deployment(dsn=stack.create_database(), temporal_address=stack.info.temporal_address,
                            task_queue="fuzz", control_dir=work / "control", logs_dir=work / "logs")
    processes = Processes(deployment)
    failures: list[str] = []
    try:
        api = processes.api()
        schema = schemathesis.openapi.from_url(f"{api.base_url}/openapi.json")
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) >= 10, "the OpenAPI document lost routes"
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case: Any) -> None:
                case.headers = {**(case.headers or {}), "Authorization": "Bearer dev-key"}
                response = case.call(base_url=api.base_url, timeout=30)
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path}: {response.status_code} "
                                    f"{response.text[:200]}")

            fuzz()
    finally:
        processes.stop_all()
    assert not failures, failures[:5]
