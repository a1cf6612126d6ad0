"""A never-started agent activity is scheduled again, not the run failed (R-EXEC-13),
judged by replaying a recorded history, deterministically.

``qualify/data/agent_run_v2_redispatch_history.json`` was recorded from
``retry-stranded-on-a-dead-takeover-queue`` (``qualify run``, 2026-12-05) on a run that took
that scenario's path: the activity ended with a ScheduleToStart timeout (event 11) and the
workflow scheduled ``run_agent_v2`` again (event 17), which completed the run. The scenario
cannot always steer Temporal onto that path (the server may run a moved retry instead of
timing it out); this replay judges the workflow's answer to it on every run of the tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from qimpl.workflows.agent_run import AgentRunWorkflowV2
from qimpl.workflows.types import RunInput
from qimpl.workflows.worker import WORKFLOWS

HISTORY = Path(__file__).parents[2] / "qualify" / "data" / "agent_run_v2_redispatch_history.json"


def _history() -> WorkflowHistory:
    doc = json.loads(HISTORY.read_text())
    return WorkflowHistory.from_json("agent-run-v2-redispatch", doc)


def _replay(workflows: list[type]) -> Exception | None:
    replayer = Replayer(workflows=workflows)
    return asyncio.run(replayer.replay_workflow(_history(), raise_on_replay_failure=False)).replay_failure


@workflow.defn(name="AgentRunWorkflowV2", sandboxed=False)
class _NeverRedispatches(AgentRunWorkflowV2):
    """Today's workflow answering a ScheduleToStart timeout as one recorded before
    ``REDISPATCH_PATCH_ID``: it fails the run (what the test below must catch)."""

    async def _generation(self, inp: RunInput) -> dict[str, Any]:
        self._redispatch = False
        return await super()._generation(inp)

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        return await super().run(inp)


@pytest.mark.req("R-EXEC-13")
def test_the_recorded_history_has_a_schedule_to_start_timeout_then_a_new_schedule() -> None:
    events = json.loads(HISTORY.read_text())["events"]
    kinds = [(e["eventType"], (e.get("activityTaskTimedOutEventAttributes") or {}).get("failure", {})
              .get("timeoutFailureInfo", {}).get("timeoutType")) for e in events]
    timed_out = kinds.index(("EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT", "TIMEOUT_TYPE_SCHEDULE_TO_START"))
    assert ("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED", None) in kinds[timed_out:]
    assert kinds[-1][0] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"


@pytest.mark.req("R-EXEC-13")
def test_a_never_started_activity_is_scheduled_again() -> None:
    assert _replay(list(WORKFLOWS)) is None


@pytest.mark.req("R-EXEC-13")
def test_replay_catches_a_workflow_that_fails_the_run_instead() -> None:
    """The replay can fail: the same history on a workflow that answers the timeout by
    failing the run is non-deterministic (it schedules ``fail_run_v2``)."""
    failure = _replay([_NeverRedispatches])
    assert failure is not None
    assert "fail_run_v2" in str(failure) or "nondetermin" in str(failure).lower(), str(failure)
