"""Routes of the tool journal (R-TOOL-3, R-TOOL-4, R-OPS-7):

- ``POST /v1/agents/{agent_id}/runs/{run_id}/tool-results/{call_id}``  a developer-hosted
  call's result, from the run's principal;
- ``GET  /v1/operator/runs/{run_id}/tool-invocations``  the run's journal, for an operator
  of its tenant (the key's own or an assigned one);
- ``POST /v1/operator/runs/{run_id}/tool-invocations/{call_id}/resolution``  what an
  operator found in the owning system for a call whose outcome is unknown.

Neither resumes the run: the client resumes explicitly once every call is settled.
"""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from qimpl.api.auth import Principal
from qimpl.api.deps import AgentId, operator_principal, owned_run, principal_of, services_of
from qimpl.api.errors import ApiError
from qimpl.api.models import (
    Invocation,
    InvocationList,
    Resolution,
    ToolResult,
    ToolResultAnswer,
)
from qimpl.api.openapi import CLIENT_ONLY, PARAMETER_ERRORS, body_errors, errors
from qimpl.db import runs as repo
from qimpl.tool_journal import store as journal_db
from qimpl.tool_journal.rules import UNSETTLED
from qimpl.tool_journal.seam import ToolKind, schema_errors
from qimpl.tool_journal.store import Settlement

__all__ = ["router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()

CallId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]
_SETTLE_CONFLICTS = ("tool_call_not_found, tool_call_settled (another outcome, result or note was already "
                     "recorded), tool_call_kind_mismatch, run_not_parked")
RESULT_ERRORS = errors(
    s401="unauthenticated", s403=CLIENT_ONLY, s404="run_not_found", s409=_SETTLE_CONFLICTS,
    s422=body_errors("tool_result_invalid (``errors`` lists each field and the schema keyword)"))
_OPERATOR_ONLY = "operator_credential_required (R-OPS-7)"
#: Listing a run's tool calls: a GET, so no body and no conflict.
INVOCATIONS_ERRORS = errors(s401="unauthenticated", s403=_OPERATOR_ONLY, s404="run_not_found",
                            s422=PARAMETER_ERRORS)
RESOLUTION_ERRORS = errors(
    s401="unauthenticated", s403=_OPERATOR_ONLY, s404="run_not_found", s409=_SETTLE_CONFLICTS,
    s422=body_errors("resolution_result_required", "resolution_result_unexpected"))
_CLIENT_KINDS = frozenset({str(ToolKind.DEVELOPER_HOSTED)})
_OPERATOR_KINDS = frozenset({str(ToolKind.INSTRUMENTED), str(ToolKind.UNINSTRUMENTED)})


def _conflict(outcome: str) -> ApiError:
    messages = {
        Settlement.UNKNOWN_CALL: "the run has no such tool call",
        Settlement.ALREADY_SETTLED: "the call is already settled with another result",
        Settlement.WRONG_KIND: "this route does not settle calls of that kind",
        Settlement.NOT_PARKED: "the run is not parked waiting for this call",
    }
    return ApiError(409, outcome, messages.get(outcome, outcome))


@router.post("/v1/agents/{agent_id}/runs/{run_id}/tool-results/{call_id}",
             response_model=ToolResultAnswer, responses=RESULT_ERRORS)
async def submit_tool_result(
    agent_id: AgentId,
    run_id: uuid.UUID,
    call_id: CallId,
    body: ToolResult,
    request: Request,
    principal: Annotated[Principal, Depends(principal_of)],
) -> ToolResultAnswer:
    """The result of one developer-hosted call (R-TOOL-4), validated against the call's
    ``result_schema`` (422 ``tool_result_invalid`` with each field and keyword). The same
    result again is idempotent; another result for a settled call, an unknown call id or
    a run not parked for it is 409. ``pending`` lists the calls still waiting: resume the
    run (an empty resume) once it is empty."""
    async with services_of(request).tenant(principal.tenant_id) as conn:
        row = await owned_run(conn, agent_id, run_id, principal)
        rows = {r["call_id"]: r for r in await journal_db.invocations(conn, str(run_id))}
        found = rows.get(call_id)
        if found is None:
            raise _conflict(Settlement.UNKNOWN_CALL)
        if found["kind"] not in _CLIENT_KINDS:
            raise _conflict(Settlement.WRONG_KIND)
        if found["status"] == "requested":
            pending = (row["result_json"] or {}).get("pending_input") or {}
            schema = next((c.get("result_schema") for c in pending.get("calls", [])
                           if c.get("call_id") == call_id), None) or {"type": "object"}
            errors = schema_errors(schema, body.result)
            if errors:
                raise ApiError(422, "tool_result_invalid", "the result does not match the tool's schema",
                               errors=[{"loc": ["body", "result", *e["field"].split(".")],
                                        "code": e["code"], "msg": _schema_msg(e["code"])} for e in errors])
        outcome, _ = await journal_db.settle(
            conn, str(run_id), call_id, status="succeeded", result=body.result,
            settled_by=f"client:{principal.principal_id}", kinds=_CLIENT_KINDS)
        if outcome not in (Settlement.SETTLED, Settlement.REPEATED):
            raise _conflict(outcome)
        left = [r["call_id"] for r in await journal_db.unsettled(conn, str(run_id))]
    return ToolResultAnswer(call_id=call_id, status="succeeded", pending=left)


def _schema_msg(keyword: str) -> str:
    """A line for one failed keyword of a tool's result schema, as a validation error's
    ``msg``; it names the keyword only, never the value sent."""
    return {"required": "a required property is missing",
            "additionalProperties": "a property the schema does not allow"}.get(
        keyword, f"fails the result schema's '{keyword}' keyword")


async def _operator_tenant(request: Request, run_id: uuid.UUID, principal: Principal) -> str:
    """The tenant of ``run_id`` when it is one of the operator's (its key's own or an
    assigned one, R-READ-5); 404 ``run_not_found`` otherwise, as for a run that does not
    exist (no existence leak across tenants)."""
    tenants = principal.tenants or (principal.tenant_id,)
    if len(tenants) == 1:
        return tenants[0]
    async with services_of(request).connection() as conn:
        cur = await conn.execute("SELECT qimpl_tenant_of_run(%s)", (str(run_id),))
        found = await cur.fetchone()
    if found is None or found[0] not in tenants:
        raise ApiError(404, "run_not_found", "no such run")
    return str(found[0])


async def _operator_run(conn: Any, run_id: uuid.UUID, tenant_id: str) -> dict[str, Any]:
    row = await repo.get_run(conn, str(run_id), tenant_id=tenant_id)
    if row is None:
        raise ApiError(404, "run_not_found", "no such run")
    return row


def _invocation(r: dict[str, Any]) -> Invocation:
    return Invocation(**{k: r[k] for k in Invocation.model_fields})


@router.get("/v1/operator/runs/{run_id}/tool-invocations", response_model=InvocationList,
            responses=INVOCATIONS_ERRORS)
async def list_invocations(
    run_id: uuid.UUID,
    request: Request,
    principal: Annotated[Principal, Depends(operator_principal)],
    unsettled_only: bool = True,
) -> InvocationList:
    """The run's tool calls for an operator of its tenant (R-TOOL-3, R-OPS-7): by default
    only the unsettled ones — ``intent`` (unknown: inspect the owning system by
    ``call_id``, the call's idempotency key there) and ``requested``."""
    tenant = await _operator_tenant(request, run_id, principal)
    async with services_of(request).tenant(tenant) as conn:
        row = await _operator_run(conn, run_id, tenant)
        rows = await journal_db.invocations(conn, str(run_id))
    if unsettled_only:
        rows = [r for r in rows if r["status"] in UNSETTLED]
    return InvocationList(run_id=str(run_id), state=row["state"], error_message=row["error_message"],
                          invocations=[_invocation(r) for r in rows])


@router.post("/v1/operator/runs/{run_id}/tool-invocations/{call_id}/resolution",
             response_model=Invocation, responses=RESOLUTION_ERRORS)
async def resolve_invocation(
    run_id: uuid.UUID,
    call_id: CallId,
    body: Resolution,
    request: Request,
    principal: Annotated[Principal, Depends(operator_principal)],
) -> Invocation:
    """Record what really happened to a call whose outcome is unknown (R-TOOL-3):
    ``succeeded`` with the ``result`` seen in the owning system, ``not_executed`` or
    ``compensated``; audited with the operator's principal and ``note``. Allowed while
    the run is parked and after it ended (a cancelled run's call, R-Q34-3); the same
    resolution again is idempotent, another one 409. Nothing runs again: the provider
    is fed this outcome when the client resumes the run. A call recorded ``not_executed``
    or ``compensated`` has no result: ``result`` is null in the answer and in what the
    provider is fed (one recorded so by a version before 2026-12-06 keeps its ``{}``)."""
    if body.outcome == "succeeded" and body.result is None:
        raise ApiError(422, "resolution_result_required", "a succeeded call needs its result")
    if body.outcome != "succeeded" and body.result is not None:
        raise ApiError(422, "resolution_result_unexpected",
                       f"a call recorded {body.outcome} has no result to feed the provider")
    tenant = await _operator_tenant(request, run_id, principal)
    async with services_of(request).tenant(tenant) as conn:
        await _operator_run(conn, run_id, tenant)
        outcome, settled = await journal_db.settle(
            conn, str(run_id), call_id, status=body.outcome, result=body.result,
            settled_by=f"operator:{principal.principal_id}", note=body.note,
            kinds=_OPERATOR_KINDS, after_end=True)
    if outcome not in (Settlement.SETTLED, Settlement.REPEATED) or settled is None:
        raise _conflict(outcome)
    if outcome == Settlement.SETTLED:
        log.info("tool call %s of run %s resolved %s by operator %s", call_id, run_id, body.outcome,
                 principal.principal_id,
                 extra={"event": "tool.resolved", "run_id": str(run_id), "call_id": call_id,
                        "outcome": body.outcome, "operator": principal.principal_id})
    return _invocation(settled)
