"""Create and read runs (R-CREATE-1..6, R-READ-1, R-AUTH-1)."""

from __future__ import annotations

import logging
import secrets
import uuid
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from qimpl.api.auth import Principal
from qimpl.api.deps import AgentId, CurrentPrincipal, Services, Svc, owned_run
from qimpl.api.errors import ApiError
from qimpl.api.models import CreateRunRequest, Receipt, RunView
from qimpl.api.openapi import (
    CREATE_ERRORS,
    CREATE_HEADERS,
    CREATE_LINKS,
    READ_ERRORS,
    READ_LINKS,
    IdempotencyKey,
)
from qimpl.api.receipts import (
    AFTER_ACCEPT,
    CREATE_ROUTE,
    INSIDE_ACCEPT,
    answer,
    check_grant,
    fingerprint,
    replayable,
    require_grant,
)
from qimpl.api.views import read_view
from qimpl.db import runs as repo
from qimpl.lifecycle import RunState, workflow_id

__all__ = ["router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()


async def create_legacy(svc: Services, agent_id: str, body: CreateRunRequest, principal: Principal,
                        key: str | None) -> Response:
    """R-CREATE-6: the legacy inline path, executed in this process (no restart promise)."""
    run_id = str(uuid.uuid4())
    digest = fingerprint(agent_id, body)
    await require_grant(svc, principal, body.workspace_id, "workspace_access_denied")
    async with svc.tenant(principal.tenant_id) as conn:
        row = await repo.insert_run_or_none(
            conn, run_id=run_id, tenant_id=principal.tenant_id, principal_id=principal.principal_id,
            agent_id=agent_id, prompt=body.prompt, request=body.model_dump(),
            stream_key=secrets.token_urlsafe(24), deadline_s=body.deadline_seconds, workflow_id=None,
            route=CREATE_ROUTE, idempotency_key=key, fingerprint=digest,
            lifecycle_version=1, workspace_id=body.workspace_id)
        if row is None:
            # The key was used before (R-CREATE-2 scopes keys per route, not per path
            # taken): another body is 422 whichever path the first one took; the same
            # body replays the first receipt and starts nothing.
            record = await repo.lookup_idempotency(conn, tenant_id=principal.tenant_id,
                                                   principal_id=principal.principal_id,
                                                   route=CREATE_ROUTE, key=str(key))
            if record is None or record["fingerprint"] != digest:
                raise ApiError(422, "idempotency_key_reused",
                               "this Idempotency-Key was used with a different request")
            first = await repo.get_run(conn, str(record["run_id"]))
            if first is None:
                raise ApiError(404, "run_not_found", "no such run")
            return JSONResponse(_legacy_receipt(agent_id, first), 202, headers={"Idempotent-Replayed": "true"})
    svc.spawn(svc.run_legacy(run_id, principal.tenant_id))
    return JSONResponse(_legacy_receipt(agent_id, {**row, "state": RunState.QUEUED}), 202)


def _legacy_receipt(agent_id: str, row: dict[str, Any]) -> dict[str, Any]:
    return Receipt(agent_id=agent_id, run_id=str(row["run_id"]), stream_key=row["stream_key"],
                   state=row["state"], lifecycle_version=1, durability="legacy",
                   deadline_at=row["deadline_at"]).model_dump(mode="json")


@router.post(
    "/v1/agents/{agent_id}/runs", status_code=202, response_model=Receipt, responses={**CREATE_ERRORS, **CREATE_LINKS},
    openapi_extra=CREATE_HEADERS,
)
async def create_run(
    agent_id: AgentId,
    body: CreateRunRequest,
    svc: Svc,
    principal: CurrentPrincipal,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Create a durable run (R-CREATE-1..5). 202 with the receipt once Temporal confirmed
    the start; 503 ``durable_dispatch_unknown`` with the receipt when it could not.

    A replay of an accepted request (same principal, key and body) returns the original
    receipt whatever happened to the principal's workspace grant since (R-CREATE-2): the
    grant is checked only for new work (403 ``workspace_access_denied``), and a resume
    checks it again (R-AUTH-2)."""
    idempotency_key = idempotency_key or None  # an empty header is no key
    if not body.durable_temporal:
        return await create_legacy(svc, agent_id, body, principal, idempotency_key)
    if not idempotency_key:
        raise ApiError(400, "idempotency_key_required", "durable creation needs an Idempotency-Key")
    digest = fingerprint(agent_id, body)
    scope = {"tenant_id": principal.tenant_id, "principal_id": principal.principal_id,
             "route": CREATE_ROUTE, "key": idempotency_key}
    run_id = str(uuid.uuid4())
    # One transaction: the key's lookup, the grant (checked only for new work) and the
    # insert; a replay or a refusal writes nothing.
    async with svc.tenant(principal.tenant_id) as conn:
        record = await repo.lookup_idempotency(conn, **scope)
        if record is not None:
            row: dict[str, Any] | None = await replayable(conn, record, digest, svc.settings)
        else:
            await check_grant(conn, principal, body.workspace_id, "workspace_access_denied")
            row = await repo.insert_run_or_none(
                conn, run_id=run_id, tenant_id=principal.tenant_id,
                principal_id=principal.principal_id, agent_id=agent_id, prompt=body.prompt,
                request=body.model_dump(), stream_key=secrets.token_urlsafe(24),
                deadline_s=body.deadline_seconds, workflow_id=workflow_id(run_id, 1),
                route=CREATE_ROUTE, idempotency_key=idempotency_key, fingerprint=digest,
                workspace_id=body.workspace_id,
            )
            if row is None:  # a concurrent request with the key committed first
                record = await repo.lookup_idempotency(conn, **scope)
                row = await replayable(conn, record, digest, svc.settings)
            else:
                record = None
                await INSIDE_ACCEPT.areach(run_id=run_id)
    assert row is not None
    if record is not None:
        return await answer(svc, row, replayed=True)
    await AFTER_ACCEPT.areach(run_id=run_id)
    # The key's record completes with the dispatch's confirmation (R-CREATE-2, R-CREATE-5).
    return await answer(svc, row, replayed=False, completes=scope)


@router.get("/v1/agents/{agent_id}/runs/{run_id}", response_model=RunView, responses={**READ_ERRORS, **READ_LINKS})
async def read_run(
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    principal: CurrentPrincipal,
) -> RunView:
    """Read a run (R-READ-1); another principal or tenant gets 404 (R-AUTH-1)."""
    async with svc.tenant(principal.tenant_id) as conn:
        return await read_view(conn, await owned_run(conn, agent_id, run_id, principal))
