"""The pre-durable surface: ``POST /v1/answer`` (R-CREATE-7) and the legacy run controls,
which a durable run refuses with 409 ``durable_lifecycle_conflict`` (R-LEGACY-1)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from qimpl.api.auth import Principal
from qimpl.api.deps import AgentId, CurrentPrincipal, Services, Svc, owned_run
from qimpl.api.errors import ApiError
from qimpl.api.models import AnswerIn, AnswerOut
from qimpl.api.openapi import ANSWER_ERRORS, LEGACY_ERRORS
from qimpl.legacy import answer_inline

__all__ = ["LEGACY_CONTROLS", "router"]

log = logging.getLogger("qimpl.api")

router = APIRouter()

#: ``(path under the run, control name)`` of every legacy control.
LEGACY_CONTROLS = (
    ("checkpoints/{checkpoint_id}/rollback", "checkpoint rollback"),
    ("checkpoints/{checkpoint_id}/resume", "checkpoint resume"),
    ("checkpoints/{checkpoint_id}/branch", "checkpoint branch"),
    ("checkpoints", "manual checkpoint insertion"),
    ("pause", "pause"),
    ("handoff", "handoff"),
)


@router.post("/v1/answer", response_model=AnswerOut, responses=ANSWER_ERRORS)
async def answer(
    body: AnswerIn,
    svc: Svc,
    principal: CurrentPrincipal,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Synchronous answer (R-CREATE-7): JSON, or SSE when ``Accept: text/event-stream``
    (events ``answer`` then ``done``; on failure one ``error`` event with a code).
    Durable runs do not change it; nothing is stored."""
    run_id = f"answer-{uuid.uuid4()}"

    async def compute() -> dict[str, Any]:
        return await answer_inline(svc.provider, prompt=body.prompt, run_id=run_id,
                                   tenant_id=principal.tenant_id)

    if "text/event-stream" in (accept or ""):
        async def events() -> AsyncIterator[dict[str, str]]:
            try:
                out = await compute()
            except Exception as exc:  # noqa: BLE001 - streamed as a coded event, never a trace
                log.warning("answer failed: %s", type(exc).__name__)
                yield {"event": "error", "data": json.dumps({"code": "answer_failed"})}
                return
            yield {"event": "answer", "data": json.dumps(out)}
            yield {"event": "done", "data": "{}"}

        return EventSourceResponse(events())
    try:
        out = await compute()
    except Exception as exc:  # noqa: BLE001 - a coded error, never a trace
        log.warning("answer failed: %s", type(exc).__name__)
        raise ApiError(502, "answer_failed", "the provider could not answer") from None
    return JSONResponse(AnswerOut(**out).model_dump())


async def _legacy_control(svc: Services, agent_id: str, run_id: uuid.UUID,
                          principal: Principal, control: str) -> Response:
    async with svc.tenant(principal.tenant_id) as conn:
        row = await owned_run(conn, agent_id, run_id, principal)
    if row["lifecycle_version"] == 2:
        raise ApiError(409, "durable_lifecycle_conflict",
                       f"{control} is a legacy control; durable (lifecycle 2) runs use cancel and resume")
    raise ApiError(501, "legacy_control_unavailable", f"{control} is not served by this deployment")


def _legacy_handler(control: str, with_checkpoint: bool) -> Callable[..., Awaitable[Response]]:
    if with_checkpoint:
        async def on_checkpoint(
            agent_id: AgentId, run_id: uuid.UUID, checkpoint_id: str, svc: Svc,
            principal: CurrentPrincipal,
        ) -> Response:
            return await _legacy_control(svc, agent_id, run_id, principal, control)

        return on_checkpoint

    async def on_run(
        agent_id: AgentId, run_id: uuid.UUID, svc: Svc, principal: CurrentPrincipal,
    ) -> Response:
        return await _legacy_control(svc, agent_id, run_id, principal, control)

    return on_run


for _path, _control in LEGACY_CONTROLS:
    router.add_api_route(
        f"/v1/agents/{{agent_id}}/runs/{{run_id}}/{_path}",
        _legacy_handler(_control, "{checkpoint_id}" in _path), methods=["POST"],
        responses=LEGACY_ERRORS, status_code=409, name=f"legacy {_control}",
        summary=f"Legacy {_control}",
        description="R-LEGACY-1: 409 `durable_lifecycle_conflict` for lifecycle 2 runs.")
