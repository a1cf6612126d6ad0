"""Dispatch of one generation to Temporal (R-CREATE-5), shared by the API, resume and the
reconciler: start ``agent-run-{run_id}-g{generation}`` with duplicate ids rejected;
"already started" counts as confirmed; anything else is an unknown outcome."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from qimpl.errors import DispatchUnknown
from qimpl.lifecycle import workflow_id
from qimpl.settings import Settings
from qimpl.workflows.types import RunInput

__all__ = ["dispatch", "run_input"]


def run_input(row: dict[str, Any], settings: Settings) -> RunInput:
    return RunInput(
        run_id=str(row["run_id"]),
        tenant_id=row["tenant_id"],
        generation=int(row["generation"]),
        deadline_at=row["deadline_at"].isoformat(),
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        max_provider_failures=settings.provider_max_failures,
    )


async def dispatch(client: Client, row: dict[str, Any], settings: Settings) -> str:
    """Start the run's current generation; returns ``"started"`` or ``"already_started"``.

    Raises DispatchUnknown when Temporal's answer is unknown (timeout, connection error,
    server unavailable): the workflow may or may not exist.
    """
    wf_id = workflow_id(str(row["run_id"]), int(row["generation"]))
    try:
        await asyncio.wait_for(
            client.start_workflow(
                "AgentRunWorkflowV2",
                run_input(row, settings),
                id=wf_id,
                task_queue=settings.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                rpc_timeout=timedelta(seconds=settings.dispatch_timeout_s),
            ),
            timeout=settings.dispatch_timeout_s,
        )
        return "started"
    except WorkflowAlreadyStartedError:
        return "already_started"
    except Exception as exc:
        raise DispatchUnknown(f"dispatch of {wf_id} unconfirmed: {type(exc).__name__}") from exc
