"""qimpl's workflows run every branch inside temporalio's sandbox (issue 21). The worker
runs them unsandboxed by default (``QIMPL_WORKFLOW_SANDBOX``, docs/operations.md), so
what the sandbox catches at run time (a call to the clock, randomness or I/O in workflow
code, R-EXEC-10) is judged here: the real ``AgentRunWorkflowV3`` (and version 2, for its
histories) on the stack's Temporal server, in a worker with the sandboxed runner, through each way its run can end — the
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
@pytest.mark.parametrize("wf_type", ["AgentRunWorkflowV3", "AgentRunWorkflowV2"])
@pytest.mark.parametrize(("kind", "deadline_s", "want"), [
    ("answers", 60, {"state": "completed"}),
    ("gives-up", 60, {"state": "failed", "error_code": "agent_activity_failed"}),
    ("gives-up-overdue", -1, {"state": "expired", "error_code": "deadline_exceeded"}),
])
def test_every_branch_of_the_workflow_runs_in_the_sandbox(stack: Any, wf_type: str, kind: str, deadline_s: int,
                                                          want: dict[str, str]) -> None:
    async def go() -> dict[str, Any]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"sandboxed-{uuid.uuid4().hex[:8]}"
        run_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        deadline = datetime.now(UTC) + timedelta(seconds=deadline_s)
        async with Worker(client, task_queue=queue, workflows=list(WORKFLOWS),
                          activities=[_run_agent, _fail_run], workflow_runner=SandboxedWorkflowRunner()):
            result: dict[str, Any] = await asyncio.wait_for(client.execute_workflow(
                wf_type, RunInput(run_id=run_id, tenant_id="t", generation=1,
                                               deadline_at=deadline.isoformat()),
                id=f"wf-{run_id}", task_queue=queue, task_timeout=timedelta(seconds=5)), timeout=30)
        return result

    result = asyncio.run(go())
    assert {k: result.get(k) for k in want} == want, result


def _history_of(stack: Any, wf_type: str, inp: RunInput, **start: Any) -> tuple[list[Any], dict[str, Any]]:
    """Run ``inp`` in a workflow of ``wf_type`` to its end with the stub activities; returns (its history's events, its
    Qimpl search attributes as Temporal's describe lists them)."""
    from qimpl.workflows import search_attributes as attrs

    async def go() -> tuple[list[Any], dict[str, Any]]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"revision-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=list(WORKFLOWS),
                          activities=[_run_agent, _fail_run], workflow_runner=SandboxedWorkflowRunner()):
            handle = await client.start_workflow(wf_type, inp, id=f"wf-{inp.run_id}",
                                                 task_queue=queue, task_timeout=timedelta(seconds=5), **start)
            await asyncio.wait_for(handle.result(), timeout=30)
        events = [e async for e in handle.fetch_history_events()]
        sa = (await handle.describe()).typed_search_attributes
        keys = (attrs.TENANT, attrs.RUN_ID, attrs.GENERATION, attrs.RUN_STATE)
        return events, {k.name: sa.get(k) for k in keys}

    return asyncio.run(go())


@pytest.mark.req("R-EXEC-10")
def test_version_3_records_no_patch_marker_and_is_tagged_from_its_start(stack: Any) -> None:
    """Version 3 is started with the tenant, run id and generation (``qimpl.dispatch``): it
    records no marker and upserts only the run's state (two patch markers, two
    ``TemporalChangeVersion`` upserts and one upsert of the three fewer per run than
    version 2), and a generation is found by tenant even before a worker ran it."""
    from temporalio.api.enums.v1 import EventType

    from qimpl.dispatch import run_input
    from qimpl.settings import ApiSettings
    from qimpl.workflows import search_attributes as attrs
    from qimpl.workflows.agent_run import WORKFLOW_TYPE

    run_id = f"v3-{uuid.uuid4().hex[:8]}"
    row = {"run_id": run_id, "tenant_id": "t-rev", "generation": 1,
           "deadline_at": datetime.now(UTC) + timedelta(seconds=60)}
    inp = run_input(row, ApiSettings(database_url="postgresql://unused/db"))
    assert inp.search_attributes  # the default
    events, tags = _history_of(stack, WORKFLOW_TYPE, inp, search_attributes=attrs.at_start("t-rev", run_id, 1))
    kinds = [e.event_type for e in events]
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in kinds
    upserts = [e.upsert_workflow_search_attributes_event_attributes for e in events
               if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES]
    assert [sorted(u.search_attributes.indexed_fields) for u in upserts] == [[attrs.RUN_STATE.name]]
    assert tags == {"QimplTenant": "t-rev", "QimplRunId": run_id, "QimplGeneration": 1,
                    "QimplRunState": "completed"}


@pytest.mark.req("R-EXEC-10")
def test_version_2_still_tags_itself_behind_its_patches(stack: Any) -> None:
    """What the test above is judged against: version 2 (its histories, R-EXEC-10) is
    tagged by the workflow itself, behind its two patches."""
    from temporalio.api.enums.v1 import EventType

    run_id = f"v2-{uuid.uuid4().hex[:8]}"
    inp = RunInput(run_id=run_id, tenant_id="t-rev", generation=1, search_attributes=True,
                   deadline_at=(datetime.now(UTC) + timedelta(seconds=60)).isoformat())
    events, tags = _history_of(stack, "AgentRunWorkflowV2", inp)
    assert [e.event_type for e in events].count(EventType.EVENT_TYPE_MARKER_RECORDED) == 2
    assert tags == {"QimplTenant": "t-rev", "QimplRunId": run_id, "QimplGeneration": 1,
                    "QimplRunState": "completed"}
