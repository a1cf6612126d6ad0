"""What creating and resuming a run share (R-CREATE-2..5, R-RESUME-1, R-AUTH-2): the
receipt, the dispatch of an accepted generation and its confirmation, idempotent replay,
the workspace grant check and the answer to a control the deadline refused."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout

from qimpl.api.auth import Principal
from qimpl.api.deps import Services
from qimpl.api.errors import ApiError
from qimpl.api.models import CreateRunRequest, ErrorBody, Receipt
from qimpl.crashpoints import declare
from qimpl.db import runs as repo
from qimpl.dispatch import dispatch
from qimpl.errors import SAFE_MESSAGES, DispatchUnknown
from qimpl.lifecycle import RunState
from qimpl.settings import Settings

__all__ = ["AFTER_ACCEPT", "AFTER_DISPATCH", "CREATE_ROUTE", "DB_FAILURES", "DISPATCH_FAILURES", "RESUME_ROUTE",
           "answer", "check_grant", "dispatch_unknown", "expire_refused", "fingerprint", "receipt", "replayable", "require_grant"]

log = logging.getLogger("qimpl.api")

INSIDE_ACCEPT = declare("api.inside_acceptance_transaction",
                        "the run and its key's record are inserted, their commit not yet sent")
AFTER_ACCEPT = declare("api.after_acceptance_commit", "the run is committed `accepted`, dispatch not yet asked")
AFTER_DISPATCH = declare("api.after_dispatch", "Temporal accepted the workflow, `queued` not yet committed")

CREATE_ROUTE = "POST /v1/agents/{agent_id}/runs"
RESUME_ROUTE = "POST /v1/agents/{agent_id}/runs/{run_id}/resume"

#: What an unconfirmed start looks like: Temporal's answer unknown, or no client at all.
DISPATCH_FAILURES = (DispatchUnknown, TimeoutError, OSError, RuntimeError)
#: A database failure after the run was committed (a pool timeout, a restart): what became
#: of its dispatch is unknown too, and the client still gets its receipt (R-CREATE-5).
DB_FAILURES = (psycopg.Error, PoolTimeout)


def fingerprint(agent_id: str, body: CreateRunRequest) -> str:
    """The SHA-256 hex digest of a create request, compared on an idempotent replay."""
    canonical = json.dumps({"agent_id": agent_id, **body.model_dump()}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def receipt(row: dict[str, Any]) -> Receipt:
    """The receipt of a run row: ``queued`` once its dispatch is confirmed, else ``accepted``."""
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


async def _confirm(services: Services, row: dict[str, Any],
                   completes: Mapping[str, str] | None) -> dict[str, Any]:
    """Dispatch an ``accepted`` run's generation and commit ``queued``, marking the key's
    record of ``completes`` answered in the same transaction; raises DispatchUnknown. A
    run whose deadline passed meanwhile is expired (R-EXEC-8); one whose workflow is
    already closed without it is failed ``workflow_vanished`` (R-OPS-8)."""
    client = await services.temporal()
    run_id, generation = str(row["run_id"]), int(row["generation"])
    started = await dispatch(client, row, services.settings)
    if started != "started":
        # Temporal already had this generation's workflow (a retried request, the
        # reconciler): its answer confirms the dispatch (R-CREATE-5).
        log.info("dispatch of run %s generation %s: %s", run_id, generation, started,
                 extra={"event": f"dispatch.{started}", "run_id": run_id, "generation": generation})
    await AFTER_DISPATCH.areach(run_id=run_id)
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
        if completes is not None:
            await repo.complete_idempotency(conn, **completes)
    assert confirmed is not None
    return confirmed


async def answer(services: Services, row: dict[str, Any], *, replayed: bool,
                 completes: Mapping[str, str] | None = None) -> JSONResponse:
    """202 with the receipt, dispatching an ``accepted`` run first; 503
    ``durable_dispatch_unknown`` carrying the receipt when the dispatch is unconfirmed —
    Temporal did not answer, or the database failed while recording its answer
    (R-CREATE-3, R-CREATE-5). ``Idempotent-Replayed: true`` on a replay.

    ``completes``: the idempotency scope (``tenant_id``, ``principal_id``, ``route``,
    ``key``) of the first request that created ``row``. Its record is marked answered
    (later requests replay, never 409) in the transaction that confirms the dispatch, or
    on its own when there is nothing to confirm or the dispatch is unconfirmed; a database
    failure then answers 503 ``durable_dispatch_unknown`` (the run is committed, R-CREATE-5)."""
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    if row["state"] == RunState.ACCEPTED:
        try:
            return JSONResponse(receipt(await _confirm(services, row, completes)).model_dump(mode="json"),
                                202, headers)
        except (*DISPATCH_FAILURES, *DB_FAILURES) as exc:
            # qimpl's own DispatchUnknown says what Temporal answered; of another
            # package's exception only the type is written.
            log.warning("dispatch unknown for run %s: %s", row["run_id"],
                        exc if isinstance(exc, DispatchUnknown) else type(exc).__name__,
                        extra={"run_id": str(row["run_id"])})
            if completes is not None:
                await _complete(services, completes, str(row["run_id"]))
            return dispatch_unknown(row, headers)
    if completes is not None and not await _complete(services, completes, str(row["run_id"])):
        return dispatch_unknown(row, headers)
    return JSONResponse(receipt(row).model_dump(mode="json"), 202, headers)


async def _complete(services: Services, completes: Mapping[str, str], run_id: str) -> bool:
    """Mark the key's record answered in a transaction of its own; False (logged) when the
    database failed: the record then completes on a retry with the same key, or lapses
    (its in-flight bound)."""
    try:
        async with services.tenant(completes["tenant_id"]) as conn:
            await repo.complete_idempotency(conn, **completes)
    except DB_FAILURES as exc:
        log.warning("idempotency record of run %s not completed: %s", run_id, type(exc).__name__,
                    extra={"run_id": run_id})
        return False
    return True


def dispatch_unknown(row: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    """503 ``durable_dispatch_unknown`` with the run's receipt: the run is committed, what
    became of its dispatch is not known here; a retry with the same key, or an empty
    resume, settles it (R-CREATE-5)."""
    body = ErrorBody(code="durable_dispatch_unknown",
                     message="the run is accepted; its dispatch could not be confirmed",
                     retryable=False, receipt=receipt(row))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), 503, headers or {})


async def expire_refused(svc: Services, tenant_id: str, run_id: str) -> None:
    """The guard refused a control because the run's deadline passed (R-EXEC-8): expire
    the run now (unless it already ended) and answer 409 ``run_terminal`` with the run's
    own state and code (nothing of the request was written)."""
    async with svc.tenant(tenant_id) as conn:
        row = await repo.expire_if_overdue(conn, run_id) or await repo.get_run(conn, run_id)
    state, code = (row["state"], row["error_code"]) if row else ("expired", "deadline_exceeded")
    raise ApiError(409, "run_terminal", f"the run's deadline passed; the run is {state}",
                   error_code=code)


async def require_grant(svc: Services, principal: Principal, workspace_id: str, code: str) -> None:
    """403 ``code`` unless the principal has a live grant for ``workspace_id`` (R-AUTH-2),
    read in a transaction of its own (``check_grant`` reads it in the caller's)."""
    async with svc.tenant(principal.tenant_id) as conn:
        await check_grant(conn, principal, workspace_id, code)


async def check_grant(conn: Any, principal: Principal, workspace_id: str, code: str) -> None:
    """403 ``code`` unless the principal has a live grant for ``workspace_id`` (R-AUTH-2);
    ``conn`` is in a transaction scoped to the principal's tenant (``Services.tenant``).
    The grant itself is not copied into the run: the worker reads it from
    ``workspace_grants`` for the provider at every attempt (R-READ-3)."""
    grant = await repo.workspace_grant(conn, tenant_id=principal.tenant_id,
                                       principal_id=principal.principal_id,
                                       workspace_id=workspace_id)
    if grant is None:
        raise ApiError(403, code, "no access to this workspace")


async def replayable(conn: Any, record: dict[str, Any] | None, fingerprint: str,
                     settings: Settings) -> dict[str, Any]:
    """The run to replay for an existing key, or the error the IETF draft prescribes:
    422 for another body, 409 (with Retry-After) while the first request is in flight.
    A first request that died unanswered stops counting as in flight after the dispatch
    timeout, and its run is then replayed (and dispatched); one whose run's dispatch is
    already confirmed never counts as in flight."""
    if record is None:
        raise ApiError(409, "idempotency_key_in_flight", "retry shortly", retry_after=1)
    if record["fingerprint"] != fingerprint:
        raise ApiError(422, "idempotency_key_reused",
                       "this Idempotency-Key was used with a different request")
    row = await repo.get_run(conn, str(record["run_id"]))
    if row is None:
        raise ApiError(404, "run_not_found", "no such run")
    in_flight_s = settings.dispatch_timeout_s + 1
    dispatched = row["dispatch_confirmed_at"] is not None or row["state"] != RunState.ACCEPTED
    if record["completed_at"] is None and record["age_s"] < in_flight_s and not dispatched:
        # Only the dispatch can race: once it is confirmed, the run is replayed even if the
        # first request could not complete the key's record (a database failure).
        # Retry-After 1: the first request is usually answered within milliseconds, and a
        # retry still in flight gets this answer again (it said 6 s, the in-flight bound).
        raise ApiError(409, "idempotency_key_in_flight", "the first request with this key is "
                       "still being answered; retry shortly", retry_after=1)
    return dict(row)
