"""The run's event stream for the holder of its stream key (R-EVENT-2/3/5, R-AUTH-3); the
stream itself is ``qimpl.api.events``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette.sse import EventSourceResponse

from qimpl.api import stream_tokens
from qimpl.api.deps import AgentId, CurrentPrincipal, Svc, key_of_header, owned_run
from qimpl.api.errors import ApiError
from qimpl.api.events import RECORD_FIELDS, stream_events
from qimpl.api.models import StreamToken, StreamTokenRequest
from qimpl.api.openapi import EVENTS_ERRORS, EVENTS_HEADERS, STREAM_KEY_MAX, TOKEN_ERRORS
from qimpl.api.views import read_view
from qimpl.db import runs as repo
from qimpl.lifecycle import TERMINAL

__all__ = ["router"]

router = APIRouter()


async def _token_tenant(svc: Any, run_id: uuid.UUID, token: str) -> str:
    """The tenant of ``run_id`` when ``token`` is a live stream token of that run (R-EVENT-6):
    401 ``stream_token_invalid`` for anything else (another run's token, a forged or
    malformed one), 401 ``stream_token_expired`` past its expiry on the database's clock."""
    invalid = ApiError(401, "stream_token_invalid", "this stream token is not one of this run's")
    try:
        parsed = stream_tokens.parse(token)
    except ValueError:
        raise invalid from None
    if parsed.run_id != str(run_id):
        raise invalid
    # The token's tenant is the caller's word until its MAC is checked: the tenant scope
    # comes from the run's own row (``qimpl_tenant_of_run``), never from the token. A
    # forged tenant (a NUL in it was 422 ``value_unstorable`` from ``set_config``, issue
    # 56 item 12) never reaches the database.
    async with svc.connection() as conn, conn.transaction():
        cur = await conn.execute("SELECT qimpl_tenant_of_run(%s)", (str(run_id),))
        tenant = (await cur.fetchone() or (None,))[0]
        found = None
        if tenant is not None:
            await conn.execute("SELECT set_config('qimpl.tenant', %s, true)", (tenant,))
            cur = await conn.execute("SELECT stream_key, extract(epoch FROM clock_timestamp())::float8"
                                     " FROM runs WHERE run_id = %s", (str(run_id),))
            found = await cur.fetchone()
    if (found is None or not stream_tokens.valid(parsed, stream_key=found[0])
            or parsed.tenant_id != tenant):
        raise invalid
    if parsed.expires <= found[1]:
        raise ApiError(401, "stream_token_expired", "this stream token expired; ask for a new one")
    return parsed.tenant_id


@router.post("/v1/agents/{agent_id}/runs/{run_id}/stream-token", response_model=StreamToken,
             responses=TOKEN_ERRORS)
async def stream_token_for(
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    principal: CurrentPrincipal,
    body: StreamTokenRequest | None = None,
) -> StreamToken:
    """A stream token for the run's events (R-EVENT-6), for its owner: a browser passes it
    as ``?stream_token=`` to ``…/events`` with ``EventSource``. Good for this run only,
    until ``expires_at`` (``ttl_s``, 1..3600 s, default 300, on the database's clock)."""
    ttl = (body or StreamTokenRequest()).ttl_s
    async with svc.tenant(principal.tenant_id) as conn:
        row = await owned_run(conn, agent_id, run_id, principal)
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        now = (await cur.fetchone())[0]
    expires = int(now) + ttl
    token = stream_tokens.mint(stream_key=row["stream_key"], tenant_id=principal.tenant_id,
                               run_id=str(run_id), expires=expires)
    return StreamToken(token=token, expires_at=datetime.fromtimestamp(expires, UTC),
                       events_path=f"/v1/agents/{agent_id}/runs/{run_id}/events?stream_token={token}")


@router.get("/v1/agents/{agent_id}/runs/{run_id}/events", responses=EVENTS_ERRORS,
            response_class=EventSourceResponse, openapi_extra=EVENTS_HEADERS)
async def run_events(
    request: Request,
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    x_stream_key: Annotated[str | None, Header(max_length=STREAM_KEY_MAX,
                                               include_in_schema=False)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32, pattern=r"^[0-9]+$")] = None,
    stream_token: Annotated[str | None, Query(
        max_length=400, description="instead of `X-Stream-Key`, for a browser's EventSource: a "
                                    "token from `POST …/stream-token` (R-EVENT-6)")] = None,
) -> Response:
    """The run's events as SSE for the holder of its stream key (``X-Stream-Key``):
    another run's key, or another tenant's, is 404 ``run_not_found`` (R-AUTH-3).
    ``Last-Event-ID`` resumes after that event; the stream ends with a ``terminal``
    event matching the run record (R-EVENT-2, R-EVENT-3). Reconnecting after the terminal
    event answers 204 No Content, which stops a client's automatic reconnection; a
    ``Last-Event-ID`` beyond the live run's last event is 400 ``last_event_id_unknown``;
    more than ``QIMPL_EVENT_STREAMS_PER_RUN`` open streams of one run is 429
    ``too_many_streams``. An ``Authorization`` header is not needed, but one sent is
    never ignored: an unknown key is 401 ``unauthenticated``, a key of another tenant than
    the run's is 404 ``run_not_found`` (R-AUTH-3; a tester's finding: both streamed)."""
    sent = request.headers.get("authorization")
    caller = None
    if sent is not None:
        key = key_of_header(sent)
        caller = await svc.authenticator.authenticate(key) if key else None
        if caller is None:
            raise ApiError(401, "unauthenticated", "a valid API key is required")
    if not x_stream_key and stream_token:
        tenant_id: str | None = await _token_tenant(svc, run_id, stream_token)
    elif not x_stream_key:
        raise ApiError(401, "stream_key_required",
                       "send the run's stream key in X-Stream-Key, or a stream_token")
    else:
        async with svc.connection() as conn:
            cur = await conn.execute("SELECT qimpl_stream_tenant(%s, %s)", (str(run_id), x_stream_key))
            found = await cur.fetchone()
        tenant_id = found[0] if found else None
    if tenant_id is None or (caller is not None and caller.tenant_id != tenant_id):
        raise ApiError(404, "run_not_found", "no such run")
    async with svc.tenant(tenant_id) as conn:
        row = await repo.get_run(conn, str(run_id), tenant_id=tenant_id)
        last = await conn.execute(
            "SELECT (SELECT max(seq) FROM run_events WHERE run_id = %s),"
            " EXISTS (SELECT 1 FROM run_event_prunes WHERE run_id = %s)", (str(run_id), str(run_id)))
        newest, pruned = await last.fetchone() or (None, False)
    if row is None or row["agent_id"] != agent_id:
        raise ApiError(404, "run_not_found", "no such run")
    if pruned:
        raise ApiError(410, "event_stream_pruned",
                       "this run's events were pruned after its retention; read the run instead")
    if (last_event_id is not None and row["state"] in TERMINAL
            and (newest is None or int(last_event_id) >= int(newest))):
        # The client already saw the terminal event: 204 tells an EventSource to stop
        # reconnecting (the SSE standard), instead of a stream that never ends.
        return Response(status_code=204)
    if last_event_id is not None and int(last_event_id) > int(newest or 0):
        # An id this run never sent (another run's, or made up): a stream resumed after
        # it would wait for events that never come and outlive the run (issue 22, item 10).
        raise ApiError(400, "last_event_id_unknown",
                       "this run sent no event with that id; reconnect without Last-Event-ID "
                       "or with the id of the last event received")
    if svc.events.streams_of(str(run_id)) >= svc.settings.event_streams_per_run:
        # Counted by the open subscriptions of this process (a stream subscribes as it
        # starts): concurrent opens may pass together, never unboundedly (issue 22, item 10).
        raise ApiError(429, "too_many_streams",
                       f"at most {svc.settings.event_streams_per_run} open streams per run; close one",
                       retry_after=1)
    async def record(conn: Any) -> dict[str, Any]:
        now = await repo.get_run(conn, str(run_id), tenant_id=tenant_id)
        if now is None:
            return {}
        view = (await read_view(conn, now)).model_dump(mode="json")
        return {k: view[k] for k in RECORD_FIELDS}

    return EventSourceResponse(
        stream_events(lambda: svc.tenant(tenant_id), svc.events, str(run_id), int(last_event_id or 0),
                      fallback_s=svc.settings.event_fallback_poll_s, record=record,
                      reads=svc.stream_reads),
        ping=svc.settings.event_ping_s)
