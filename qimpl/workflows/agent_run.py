"""The version-2 agent-run workflow: one generation of one run (R-EXEC-1).

Deterministic: the workflow only schedules activities; timeouts derive from the
time left before the run's deadline (R-EXEC-8).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from qimpl.workflows.types import FailInput, RunInput

__all__ = ["AgentRunWorkflowV2"]

MIN_TIMEOUT = timedelta(seconds=1)


@workflow.defn(name="AgentRunWorkflowV2")
class AgentRunWorkflowV2:
    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        left = datetime.fromisoformat(inp.deadline_at) - workflow.now()
        budget = max(left, MIN_TIMEOUT)
        try:
            result: dict[str, Any] = await workflow.execute_activity(
                "run_agent_v2",
                inp,
                schedule_to_close_timeout=budget,
                heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
                # Unlimited attempts, bounded by the deadline: a crashed, paused or fenced
                # attempt must never use up a run's retries (an attempt handed to a paused
                # worker's outstanding poll is lost, too). Provider failures are counted in
                # the run itself and end it `failed` (R-EXEC-6).
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(milliseconds=200),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=1),
                    maximum_attempts=0,
                ),
            )
            return result
        except ActivityError as err:
            overdue = workflow.now() >= datetime.fromisoformat(inp.deadline_at)
            code = "deadline_exceeded" if overdue else "agent_activity_failed"
            workflow.logger.warning("run %s: activity gave up (%s)", inp.run_id, type(err.cause).__name__)
            failed: dict[str, Any] = await workflow.execute_activity(
                "fail_run_v2",
                FailInput(run_id=inp.run_id, generation=inp.generation, error_code=code,
                          state="expired" if overdue else "failed", tenant_id=inp.tenant_id),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=2)),
            )
            return failed
