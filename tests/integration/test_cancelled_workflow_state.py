"""Every generation's workflow ends with its run's state as ``QimplRunState``, whichever
path ends it (issue 56, item 13): also when the cancel request reaches the workflow where
no activity's answer does — while it waits for the deadline (item 9), while ``fail_run_v2``
runs, or in the very activation the agent activity answered in (the SDK then raises the
cancel, not the answer: a run cancelled twice 16 ms apart ended ``Canceled`` with no state,
so ``temporal workflow list --query "QimplRunState = 'cancelled'"`` missed it). Such a
workflow reads the run's state and completes, as every other way it ends does
(docs/operations.md, "Finding a run in Temporal")."""

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
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from qimpl.lifecycle import workflow_id
from qimpl.workflows import search_attributes as attrs
from qimpl.workflows.types import FailInput, RunInput
from qimpl.workflows.worker import WORKFLOWS
from tests.conftest import assert_eventually
from tests.integration.deployed import Deployed, create, deployed

RATE_LIMITED = {"steps": 2, "fail": {"steps": [1], "attempts": [1], "error": "rate_limited",
                                     "retry_after_s": 600}}


async def _closed(client: Client, wf_id: str) -> tuple[WorkflowExecutionStatus | None, str | None]:
    """(status, QimplRunState) of the workflow once it closed, within 30 s."""
    handle = client.get_workflow_handle(wf_id)
    for _ in range(600):
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return desc.status, desc.typed_search_attributes.get(attrs.RUN_STATE)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wf_id} still running after 30 s")


@pytest.fixture
def deployment(stack: Any) -> Iterator[Deployed]:
    with deployed(stack, "cancelstate") as d:
        d.processes.worker()
        yield d


@pytest.mark.req("R-CANCEL-1", "R-OPS-6")
def test_a_run_cancelled_while_its_workflow_waits_for_the_deadline_is_tagged_cancelled(
        deployment: Deployed) -> None:
    api = deployment.processes.api()
    with httpx.Client(base_url=api.base_url, headers={"Authorization": "Bearer dev-key"}, timeout=10) as http:
        run_id = create(http, RATE_LIMITED, deadline_s=600)
        wf_id = workflow_id(run_id, 1)

        async def waiting() -> bool:
            client = await Client.connect(deployment.temporal_address, namespace="default")
            events = [e async for e in client.get_workflow_handle(wf_id).fetch_history_events()]
            return any(e.HasField("timer_started_event_attributes") for e in events)

        assert_eventually(lambda: asyncio.run(waiting()), timeout=timedelta(seconds=30),
                          what="the workflow waiting for the run's deadline")
        cancel = http.post(f"/v1/agents/a1/runs/{run_id}/cancel")
        assert cancel.json() == {"cancelled": True, "state": "cancelled"}, cancel.text

    async def closed() -> tuple[WorkflowExecutionStatus | None, str | None]:
        return await _closed(await Client.connect(deployment.temporal_address, namespace="default"), wf_id)

    status, state = asyncio.run(closed())
    # Before the fix: (CANCELED, None).
    assert (status, state) == (WorkflowExecutionStatus.COMPLETED, "cancelled")
    with psycopg.connect(deployment.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT state FROM runs WHERE run_id = %s", (run_id,)).fetchone() == ("cancelled",)


# Stub activities (the workflow's own code is judged, in the sandbox): the agent loop
# gives up, or answers when the test lets it; the run's state, read back, is ``cancelled``.

#: Set by the answering stub when it runs; it answers once ``_ANSWER`` is set.
_STARTED: dict[str, asyncio.Event] = {}
_ANSWER: dict[str, asyncio.Event] = {}


@activity.defn(name="run_agent_v2")
async def _run_agent(inp: RunInput) -> dict[str, Any]:
    if inp.run_id.startswith("gives-up"):
        raise ApplicationError("the agent loop gave up", non_retryable=True)
    _STARTED[inp.run_id].set()
    await _ANSWER[inp.run_id].wait()
    return {"run_id": inp.run_id, "state": "cancelled"}


@activity.defn(name="fail_run_v2")
async def _fail_run(inp: FailInput) -> dict[str, Any]:
    await asyncio.sleep(60)  # cancelled meanwhile
    return {"run_id": inp.run_id, "state": inp.state, "error_code": inp.error_code}


@activity.defn(name="run_outcome_v2")
async def _run_outcome(inp: RunInput) -> dict[str, Any]:
    return {"run_id": inp.run_id, "state": "cancelled", "error_code": None}


def _start_args(wf_type: str, run_id: str) -> tuple[RunInput, Any]:
    inp = RunInput(run_id=run_id, tenant_id="t", generation=1, search_attributes=True,
                   deadline_at=(datetime.now(UTC) + timedelta(seconds=60)).isoformat())
    return inp, (attrs.at_start("t", run_id, 1) if wf_type == "AgentRunWorkflowV3" else None)


def _workflows(client: Client, queue: str) -> Worker:
    # No cache (so no sticky queue): a workflow task after this worker stops goes to the
    # next one at once.
    return Worker(client, task_queue=queue, workflows=list(WORKFLOWS), max_cached_workflows=0,
                  workflow_runner=SandboxedWorkflowRunner())


@pytest.mark.req("R-CANCEL-1", "R-EXEC-10")
@pytest.mark.parametrize("wf_type", ["AgentRunWorkflowV3", "AgentRunWorkflowV2"])
def test_a_workflow_cancelled_while_fail_run_runs_still_tags_its_state(stack: Any, wf_type: str) -> None:
    async def go() -> tuple[WorkflowExecutionStatus | None, str | None]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"cancelled-{uuid.uuid4().hex[:8]}"
        run_id = f"gives-up-{uuid.uuid4().hex[:8]}"
        inp, tags = _start_args(wf_type, run_id)
        async with Worker(client, task_queue=queue, activities=[_run_agent, _fail_run, _run_outcome]), \
                _workflows(client, queue):
            handle = await client.start_workflow(wf_type, inp, id=f"wf-{run_id}", task_queue=queue,
                                                 task_timeout=timedelta(seconds=5), search_attributes=tags)

            async def failing() -> None:
                while True:  # fail_run_v2 scheduled: the agent activity gave up
                    events = [e async for e in handle.fetch_history_events()]
                    if any(e.activity_task_scheduled_event_attributes.activity_type.name == "fail_run_v2"
                           for e in events if e.HasField("activity_task_scheduled_event_attributes")):
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(failing(), timeout=30)
            await handle.cancel()
            return await _closed(client, handle.id)

    # Before the fix: (CANCELED, None): the cancelled fail_run_v2 ended the workflow.
    assert asyncio.run(go()) == (WorkflowExecutionStatus.COMPLETED, "cancelled")


@pytest.mark.req("R-CANCEL-1", "R-EXEC-10")
@pytest.mark.parametrize("wf_type", ["AgentRunWorkflowV3", "AgentRunWorkflowV2"])
def test_a_cancel_that_comes_with_the_activitys_answer_still_tags_its_state(stack: Any, wf_type: str) -> None:
    """The agent activity answers and the cancel request arrives before the workflow's next
    task, so both are in one activation (its workflow worker is stopped in between, as a
    busy one is late): the SDK raises the cancel into the workflow, not the answer."""
    async def go() -> tuple[WorkflowExecutionStatus | None, str | None]:
        client = await Client.connect(stack.info.temporal_address, namespace="default")
        queue = f"cancelled-{uuid.uuid4().hex[:8]}"
        run_id = f"answers-{uuid.uuid4().hex[:8]}"
        _STARTED[run_id], _ANSWER[run_id] = asyncio.Event(), asyncio.Event()
        inp, tags = _start_args(wf_type, run_id)
        async with Worker(client, task_queue=queue, activities=[_run_agent, _fail_run, _run_outcome]):
            async with _workflows(client, queue):
                handle = await client.start_workflow(wf_type, inp, id=f"wf-{run_id}", task_queue=queue,
                                                     task_timeout=timedelta(seconds=5), search_attributes=tags)
                await asyncio.wait_for(_STARTED[run_id].wait(), timeout=30)
            _ANSWER[run_id].set()

            async def answered() -> None:
                while True:
                    events = [e async for e in handle.fetch_history_events()]
                    if any(e.HasField("activity_task_completed_event_attributes") for e in events):
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(answered(), timeout=30)
            await handle.cancel()
            async with _workflows(client, queue):
                return await _closed(client, handle.id)

    # Before the fix: (CANCELED, None).
    assert asyncio.run(go()) == (WorkflowExecutionStatus.COMPLETED, "cancelled")
