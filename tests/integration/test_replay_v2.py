"""Histories of the version-2 workflow recorded before it set search attributes still
replay (R-EXEC-10, issue 25 item 14). The history was recorded by
``tests/data/record_history.py`` on the code before that change."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.common import RetryPolicy
from temporalio.worker import Replayer

from qimpl.workflows import search_attributes as attrs
from qimpl.workflows.types import RunInput
from qimpl.workflows.worker import WORKFLOWS

HISTORY = Path(__file__).parents[2] / "qualify" / "data" / "agent_run_v2_history.json"


def _history(**input_changes: Any) -> WorkflowHistory:
    """The recorded history, its workflow input changed by ``input_changes``."""
    doc = json.loads(HISTORY.read_text())
    started = doc["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = started["input"]["payloads"][0]
    inp = json.loads(base64.b64decode(payload["data"])) | input_changes
    payload["data"] = base64.b64encode(json.dumps(inp).encode()).decode()
    return WorkflowHistory.from_json("agent-run-v2", doc)


def _replay(history: WorkflowHistory, workflows: list[type]) -> Exception | None:
    replayer = Replayer(workflows=workflows)
    return asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure


@pytest.mark.req("R-EXEC-10")
def test_v2_history_from_before_search_attributes_replays() -> None:
    doc = json.loads(HISTORY.read_text())
    kinds = [e["eventType"] for e in doc["events"]]
    assert "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" not in kinds, "not a pre-attribute history"
    assert "EVENT_TYPE_MARKER_RECORDED" not in kinds
    assert _replay(_history(), list(WORKFLOWS)) is None


@pytest.mark.req("R-EXEC-10")
def test_a_pre_patch_worker_history_of_a_tagged_input_replays() -> None:
    """A rolling upgrade: an API of today dispatched ``search_attributes: true`` and a
    worker from before the change ran the generation (it knows no such field). Today's
    workflow replays that history only thanks to ``workflow.patched``."""
    assert _replay(_history(search_attributes=True), list(WORKFLOWS)) is None


@workflow.defn(name="AgentRunWorkflowV2", sandboxed=False)
class _Unpatched:
    """Today's workflow with the patch guard removed: what the test above must catch."""

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        if inp.search_attributes:
            workflow.upsert_search_attributes([attrs.TENANT.value_set(inp.tenant_id)])
        left = datetime.fromisoformat(inp.deadline_at) - workflow.now()
        result: dict[str, Any] = await workflow.execute_activity(
            "run_agent_v2", inp, schedule_to_close_timeout=max(left, timedelta(seconds=1)),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                     backoff_coefficient=2.0, maximum_interval=timedelta(seconds=1),
                                     maximum_attempts=0))
        return result


@pytest.mark.req("R-EXEC-10")
def test_replay_catches_search_attributes_without_the_patch() -> None:
    """The replay test can fail: set unconditionally, the upsert is a command the recorded
    history does not have (non-determinism)."""
    assert _replay(_history(search_attributes=True), [_Unpatched]) is not None
    assert _replay(_history(), [_Unpatched]) is None  # same commands when the flag is off
