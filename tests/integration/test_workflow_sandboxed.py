"""qimpl's workflows run every branch inside temporalio's sandbox (issue 21). The worker
runs them unsandboxed by default (``QIMPL_WORKFLOW_SANDBOX``, docs/operations.md), so
what the sandbox catches at run time (a call to the clock, randomness or I/O in workflow
code, R-EXEC-10) is judged here: the real ``AgentRunWorkflowV2`` on the stack's Temporal
server, in a worker with the sandboxed runner, through each way its run can end — the
activity's answer, an activity that gives up (``fail_run_v2`` with
``agent_activity_failed``), and a run found past its deadline (``deadline_exceeded``).
Stub activities stand in for the agent loop: only the workflow's own code is judged."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from qimpl.workflows.types import FailInput, RunInput
from qimpl.workflows.worker import WORKFLOWS


@activity.defn(name="run_agent_v2")
async def _run_agent(inp: RunInput) -> dict[str, Any]:
    if inp.run_id.startswith("gives-up"):
        raise ApplicationError("the agent loop gave up", non_retryable=True)
    return {"run_id": inp.run_id, "state": "completed"}


@activity.defn(name="fail_run_v2")
async def _fail_run(inp: FailInput) -> dict[str, Any]:
    return {"run_id": inp.run_id, "state": inp.state, "error_code": inp.error_code}


@pytest.mark.req("R-EXEC-10")
@pytest.mark.parametrize(("kind", "deadline_s", "want"), [
    ("answers", 60, {"state": "completed"}),
    ("gives-up", 60, {"state": "failed", "error_code": "agent_activity_failed"}),
    ("gives-up-overdue", -1, {"state": "expired", "error_code": "deadline_exceeded"}),
])
def test_every_branch_of_the_workflow_runs_in_the_sandbox(stack: Any, kind: str, deadline_s: int,
                                                          want: dict[str, str]) -> None:
    async def go() -> dict[str, Any]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"sandboxed-{uuid.uuid4().hex[:8]}"
        run_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        deadline = datetime.now(UTC) + timedelta(seconds=deadline_s)
        async with Worker(client, task_queue=queue, workflows=list(WORKFLOWS),
                          activities=[_run_agent, _fail_run], workflow_runner=SandboxedWorkflowRunner()):
            result: dict[str, Any] = await asyncio.wait_for(client.execute_workflow(
                "AgentRunWorkflowV2", RunInput(run_id=run_id, tenant_id="t", generation=1,
                                               deadline_at=deadline.isoformat()),
                id=f"wf-{run_id}", task_queue=queue, task_timeout=timedelta(seconds=5)), timeout=30)
        return result

    result = asyncio.run(go())
    assert {k: result.get(k) for k in want} == want, result
