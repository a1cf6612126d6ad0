"""Dispatch of one generation to Temporal (R-CREATE-5), shared by the API, resume and the
reconciler: start ``agent-run-{run_id}-g{generation}`` with duplicate ids rejected;
"already started" counts as confirmed while that execution is open — a closed one
(terminated, timed out, or finished without the run) is not a confirmation (R-OPS-8);
anything else is an unknown outcome."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from qimpl.errors import DispatchUnknown
from qimpl.lifecycle import workflow_id
from qimpl.settings import Settings
from qimpl.workflows import search_attributes as attrs
from qimpl.workflows.agent_run import WORKFLOW_TYPE
from qimpl.workflows.types import RunInput

__all__ = ["dispatch", "run_input", "workflow_status"]


def run_input(row: dict[str, Any], settings: Settings) -> RunInput:
    return RunInput(
        run_id=str(row["run_id"]),
        tenant_id=row["tenant_id"],
        generation=int(row["generation"]),
        deadline_at=row["deadline_at"].isoformat(),
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        max_provider_failures=settings.provider_max_failures,
        lease_s=settings.lease,
        failure_backoff_s=settings.provider_backoff_s,
        failure_backoff_max_s=settings.provider_backoff_max_s,
        search_attributes=settings.temporal_search_attributes,
    )


async def dispatch(client: Client, row: dict[str, Any], settings: Settings) -> str:
    """Start the run's current generation; returns ``"started"``, ``"already_started"``
    (its execution is open) or ``"closed"`` (its execution already closed: the generation
    cannot run any more; the caller ends the run, R-OPS-8).

    Raises DispatchUnknown when Temporal's answer is unknown (timeout, connection error,
    server unavailable): the workflow may or may not exist.
    """
    wf_id = workflow_id(str(row["run_id"]), int(row["generation"]))
    inp = run_input(row, settings)
    try:
        await asyncio.wait_for(
            client.start_workflow(
                WORKFLOW_TYPE,
                inp,
                id=wf_id,
                task_queue=settings.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                task_timeout=timedelta(seconds=settings.workflow_task_timeout_s),
                rpc_timeout=timedelta(seconds=settings.dispatch_timeout_s),
                # Set at the start, so a generation is found by tenant before any worker
                # ran it, and its workflow records no command for them (R-EXEC-10).
                search_attributes=(attrs.at_start(inp.tenant_id, inp.run_id, inp.generation)
                                   if inp.search_attributes else None),
            ),
            timeout=settings.dispatch_timeout_s,
        )
        return "started"
    except WorkflowAlreadyStartedError:
        pass
    except RPCError as exc:
        # Its status is logged. INVALID_ARGUMENT is a refusal (nothing started), most
        # likely a namespace without qimpl's search attributes (docs/operations.md); the
        # run stays accepted and the reconciler dispatches it once they are registered.
        raise DispatchUnknown(f"dispatch of {wf_id} unconfirmed: Temporal answered {exc.status.name}"
                              + (" (are the search attributes registered in the namespace?)"
                                 if exc.status == RPCStatusCode.INVALID_ARGUMENT else "")) from exc
    except Exception as exc:
        raise DispatchUnknown(f"dispatch of {wf_id} unconfirmed: {type(exc).__name__}") from exc
    try:
        status = await workflow_status(client, wf_id, settings.dispatch_timeout_s)
    except Exception as exc:
        raise DispatchUnknown(f"dispatch of {wf_id} unconfirmed: {type(exc).__name__}") from exc
    return "already_started" if status == "open" else "closed"


async def workflow_status(client: Client, wf_id: str, timeout_s: float) -> str:
    """``"open"``, ``"closed"`` or ``"missing"`` (no such execution: never started, or
    lost with a non-persistent Temporal store). Raises on any other error."""
    try:
        desc = await client.get_workflow_handle(wf_id).describe(
            rpc_timeout=timedelta(seconds=timeout_s))
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return "missing"
        raise
    return "open" if desc.status == WorkflowExecutionStatus.RUNNING else "closed"
