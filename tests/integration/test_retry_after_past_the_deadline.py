"""A 429 whose ``Retry-After`` runs past the run's deadline (issue 56, item 9): one counted
failure, then the run waits for its deadline and expires there; it is never failed early
by Temporal giving the activity up because no retry fits before the deadline (the
activity's schedule-to-close). Only the deadline expires a run (R-EXEC-12), and one rate
limit is one counted failure (R-EXEC-6)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from qimpl.lifecycle import workflow_id
from qimpl.workflows.types import FailInput, RunInput
from qimpl.workflows.worker import WORKFLOWS
from tests.conftest import assert_eventually
from tests.integration.deployed import Deployed, create, deployed

#: The provider asks to be left alone for ten minutes at step 1 of attempt 1.
RATE_LIMITED = {"steps": 2, "fail": {"steps": [1], "attempts": [1], "error": "rate_limited",
                                     "retry_after_s": 600}}
LIVE = ("accepted", "queued", "running")


@pytest.fixture
def deployment(stack: Any) -> Iterator[Deployed]:
    with deployed(stack, "retryafter") as d:
        d.processes.worker()
        yield d


def _row(dsn: str, run_id: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT state, error_code, provider_failures, completed_at >= deadline_at AS at_deadline,"
            " extract(epoch FROM deadline_at - clock_timestamp()) AS left_s,"
            " (SELECT count(*) FROM provider_calls c WHERE c.run_id = r.run_id) AS calls"
            " FROM runs r WHERE run_id = %s", (run_id,))
        names = [c.name for c in cur.description or ()]
        got = cur.fetchone()
    assert got is not None
    return dict(zip(names, got, strict=True))


def _waits_for_its_deadline(address: str, wf_id: str) -> bool:
    """Whether the generation's workflow started a timer (waiting for the deadline)."""
    async def look() -> bool:
        client = await Client.connect(address, namespace="default")
        events = [e async for e in client.get_workflow_handle(wf_id).fetch_history_events()]
        return any(e.HasField("timer_started_event_attributes") for e in events)
    return asyncio.run(look())


@pytest.mark.req("R-EXEC-12", "R-EXEC-6", "R-EXEC-8")
def test_a_retry_after_past_a_near_deadline_expires_the_run_at_its_deadline(deployment: Deployed) -> None:
    api = deployment.processes.api()
    with httpx.Client(base_url=api.base_url, headers={"Authorization": "Bearer dev-key"}, timeout=10) as http:
        run_id = create(http, RATE_LIMITED, deadline_s=6)
        assert_eventually(lambda: _row(deployment.dsn, run_id)["state"] not in LIVE,
                          timeout=timedelta(seconds=40), what="the run ended")
    row = _row(deployment.dsn, run_id)
    # Before the fix: failed agent_activity_failed about 5 s before the deadline.
    assert (row["state"], row["error_code"]) == ("expired", "deadline_exceeded"), row
    assert row["at_deadline"] is True, row
    assert (row["provider_failures"], row["calls"]) == (1, 1), row


@pytest.mark.req("R-EXEC-12", "R-EXEC-6", "R-CANCEL-1")
def test_a_run_waiting_out_a_retry_after_past_its_deadline_can_still_be_cancelled(
        deployment: Deployed) -> None:
    api = deployment.processes.api()
    with httpx.Client(base_url=api.base_url, headers={"Authorization": "Bearer dev-key"}, timeout=10) as http:
        run_id = create(http, RATE_LIMITED, deadline_s=600)
        wf_id = workflow_id(run_id, 1)

        def settled() -> bool:
            # With the fix the workflow waits for the deadline; without it the run ends.
            return (_row(deployment.dsn, run_id)["state"] not in LIVE
                    or _waits_for_its_deadline(deployment.temporal_address, wf_id))

        assert_eventually(settled, timeout=timedelta(seconds=30), what="the rate limit counted")
        row = _row(deployment.dsn, run_id)
        assert (row["state"], row["provider_failures"], row["calls"]) == ("running", 1, 1), row
        cancel = http.post(f"/v1/agents/a1/runs/{run_id}/cancel")
        assert cancel.status_code == 200, cancel.text
        # Before the fix: {"cancelled": false, "state": "failed"}.
        assert cancel.json() == {"cancelled": True, "state": "cancelled"}, cancel.text


# The workflow's own branch, with stub activities (in the sandbox): however the agent
# activity ends for lack of time before the deadline, the run expires at the deadline.

@activity.defn(name="run_agent_v2")
async def _run_agent(inp: RunInput) -> dict[str, Any]:
    if inp.run_id.startswith("refused"):
        # A retry delay past the activity's schedule-to-close: Temporal refuses the retry
        # and gives the activity up (retry state TIMEOUT), whatever the attempt said.
        raise ApplicationError("step failed (provider_error:provider_http_429); 1 of 5",
                               type="StepFailure", next_retry_delay=timedelta(seconds=600))
    raise ApplicationError("step failed (provider_error:provider_http_429); 1 of 5; no ask before the deadline",
                           type="DeadlineWait", non_retryable=True)


@activity.defn(name="fail_run_v2")
async def _fail_run(inp: FailInput) -> dict[str, Any]:
    return {"run_id": inp.run_id, "state": inp.state, "error_code": inp.error_code}


@pytest.mark.req("R-EXEC-12", "R-EXEC-6")
@pytest.mark.parametrize("wf_type", ["AgentRunWorkflowV3", "AgentRunWorkflowV2"])
@pytest.mark.parametrize("kind", ["refused", "deadline-wait"])
def test_an_activity_out_of_time_before_the_deadline_expires_the_run_at_the_deadline(
        stack: Any, wf_type: str, kind: str) -> None:
    deadline_s = 3.0

    async def go() -> tuple[dict[str, Any], float]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"outoftime-{uuid.uuid4().hex[:8]}"
        run_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        deadline = datetime.now(UTC) + timedelta(seconds=deadline_s)
        async with Worker(client, task_queue=queue, workflows=list(WORKFLOWS),
                          activities=[_run_agent, _fail_run], workflow_runner=SandboxedWorkflowRunner()):
            result: dict[str, Any] = await asyncio.wait_for(client.execute_workflow(
                wf_type, RunInput(run_id=run_id, tenant_id="t", generation=1, deadline_at=deadline.isoformat()),
                id=f"wf-{run_id}", task_queue=queue, task_timeout=timedelta(seconds=5)), timeout=30)
        return result, (datetime.now(UTC) - deadline).total_seconds()

    result, after_s = asyncio.run(go())
    # Before the fix: failed agent_activity_failed at once, about 3 s before the deadline.
    assert (result["state"], result["error_code"]) == ("expired", "deadline_exceeded"), result
    assert after_s >= 0, f"ended {-after_s:.1f} s before the deadline"
