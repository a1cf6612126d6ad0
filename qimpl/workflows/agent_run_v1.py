"""The version-1 workflow type, kept registered so that existing histories still replay
(R-EXEC-10). New runs never start it: today's is ``AgentRunWorkflowV3``.

Do not change its commands: ``tests/integration/test_replay_v1.py`` replays a history
recorded from this code and fails on any non-deterministic change.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

__all__ = ["AgentRunWorkflowV1"]


@workflow.defn(name="AgentRunWorkflow")
class AgentRunWorkflowV1:
    @workflow.run
    async def run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            "run_agent_v1",
            run_id,
            start_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return result
