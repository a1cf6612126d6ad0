"""Stateful contract fuzzing (issue 13, item 9): schemathesis follows the OpenAPI links —
create, then read, follow the events, cancel, resume, decide an approval — against two
API instances at once (each call goes to one of them at random), with a worker running
the synthetic provider. No call may answer 5xx, and every 4xx must carry a machine-readable
``code`` that the operation documents for that status (R-CREATE-1, R-AUTH-1)."""

from __future__ import annotations

import json
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis.specs.openapi.stateful import OpenAPIStateMachine

from qualify.processes import Deployment, Processes

#: Scenarios (sequences of linked calls) per run of the state machine.
SCENARIOS = 25
_CODES = re.compile(r"codes: (.*)", re.S)


def documented_codes(operation: dict[str, Any], status: int) -> set[str]:
    """The error codes an operation's OpenAPI response for ``status`` lists
    (``"codes: a, b (note), c"``), plus the schema validation codes of a 422."""
    text = (operation.get("responses", {}).get(str(status)) or {}).get("description", "")
    found = _CODES.search(text)
    if not found:
        return set()
    return {m.group(0) for m in re.finditer(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\bunauthenticated\b",
                                           re.sub(r"\([^)]*\)", "", found.group(1)))}


@pytest.mark.req("R-CREATE-1", "R-AUTH-1")
def test_linked_calls_across_two_apis_answer_documented_codes(stack: Any) -> None:
    work = Path(tempfile.mkdtemp(prefix="qualify-stateful-"))
    (work / "control").mkdir()
    deployment = Deployment(dsn=stack.create_database(), temporal_address=stack.info.temporal_address,
                            task_queue="stateful", control_dir=work / "control", logs_dir=work / "logs")
    processes = Processes(deployment)
    problems: list[str] = []
    try:
        apis = [processes.api("api-1"), processes.api("api-2")]
        processes.worker()
        document = json.loads(__import__("httpx").get(f"{apis[0].base_url}/openapi.json").text)
        # The event stream stays open until its run ends (a parked run: until the client
        # gives up); it has its own scenarios. Everything else is linked and fuzzed here.
        schema = schemathesis.openapi.from_dict(document).exclude(path_regex=r".*/events$")
        operations = {op["operationId"]: op for ops in document["paths"].values() for op in ops.values()}
        pick = random.Random(7)

        class TwoApis(schema.as_state_machine()):  # type: ignore[misc]
            def get_call_kwargs(self, case: Any) -> dict[str, Any]:
                return {"base_url": pick.choice(apis).base_url, "timeout": 30,
                        "headers": {"Authorization": "Bearer dev-key"}}

            def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
                where = f"{case.method} {case.operation.path}"
                if response.status_code >= 500:
                    problems.append(f"{where}: {response.status_code} {response.text[:160]}")
                elif response.status_code >= 400:
                    try:
                        code = response.json().get("code")
                    except ValueError:
                        code = None
                    known = documented_codes(operations[case.operation.definition.raw["operationId"]],
                                             response.status_code)
                    if code is None or code not in known:
                        problems.append(f"{where}: {response.status_code} code {code!r} not documented"
                                        f" ({sorted(known)[:6]}); body {case.body!r:.80}, "
                                        f"headers {dict(case.headers or {})!r:.120}")

        assert issubclass(TwoApis, OpenAPIStateMachine)
        # One scenario per run: the system's state changes between scenarios, and hypothesis
        # would call a second example that meets other data "flaky" (it replays prefixes).
        for _ in range(SCENARIOS):
            TwoApis.run(settings=hypothesis.settings(
                max_examples=1, stateful_step_count=8, deadline=None, database=None,
                phases=[hypothesis.Phase.generate], suppress_health_check=list(hypothesis.HealthCheck)))
    finally:
        processes.stop_all()
    assert not problems, "\n".join(sorted(set(problems)))
