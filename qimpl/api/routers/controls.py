"""Controls of a run by its principal: resume (R-RESUME-1..3, R-AUTH-2), cancel
(R-CANCEL-1) and the decision on a pending tool approval (R-APPROVAL-1)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Path, Response

from qimpl.api.deps import AgentId, CurrentPrincipal, Svc, owned_run
from qimpl.api.errors import ApiError
from qimpl.api.models import (
    ApprovalAnswer,
    ApprovalDecision,
    CancelAnswer,
    CancelRequest,
    Receipt,
    ResumeRequest,
)
from qimpl.api.openapi import (
    APPROVAL_ERRORS,
    CANCEL_ERRORS,
    RESUME_ERRORS,
    RESUME_HEADERS,
    IdempotencyKey,
)
from qimpl.api.receipts import (
    DISPATCH_FAILURES,
    RESUME_ROUTE,
    answer,
    expire_refused,
    replayable,
    require_grant,
)
from qimpl.crashpoints import declare
from qimpl.db import runs as repo
from qimpl.db.runs import UNSETTLED_SQLSTATE
from qimpl.dispatch import dispatch
from qimpl.errors import DeadlinePassed
from qimpl.lifecycle import TERMINAL, RunState, workflow_id
from qimpl.tool_journal import store as journal_db

__all__ = ["router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()

BEFORE_RESUME_CAS = declare("api.resume.before_cas",
                            "a resume looked its key up and is about to compare-and-set the run")

#: Why a run in this state cannot be resumed (R-RESUME-2).
_NOT_RESUMABLE = {
    "queued": "run_active", "running": "run_active", "awaiting_approval": "run_active",
    "completed": "run_terminal", "failed": "run_terminal", "expired": "run_terminal",
    "cancelled": "run_terminal",
}


async def _journal_settled(conn: Any, row: dict[str, Any]) -> bool:
    """For a run parked by its tool journal: True once every call is settled, so an empty
    resume continues it; 409 ``run_reconciliation_required`` while an outcome is unknown
    (R-RESUME-3, R-TOOL-3) and ``tool_results_pending`` while a developer-hosted call
    waits (R-TOOL-4). False for a run waiting for input (resume needs a prompt)."""
    pending = (row["result_json"] or {}).get("pending_input") or {}
    if pending.get("kind") not in ("reconciliation_required", "tool_result_required"):
        return False
    unsettled = await journal_db.unsettled(conn, str(row["run_id"]))
    if any(c["status"] == "intent" for c in unsettled):
        raise ApiError(409, "run_reconciliation_required",
                       "a tool call's outcome is unknown: an operator must record what happened",
                       pending=[c["call_id"] for c in unsettled if c["status"] == "intent"])
    if unsettled:
        raise ApiError(409, "tool_results_pending", "developer-hosted tool calls wait for results",
                       pending=[c["call_id"] for c in unsettled])
    return True


@router.post("/v1/agents/{agent_id}/runs/{run_id}/resume", status_code=202, response_model=Receipt,
             responses=RESUME_ERRORS, openapi_extra=RESUME_HEADERS)
async def resume_run(
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    principal: CurrentPrincipal,
    body: ResumeRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Resume (R-RESUME-1/2): ``awaiting_input`` + ``additional_prompt`` dispatches the
    next generation (same ``run_id`` and ``deadline_at``); ``accepted`` with an empty body
    retries dispatch of its generation. 409 ``run_active``/``run_terminal``/
    ``run_not_resumable`` otherwise. Replaying the key returns the same receipt."""
    body = body or ResumeRequest()
    if not idempotency_key:
        raise ApiError(400, "idempotency_key_required", "resume needs an Idempotency-Key")
    fingerprint = hashlib.sha256(json.dumps(
        {"run_id": str(run_id), **body.model_dump()}, sort_keys=True).encode()).hexdigest()
    scope = {"tenant_id": principal.tenant_id, "principal_id": principal.principal_id,
             "route": RESUME_ROUTE, "key": idempotency_key}
    async with svc.tenant(principal.tenant_id) as conn:
        row = await owned_run(conn, agent_id, run_id, principal)
    if row["state"] == RunState.AWAITING_INPUT:
        # R-AUTH-2: access to the run's workspace is checked again at every resume.
        await require_grant(svc, principal, row["workspace_id"], "workspace_access_revoked")
    resumed: dict[str, Any] | None = None
    expired = False
    async with svc.tenant(principal.tenant_id) as conn:
        record = await repo.lookup_idempotency(conn, **scope)
        replay = await replayable(conn, record, fingerprint, svc.settings) if record else None
        state = row["state"]
        if replay is not None:
            pass
        elif state == RunState.ACCEPTED:
            if body.additional_prompt is not None and int(row["generation"]) > 1:
                # A resume with input read a generation another resume just accepted (a
                # tester's finding: told to drop its input and send an empty body).
                raise ApiError(409, "run_resume_conflict", "another resume of this run won")
            if body.additional_prompt is not None:
                raise ApiError(409, "run_not_resumable",
                               "an accepted run takes no input; resume with an empty body")
            # Past its deadline an accepted run is expired, never dispatched (R-EXEC-8).
            expired = await repo.expire_if_overdue(conn, str(run_id)) is not None
        elif state != RunState.AWAITING_INPUT:
            raise ApiError(409, _NOT_RESUMABLE.get(state, "run_not_resumable"),
                           f"a run in state {state} cannot be resumed")
        elif not await _journal_settled(conn, row) and body.additional_prompt is None:
            raise ApiError(409, "run_not_resumable", "a waiting run needs additional_prompt")
        else:
            # The harness holds a request here to make a same-key rival win the
            # compare-and-set first (qualify's same-key-resume-loses-the-race).
            await BEFORE_RESUME_CAS.areach(run_id=str(run_id))
            try:
                resumed = await repo.resume_or_none(
                    conn, str(run_id), expected_row_version=row["row_version"],
                    additional_prompt=body.additional_prompt, fingerprint=fingerprint, **scope)
            except psycopg.Error as exc:
                if exc.sqlstate != UNSETTLED_SQLSTATE:
                    raise
                # A settlement was withdrawn under us? No: the guard saw an unsettled
                # call that the read above did not (R-RESUME-3): never resume past it.
                raise ApiError(409, "run_reconciliation_required",
                               "the run's tool journal has unsettled calls") from None
            except DeadlinePassed:
                resumed = None
                expired = True
            else:
                if resumed is None:
                    # Lost the compare-and-set. To a request with this same key, which won
                    # it: answer as the key does (a replay, 409 in flight, 422 another body),
                    # never as a rival resume (R-CREATE-2 holds for every keyed route).
                    record = await repo.lookup_idempotency(conn, **scope)
                    if record is not None:
                        replay = await replayable(conn, record, fingerprint, svc.settings)
                if resumed is None and replay is None:
                    now = await repo.get_run(conn, str(run_id))
                    if now is not None and RunState(now["state"]) in TERMINAL:
                        raise ApiError(409, "run_terminal", f"the run is {now['state']}",
                                       error_code=now["error_code"])
                    raise ApiError(409, "run_resume_conflict", "another resume of this run won")
    if expired:
        await expire_refused(svc, principal.tenant_id, str(run_id))
    # Dispatch outside the transaction: nothing is held open across a network call.
    if replay is not None:
        return await answer(svc, replay, replayed=True)
    if resumed is None:  # an accepted run: retry the dispatch of its generation
        return await answer(svc, row, replayed=False)
    response = await answer(svc, resumed, replayed=False)
    async with svc.tenant(principal.tenant_id) as conn:
        await repo.complete_idempotency(conn, **scope)
    return response


@router.post("/v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}",
             response_model=ApprovalAnswer, responses=APPROVAL_ERRORS)
async def decide_approval(
    agent_id: AgentId,
    run_id: uuid.UUID,
    approval_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")],
    body: ApprovalDecision,
    svc: Svc,
    principal: CurrentPrincipal,
) -> ApprovalAnswer:
    """Decide the run's pending approval (R-APPROVAL-1) with its exact ``action_version``:
    a stale or unknown version is 409 ``action_version_mismatch`` and runs nothing; the
    same decision again is idempotent; the opposite one is 409 ``approval_conflict``;
    another principal gets 404; a cancelled or finished run, 409 ``run_terminal``. An
    accepted decision queues the run's next generation and dispatches it."""
    try:
        async with svc.tenant(principal.tenant_id) as conn:
            await owned_run(conn, agent_id, run_id, principal)
            outcome, row = await repo.decide_approval(
                conn, str(run_id), approval_id=approval_id, action_version=body.action_version,
                approved=body.approved, tenant_id=principal.tenant_id,
                principal_id=principal.principal_id)
    except DeadlinePassed:
        await expire_refused(svc, principal.tenant_id, str(run_id))
    if outcome == "approval_not_found":
        raise ApiError(404, outcome, "no such approval on this run")
    if outcome not in ("decided", "repeated"):
        raise ApiError(409, outcome, f"the decision cannot be taken: {outcome}")
    if outcome == "decided":
        try:
            await dispatch(await svc.temporal(), row, svc.settings)
        except DISPATCH_FAILURES as exc:
            # The run is queued in its new generation; the reconciler dispatches it.
            log.warning("dispatch after approval unknown for %s: %s", run_id, type(exc).__name__,
                        extra={"run_id": str(run_id)})
    return ApprovalAnswer(approval_id=approval_id, approved=body.approved, state=row["state"],
                          generation=row["generation"])


@router.post("/v1/agents/{agent_id}/runs/{run_id}/cancel", response_model=CancelAnswer,
             responses=CANCEL_ERRORS)
async def cancel_run(
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    principal: CurrentPrincipal,
    body: CancelRequest | None = None,
) -> CancelAnswer:
    """Cancel (R-CANCEL-1): persisted first, then Temporal told, best effort.
    ``cancelled`` is true also when already cancelled, false for completed, failed
    and expired runs. No body or ``{}``; any field is 422 ``unknown_field``."""
    del body  # validated only: a cancel takes no input
    async with svc.tenant(principal.tenant_id) as conn:
        await owned_run(conn, agent_id, run_id, principal)
        cancelled, row = await repo.cancel(conn, str(run_id))
    if cancelled and row["dispatch_confirmed_at"] is not None:
        try:
            client = await svc.temporal()
            handle = client.get_workflow_handle(workflow_id(str(run_id), int(row["generation"])))
            await asyncio.wait_for(handle.cancel(), timeout=svc.settings.dispatch_timeout_s)
        except Exception as exc:  # noqa: BLE001 - best effort: the worker observes the row
            log.info("temporal not told of cancel of %s: %s", run_id, type(exc).__name__)
    return CancelAnswer(cancelled=cancelled, state=row["state"])
