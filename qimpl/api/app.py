"""The FastAPI application: ``uvicorn --factory qimpl.api.app:create_app``.

Routes (R-CREATE-1..5, R-READ-1):

- ``POST /v1/agents/{agent_id}/runs``            create a run (durable, or legacy inline), 202 + receipt
- ``POST /v1/answer``                             synchronous answer, JSON or SSE (R-CREATE-7)
- ``GET  /v1/agents/{agent_id}/runs/{run_id}``   read a run
- ``POST /v1/agents/{agent_id}/runs/{run_id}/cancel``  cancel (R-CANCEL-1)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/resume``  resume (R-RESUME-1..3)
- ``POST /v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}``  decide (R-APPROVAL-1)
- ``GET  /v1/agents/{agent_id}/runs/{run_id}/events``  the event stream (R-EVENT-2)
- tool results and the operator's reconciliation: ``qimpl.api.tool_routes`` (R-TOOL-3/4)
- ``GET  /metrics``                               Prometheus metrics (R-OPS-6)
- ``GET  /healthz``                               liveness (no database or Temporal call)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, Header, Path, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import PoolTimeout
from sse_starlette.sse import EventSourceResponse

from qimpl import journal, metrics
from qimpl.api import tool_routes
from qimpl.api.auth import Principal
from qimpl.api.deps import AgentId, Services, owned_run, principal_of, services_of
from qimpl.api.errors import ApiError, install_error_handlers
from qimpl.api.events import stream_events
from qimpl.api.models import (
    AnswerIn,
    AnswerOut,
    ApprovalAnswer,
    ApprovalDecision,
    CancelAnswer,
    CreateRunRequest,
    ErrorBody,
    Receipt,
    ResumeRequest,
    RunView,
)
from qimpl.api.validation import VALIDATION_CODES
from qimpl.crashpoints import declare
from qimpl.db import journal as journal_db
from qimpl.db import runs as repo
from qimpl.db.roles import warn_if_rls_bypassed
from qimpl.db.runs import UNSETTLED_SQLSTATE
from qimpl.dispatch import dispatch
from qimpl.errors import SAFE_MESSAGES, DeadlinePassed, DispatchUnknown
from qimpl.legacy import answer_inline
from qimpl.lifecycle import TERMINAL, RunState, workflow_id
from qimpl.logs import setup_logging
from qimpl.settings import ApiSettings, Settings, exit_config, load_or_exit, plugin_error

__all__ = ["create_app"]

log = logging.getLogger("qimpl.api")

AFTER_ACCEPT = declare("api.after_acceptance_commit", "the run is committed `accepted`, dispatch not yet asked")
AFTER_DISPATCH = declare("api.after_dispatch", "Temporal accepted the workflow, `queued` not yet committed")

#: How long the API's start waits for its first database connection.
DB_START_TIMEOUT_S = 10.0

CREATE_ROUTE = "POST /v1/agents/{agent_id}/runs"
_KEY_PATTERN, _KEY_MAX = r"^[\x21-\x7e]+$", 255
#: Optional to FastAPI, so that a missing key gets the route's own 400
#: ``idempotency_key_required``; documented as required (``_required_header``).
IdempotencyKey = Annotated[str | None, Header(max_length=_KEY_MAX, pattern=_KEY_PATTERN,
                                              include_in_schema=False)]
_STREAM_KEY_MAX = 128
RESUME_ROUTE = "POST /v1/agents/{agent_id}/runs/{run_id}/resume"

#: Why a run in this state cannot be resumed (R-RESUME-2).
_NOT_RESUMABLE = {
    "queued": "run_active", "running": "run_active", "awaiting_approval": "run_active",
    "completed": "run_terminal", "failed": "run_terminal", "expired": "run_terminal",
    "cancelled": "run_terminal",
}

#: What an unconfirmed start looks like: Temporal's answer unknown, or no client at all.
DISPATCH_FAILURES = (DispatchUnknown, TimeoutError, OSError, RuntimeError)


def _required_header(name: str, description: str, **schema: Any) -> dict[str, Any]:
    """OpenAPI ``openapi_extra`` documenting header ``name`` as required. The handler's
    own parameter stays optional (``include_in_schema=False``) so that a request without
    it gets the route's coded error (400 ``idempotency_key_required``, 401
    ``stream_key_required``) rather than FastAPI's 422: runtime behaviour is unchanged."""
    return {"parameters": [{"name": name, "in": "header", "required": True,
                            "description": description, "schema": {"type": "string", **schema}}]}


_IDEMPOTENCY = {"maxLength": _KEY_MAX, "pattern": _KEY_PATTERN}
CREATE_HEADERS = _required_header(
    "Idempotency-Key", "Required for a durable run (`durable_temporal: true`); without it 400 "
    "`idempotency_key_required` (R-CREATE-2). Keys are scoped to tenant, principal and route. "
    "The legacy inline path (R-CREATE-6) also accepts a request without one.", **_IDEMPOTENCY)
RESUME_HEADERS = _required_header(
    "Idempotency-Key", "A new key per resume; without it 400 `idempotency_key_required` "
    "(R-RESUME-1). Replaying a key returns the same receipt.", **_IDEMPOTENCY)
EVENTS_HEADERS = _required_header(
    "X-Stream-Key", "The run's stream key from its receipt; without it 401 "
    "`stream_key_required` (R-AUTH-3).", maxLength=_STREAM_KEY_MAX)


def _errors(**by_status: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` listing every error code a route can return, by status."""
    return {int(k.removeprefix("s")): {"model": ErrorBody, "description": "codes: " + v}
            for k, v in by_status.items()}


_VALIDATION = ", ".join(VALIDATION_CODES)
_AUTH = "unauthenticated"
_NOT_FOUND = "run_not_found"
CREATE_ERRORS = _errors(
    s400="idempotency_key_required", s401=_AUTH, s409="idempotency_key_in_flight",
    s422=f"{_VALIDATION}, idempotency_key_reused",
    s503="durable_dispatch_unknown (the body carries the receipt; retryable: false)")
READ_ERRORS = _errors(s401=_AUTH, s404=_NOT_FOUND, s422=_VALIDATION)
_BUSY = "run_busy (the run's row stayed locked past the lock timeout; retryable: true)"
CANCEL_ERRORS = _errors(s401=_AUTH, s404=_NOT_FOUND, s422=_VALIDATION, s503=_BUSY)
RESUME_ERRORS = _errors(
    s400="idempotency_key_required", s401=_AUTH, s404=_NOT_FOUND,
    s409="run_active, run_terminal (also when the deadline passed: the run is expired), "
         "run_not_resumable, run_resume_conflict, run_reconciliation_required (a tool call's "
         "outcome is unknown, R-RESUME-3), tool_results_pending (R-TOOL-4)",
    s422=f"{_VALIDATION}, idempotency_key_reused",
    s503=f"durable_dispatch_unknown (the body carries the receipt), {_BUSY}")
ANSWER_ERRORS = _errors(s401=_AUTH, s422=_VALIDATION, s502="answer_failed")
EVENTS_ERRORS = _errors(s401="stream_key_required", s404=_NOT_FOUND, s422=_VALIDATION)
APPROVAL_ERRORS = _errors(
    s401=_AUTH, s404=f"{_NOT_FOUND}, approval_not_found",
    s409="action_version_mismatch, approval_conflict, approval_not_pending, run_terminal "
         "(also when the deadline passed: the run is expired)",
    s422=_VALIDATION, s503=_BUSY)
LEGACY_ERRORS = _errors(s401=_AUTH, s404=_NOT_FOUND, s422=_VALIDATION,
                        s409="durable_lifecycle_conflict (lifecycle_version 2 runs)",
                        s501="legacy_control_unavailable (lifecycle_version 1 runs)")


def _fingerprint(agent_id: str, body: CreateRunRequest) -> str:
    canonical = json.dumps({"agent_id": agent_id, **body.model_dump()}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _receipt(row: dict[str, Any]) -> Receipt:
    confirmed = row["dispatch_confirmed_at"] is not None
    return Receipt(
        agent_id=row["agent_id"],
        run_id=str(row["run_id"]),
        stream_key=row["stream_key"],
        state=RunState.QUEUED if confirmed else RunState.ACCEPTED,
        lifecycle_version=row["lifecycle_version"],
        durability=row["durability"],
        deadline_at=row["deadline_at"],
    )


def _view(row: dict[str, Any], invocations: list[dict[str, Any]]) -> RunView:
    return RunView(
        run_id=str(row["run_id"]), agent_id=row["agent_id"], state=row["state"],
        durability=row["durability"], lifecycle_version=row["lifecycle_version"],
        row_version=row["row_version"], generation=row["generation"],
        deadline_at=row["deadline_at"], accepted_at=row["accepted_at"],
        started_at=row["started_at"], completed_at=row["completed_at"],
        result_json=row["result_json"], error_code=row["error_code"],
        error_message=row["error_message"], usage=_usage(row),
        tool_invocations=journal.summary(invocations),
    )


def _usage(row: dict[str, Any]) -> dict[str, Any]:
    """Observed usage (R-Q34-2): the counters the owner committed (provider calls, tokens,
    tool calls) and the wall time from start to end (or to now, while live)."""
    usage = dict(row["usage"] or {})
    if row["started_at"] is not None:
        end = row["completed_at"] or datetime.now(UTC)
        usage["wall_s"] = round((end - row["started_at"]).total_seconds(), 3)
    return usage


async def _confirm(services: Services, row: dict[str, Any]) -> dict[str, Any]:
    """Dispatch an ``accepted`` run's generation and commit ``queued``; raises
    DispatchUnknown. A run whose deadline passed meanwhile is expired (R-EXEC-8); one
    whose workflow is already closed without it is failed ``workflow_vanished`` (R-OPS-8)."""
    client = await services.temporal()
    run_id, generation = str(row["run_id"]), int(row["generation"])
    started = await dispatch(client, row, services.settings)
    AFTER_DISPATCH.reach(run_id=run_id)
    async with services.tenant(row["tenant_id"]) as conn:
        if started == "closed":
            confirmed = await repo.end_unowned(
                conn, run_id, generation=generation, state=RunState.FAILED,
                error_code="workflow_vanished", error_message=SAFE_MESSAGES["workflow_vanished"])
        else:
            confirmed = await repo.confirm_dispatch(conn, run_id, generation)
        if confirmed is None:
            confirmed = await repo.expire_if_overdue(conn, run_id)
        if confirmed is None:  # a worker already moved it on, or a newer generation exists
            confirmed = await repo.get_run(conn, run_id)
    assert confirmed is not None
    return confirmed


async def _expire_refused(svc: Services, tenant_id: str, run_id: str) -> None:
    """The guard refused a control because the run's deadline passed (R-EXEC-8): expire
    the run now (unless it already ended) and answer 409 ``run_terminal`` with the run's
    own state and code (nothing of the request was written)."""
    async with svc.tenant(tenant_id) as conn:
        row = await repo.expire_if_overdue(conn, run_id) or await repo.get_run(conn, run_id)
    state, code = (row["state"], row["error_code"]) if row else ("expired", "deadline_exceeded")
    raise ApiError(409, "run_terminal", f"the run's deadline passed; the run is {state}",
                   error_code=code)


async def _answer(services: Services, row: dict[str, Any], *, replayed: bool) -> JSONResponse:
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    if row["state"] == RunState.ACCEPTED:
        try:
            row = await _confirm(services, row)
        except DISPATCH_FAILURES as exc:
            log.warning("dispatch unknown for run %s: %s", row["run_id"], exc,
                        extra={"run_id": str(row["run_id"])})
            body = ErrorBody(
                code="durable_dispatch_unknown",
                message="the run is accepted; its dispatch could not be confirmed",
                retryable=False, receipt=_receipt(row),
            )
            return JSONResponse(body.model_dump(mode="json", exclude_none=True), 503, headers)
    return JSONResponse(_receipt(row).model_dump(mode="json"), 202, headers)


async def _create_legacy(svc: Services, agent_id: str, body: CreateRunRequest, principal: Principal,
                         key: str | None) -> Response:
    """R-CREATE-6: the legacy inline path, executed in this process (no restart promise)."""
    run_id = str(uuid.uuid4())
    await _require_grant(svc, principal, body.workspace_id, "workspace_access_denied")
    async with svc.tenant(principal.tenant_id) as conn:
        row = await repo.insert_run_or_none(
            conn, run_id=run_id, tenant_id=principal.tenant_id, principal_id=principal.principal_id,
            agent_id=agent_id, prompt=body.prompt, request=body.model_dump(),
            stream_key=secrets.token_urlsafe(24), deadline_s=body.deadline_seconds, workflow_id=None,
            route=CREATE_ROUTE, idempotency_key=key, fingerprint=_fingerprint(agent_id, body),
            lifecycle_version=1, workspace_id=body.workspace_id)
        if row is None:
            raise ApiError(409, "idempotency_key_in_flight", "this key is already in use")
    svc.spawn(svc.run_legacy(run_id, principal.tenant_id))
    receipt = Receipt(agent_id=agent_id, run_id=run_id, stream_key=row["stream_key"],
                      state=RunState.QUEUED, lifecycle_version=1, durability="legacy",
                      deadline_at=row["deadline_at"])
    return JSONResponse(receipt.model_dump(mode="json"), 202)


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


async def _require_grant(svc: Services, principal: Principal, workspace_id: str, code: str) -> None:
    """403 ``code`` unless the principal has a live grant for ``workspace_id`` (R-AUTH-2).
    The grant itself is not copied into the run: the worker reads it from
    ``workspace_grants`` for the provider at every attempt (R-READ-3)."""
    async with svc.tenant(principal.tenant_id) as conn:
        grant = await repo.workspace_grant(conn, tenant_id=principal.tenant_id,
                                           principal_id=principal.principal_id,
                                           workspace_id=workspace_id)
    if grant is None:
        raise ApiError(403, code, "no access to this workspace")


async def _replayable(conn: Any, record: dict[str, Any] | None, fingerprint: str,
                      settings: Settings) -> dict[str, Any]:
    """The run to replay for an existing key, or the error the IETF draft prescribes:
    422 for another body, 409 (with Retry-After) while the first request is in flight.
    A first request that died unanswered stops counting as in flight after the dispatch
    timeout, and its run is then replayed (and dispatched)."""
    if record is None:
        raise ApiError(409, "idempotency_key_in_flight", "retry shortly", retry_after=1)
    if record["fingerprint"] != fingerprint:
        raise ApiError(422, "idempotency_key_reused",
                       "this Idempotency-Key was used with a different request")
    in_flight_s = settings.dispatch_timeout_s + 1
    if record["completed_at"] is None and record["age_s"] < in_flight_s:
        raise ApiError(409, "idempotency_key_in_flight", "the first request with this key is "
                       "still being answered; retry shortly",
                       retry_after=max(1, int(in_flight_s - record["age_s"]) + 1))
    row = await repo.get_run(conn, str(record["run_id"]))
    if row is None:
        raise ApiError(404, "run_not_found", "no such run")
    return dict(row)


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """Build the application.

    Without ``settings`` (how ``uvicorn --factory`` calls it) this is the process's start:
    logging is set up first, so that every line, uvicorn's own start lines included, is
    JSON; the settings are read from the environment (``ApiSettings``) and the provider
    (``QIMPL_PROVIDER``) is loaded. A missing or malformed setting, or a provider that
    does not load, stops the process with one line on stderr naming the variable and exit
    code 64 (``qimpl.settings.EXIT_CONFIG``). With ``settings`` (tests) the caller's
    logging is left alone and a bad provider raises ValueError."""
    if settings is None:
        setup_logging()
        settings = load_or_exit(ApiSettings, "api")
        services = Services(settings)
        try:
            services.provider  # noqa: B018 - loaded now: a bad plugin stops the start
        except ValueError as exc:
            exit_config(plugin_error(ApiSettings, "provider", exc), "api")
    else:
        services = Services(settings)
        services.provider  # noqa: B018 - validated at build time

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            # Wait for one connection: an unreachable database stops the start here, in
            # seconds, with one line naming it (not a pool timeout at the first request).
            await services.pool.open(wait=True, timeout=DB_START_TIMEOUT_S)
        except PoolTimeout:
            log.error("the API cannot reach the database (QIMPL_DATABASE_URL) within %s s",
                      DB_START_TIMEOUT_S, extra={"event": "api.database_unreachable"})
            await services.pool.close()
            raise

        app.state.services = services
        async with services.pool.connection() as conn:
            await warn_if_rls_bypassed(conn, "API", log)
        yield
        await services.pool.close()

    app = FastAPI(title="qimpl durable agent runs", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(tool_routes.router)

    @app.post("/v1/answer", response_model=AnswerOut, responses=ANSWER_ERRORS)
    async def answer(
        body: AnswerIn,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
        accept: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Synchronous answer (R-CREATE-7): JSON, or SSE when ``Accept: text/event-stream``
        (events ``answer`` then ``done``; on failure one ``error`` event with a code).
        Durable runs do not change it; nothing is stored."""
        svc = services_of(request)
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

    async def _legacy_control(request: Request, agent_id: str, run_id: uuid.UUID,
                              principal: Principal, control: str) -> Response:
        async with services_of(request).tenant(principal.tenant_id) as conn:
            row = await owned_run(conn, agent_id, run_id, principal)
        if row["lifecycle_version"] == 2:
            raise ApiError(409, "durable_lifecycle_conflict",
                           f"{control} is a legacy control; durable (lifecycle 2) runs use cancel and resume")
        raise ApiError(501, "legacy_control_unavailable", f"{control} is not served by this deployment")

    def _legacy_handler(control: str, with_checkpoint: bool) -> Any:
        if with_checkpoint:
            async def on_checkpoint(
                agent_id: AgentId, run_id: uuid.UUID, checkpoint_id: str, request: Request,
                principal: Annotated[Principal, Depends(principal_of)],
            ) -> Response:
                return await _legacy_control(request, agent_id, run_id, principal, control)

            return on_checkpoint

        async def on_run(
            agent_id: AgentId, run_id: uuid.UUID, request: Request,
            principal: Annotated[Principal, Depends(principal_of)],
        ) -> Response:
            return await _legacy_control(request, agent_id, run_id, principal, control)

        return on_run

    for path, control in (
        ("checkpoints/{checkpoint_id}/rollback", "checkpoint rollback"),
        ("checkpoints/{checkpoint_id}/resume", "checkpoint resume"),
        ("checkpoints/{checkpoint_id}/branch", "checkpoint branch"),
        ("checkpoints", "manual checkpoint insertion"),
        ("pause", "pause"),
        ("handoff", "handoff"),
    ):
        app.add_api_route(
            f"/v1/agents/{{agent_id}}/runs/{{run_id}}/{path}",
            _legacy_handler(control, "{checkpoint_id}" in path), methods=["POST"],
            responses=LEGACY_ERRORS, status_code=409, name=f"legacy {control}",
            summary=f"Legacy {control}",
            description="R-LEGACY-1: 409 `durable_lifecycle_conflict` for lifecycle 2 runs.")

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics (R-OPS-6); gauges are recomputed from the database per scrape,
        worker availability from Temporal's view of the task queue (best effort: when
        Temporal does not answer within 2 s the pollers gauge is left out, unknown, rather
        than reporting a stale count)."""
        svc = services_of(request)
        async with svc.pool.connection() as conn:
            await metrics.refresh_from_db(conn)  # through a SECURITY DEFINER aggregate
        try:
            client = await svc.temporal()
            await asyncio.wait_for(metrics.refresh_pollers(client, svc.settings), timeout=2)
        except Exception as exc:  # noqa: BLE001 - metrics never fail the scrape
            metrics.WORKER_POLLERS.clear()
            log.info("poller metrics unavailable: %s", type(exc).__name__)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/v1/agents/{agent_id}/runs", status_code=202, response_model=Receipt, responses=CREATE_ERRORS,
        openapi_extra=CREATE_HEADERS,
    )
    async def create_run(
        agent_id: AgentId,
        body: CreateRunRequest,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Create a durable run (R-CREATE-1..5). 202 with the receipt once Temporal confirmed
        the start; 503 ``durable_dispatch_unknown`` with the receipt when it could not."""
        svc = services_of(request)
        if not body.durable_temporal:
            return await _create_legacy(svc, agent_id, body, principal, idempotency_key)
        if not idempotency_key:
            raise ApiError(400, "idempotency_key_required", "durable creation needs an Idempotency-Key")
        fingerprint = _fingerprint(agent_id, body)
        scope = {"tenant_id": principal.tenant_id, "principal_id": principal.principal_id,
                 "route": CREATE_ROUTE, "key": idempotency_key}
        run_id = str(uuid.uuid4())
        await _require_grant(svc, principal, body.workspace_id, "workspace_access_denied")
        async with svc.tenant(principal.tenant_id) as conn:
            row = await repo.insert_run_or_none(
                conn, run_id=run_id, tenant_id=principal.tenant_id,
                principal_id=principal.principal_id, agent_id=agent_id, prompt=body.prompt,
                request=body.model_dump(), stream_key=secrets.token_urlsafe(24),
                deadline_s=body.deadline_seconds, workflow_id=workflow_id(run_id, 1),
                route=CREATE_ROUTE, idempotency_key=idempotency_key, fingerprint=fingerprint,
                workspace_id=body.workspace_id,
            )
            replayed = row is None
            if row is None:
                record = await repo.lookup_idempotency(conn, **scope)
                row = await _replayable(conn, record, fingerprint, svc.settings)
        if not replayed:
            AFTER_ACCEPT.reach(run_id=run_id)
        response = await _answer(svc, row, replayed=replayed)
        if not replayed:
            async with svc.tenant(principal.tenant_id) as conn:
                await repo.complete_idempotency(conn, **scope)
        return response

    @app.get("/v1/agents/{agent_id}/runs/{run_id}", response_model=RunView, responses=READ_ERRORS)
    async def read_run(
        agent_id: AgentId,
        run_id: uuid.UUID,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
    ) -> RunView:
        """Read a run (R-READ-1); another principal or tenant gets 404 (R-AUTH-1)."""
        async with services_of(request).tenant(principal.tenant_id) as conn:
            row = await owned_run(conn, agent_id, run_id, principal)
            return _view(row, await journal_db.invocations(conn, str(run_id)))

    @app.post("/v1/agents/{agent_id}/runs/{run_id}/resume", status_code=202, response_model=Receipt,
              responses=RESUME_ERRORS, openapi_extra=RESUME_HEADERS)
    async def resume_run(
        agent_id: AgentId,
        run_id: uuid.UUID,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
        body: ResumeRequest | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Resume (R-RESUME-1/2): ``awaiting_input`` + ``additional_prompt`` dispatches the
        next generation (same ``run_id`` and ``deadline_at``); ``accepted`` with an empty body
        retries dispatch of its generation. 409 ``run_active``/``run_terminal``/
        ``run_not_resumable`` otherwise. Replaying the key returns the same receipt."""
        svc = services_of(request)
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
            await _require_grant(svc, principal, row["workspace_id"], "workspace_access_revoked")
        resumed: dict[str, Any] | None = None
        expired = False
        async with svc.tenant(principal.tenant_id) as conn:
            record = await repo.lookup_idempotency(conn, **scope)
            replay = await _replayable(conn, record, fingerprint, svc.settings) if record else None
            state = row["state"]
            if replay is not None:
                pass
            elif state == RunState.ACCEPTED:
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
                        now = await repo.get_run(conn, str(run_id))
                        if now is not None and RunState(now["state"]) in TERMINAL:
                            raise ApiError(409, "run_terminal", f"the run is {now['state']}",
                                           error_code=now["error_code"])
                        raise ApiError(409, "run_resume_conflict", "another resume of this run won")
        if expired:
            await _expire_refused(svc, principal.tenant_id, str(run_id))
        # Dispatch outside the transaction: nothing is held open across a network call.
        if replay is not None:
            return await _answer(svc, replay, replayed=True)
        if resumed is None:  # an accepted run: retry the dispatch of its generation
            return await _answer(svc, row, replayed=False)
        response = await _answer(svc, resumed, replayed=False)
        async with svc.tenant(principal.tenant_id) as conn:
            await repo.complete_idempotency(conn, **scope)
        return response

    @app.get("/v1/agents/{agent_id}/runs/{run_id}/events", responses=EVENTS_ERRORS,
             response_class=EventSourceResponse, openapi_extra=EVENTS_HEADERS)
    async def run_events(
        agent_id: AgentId,
        run_id: uuid.UUID,
        request: Request,
        x_stream_key: Annotated[str | None, Header(max_length=_STREAM_KEY_MAX,
                                                   include_in_schema=False)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32, pattern=r"^[0-9]+$")] = None,
    ) -> Response:
        """The run's events as SSE for the holder of its stream key (``X-Stream-Key``):
        another run's key, or another tenant's, is 404 ``run_not_found`` (R-AUTH-3).
        ``Last-Event-ID`` resumes after that event; the stream ends with a ``terminal``
        event matching the run record (R-EVENT-2, R-EVENT-3)."""
        svc = services_of(request)
        if not x_stream_key:
            raise ApiError(401, "stream_key_required", "send the run's stream key in X-Stream-Key")
        async with svc.pool.connection() as conn:
            cur = await conn.execute("SELECT qimpl_stream_tenant(%s, %s)", (str(run_id), x_stream_key))
            found = await cur.fetchone()
        tenant_id = found[0] if found else None
        if tenant_id is None:
            raise ApiError(404, "run_not_found", "no such run")
        async with svc.tenant(tenant_id) as conn:
            row = await repo.get_run(conn, str(run_id), tenant_id=tenant_id)
        if row is None or row["agent_id"] != agent_id:
            raise ApiError(404, "run_not_found", "no such run")
        return EventSourceResponse(stream_events(lambda: svc.tenant(tenant_id), str(run_id),
                                                 int(last_event_id or 0)))

    @app.post("/v1/agents/{agent_id}/runs/{run_id}/tool-approval/{approval_id}",
              response_model=ApprovalAnswer, responses=APPROVAL_ERRORS)
    async def decide_approval(
        agent_id: AgentId,
        run_id: uuid.UUID,
        approval_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")],
        body: ApprovalDecision,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
    ) -> ApprovalAnswer:
        """Decide the run's pending approval (R-APPROVAL-1) with its exact ``action_version``:
        a stale or unknown version is 409 ``action_version_mismatch`` and runs nothing; the
        same decision again is idempotent; the opposite one is 409 ``approval_conflict``;
        another principal gets 404; a cancelled or finished run, 409 ``run_terminal``. An
        accepted decision queues the run's next generation and dispatches it."""
        svc = services_of(request)
        try:
            async with svc.tenant(principal.tenant_id) as conn:
                await owned_run(conn, agent_id, run_id, principal)
                outcome, row = await repo.decide_approval(
                    conn, str(run_id), approval_id=approval_id, action_version=body.action_version,
                    approved=body.approved, tenant_id=principal.tenant_id,
                    principal_id=principal.principal_id)
        except DeadlinePassed:
            await _expire_refused(svc, principal.tenant_id, str(run_id))
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

    @app.post("/v1/agents/{agent_id}/runs/{run_id}/cancel", response_model=CancelAnswer,
              responses=CANCEL_ERRORS)
    async def cancel_run(
        agent_id: AgentId,
        run_id: uuid.UUID,
        request: Request,
        principal: Annotated[Principal, Depends(principal_of)],
    ) -> CancelAnswer:
        """Cancel (R-CANCEL-1): persisted first, then Temporal told, best effort.
        ``cancelled`` is true also when already cancelled, false for completed, failed
        and expired runs."""
        svc = services_of(request)
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

    return app
