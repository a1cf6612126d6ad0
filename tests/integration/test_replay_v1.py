"""Workers keep the version-1 workflow type registered and existing v1 histories replay
(R-EXEC-10). The history was recorded by ``tests/data/record_v1_history.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from qimpl.workflows.worker import WORKFLOWS

HISTORY = Path(__file__).parents[2] / "qualify" / "data" / "agent_run_v1_history.json"


@pytest.mark.req("R-EXEC-10")
def test_recorded_v1_history_replays_on_the_workers_workflows() -> None:
    doc = json.loads(HISTORY.read_text())
    assert any(e.get("workflowExecutionStartedEventAttributes", {}).get("workflowType", {})
               .get("name") == "AgentRunWorkflow" for e in doc["events"]), "not a v1 history"
    history = WorkflowHistory.from_json("agent-run-v1", doc)
    result = asyncio.run(Replayer(workflows=list(WORKFLOWS)).replay_workflow(history))
    assert result.replay_failure is None


@pytest.mark.req("R-EXEC-10")
def test_replay_detects_a_missing_v1_type() -> None:
    """The replay test can fail: without the v1 type registered, replay fails."""
    history = WorkflowHistory.from_json("agent-run-v1", json.loads(HISTORY.read_text()))
    v2_only = [w for w in WORKFLOWS if w.__name__ != "AgentRunWorkflowV1"]
    result = asyncio.run(Replayer(workflows=v2_only).replay_workflow(history, raise_on_replay_failure=False))
    assert result.replay_failure is not None
