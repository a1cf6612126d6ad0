"""The run's event stream for the holder of its stream key (R-EVENT-2/3/5, R-AUTH-3); the
stream itself is ``qimpl.api.events``."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from sse_starlette.sse import EventSourceResponse

from qimpl.api.deps import AgentId, Svc
from qimpl.api.errors import ApiError
from qimpl.api.events import RECORD_FIELDS, stream_events
from qimpl.api.openapi import EVENTS_ERRORS, EVENTS_HEADERS, STREAM_KEY_MAX
from qimpl.api.views import read_view
from qimpl.db import runs as repo
from qimpl.lifecycle import TERMINAL

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/agents/{agent_id}/runs/{run_id}/events", responses=EVENTS_ERRORS,
            response_class=EventSourceResponse, openapi_extra=EVENTS_HEADERS)
async def run_events(
    agent_id: AgentId,
    run_id: uuid.UUID,
    svc: Svc,
    x_stream_key: Annotated[str | None, Header(max_length=STREAM_KEY_MAX,
                                               include_in_schema=False)] = None,
    last_event_id: Annotated[str | None, Header(max_length=32, pattern=r"^[0-9]+$")] = None,
) -> Response:
    """The run's events as SSE for the holder of its stream key (``X-Stream-Key``):
    another run's key, or another tenant's, is 404 ``run_not_found`` (R-AUTH-3).
    ``Last-Event-ID`` resumes after that event; the stream ends with a ``terminal``
    event matching the run record (R-EVENT-2, R-EVENT-3). Reconnecting after the terminal
    event answers 204 No Content, which stops a client's automatic reconnection; a
    ``Last-Event-ID`` beyond the live run's last event is 400 ``last_event_id_unknown``;
    more than ``QIMPL_EVENT_STREAMS_PER_RUN`` open streams of one run is 429
    ``too_many_streams``."""
    if not x_stream_key:
        raise ApiError(401, "stream_key_required", "send the run's stream key in X-Stream-Key")
    async with svc.connection() as conn:
        cur = await conn.execute("SELECT qimpl_stream_tenant(%s, %s)", (str(run_id), x_stream_key))
        found = await cur.fetchone()
    tenant_id = found[0] if found else None
    if tenant_id is None:
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
                       f"at most {svc.settings.event_streams_per_run} open streams per run; close one")
    async def record(conn: Any) -> dict[str, Any]:
        now = await repo.get_run(conn, str(run_id), tenant_id=tenant_id)
        if now is None:
            return {}
        view = (await read_view(conn, now)).model_dump(mode="json")
        return {k: view[k] for k in RECORD_FIELDS}

    return EventSourceResponse(
        stream_events(lambda: svc.tenant(tenant_id), svc.events, str(run_id), int(last_event_id or 0),
                      fallback_s=svc.settings.event_fallback_poll_s, record=record),
        ping=svc.settings.event_ping_s)
