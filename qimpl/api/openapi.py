"""What the OpenAPI document says about each route beyond its signature: the error codes a
route can return, by status, and the headers it requires (documented as required while
the handler's own parameter stays optional, so that a request without one gets the
route's coded error rather than FastAPI's 422)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Header

from qimpl.api.models import ErrorBody

__all__ = [
    "ANSWER_ERRORS",
    "APPROVAL_ERRORS",
    "CANCEL_ERRORS",
    "CLIENT_ONLY",
    "CREATE_ERRORS",
    "CREATE_HEADERS",
    "CREATE_LINKS",
    "DATABASE_ERRORS",
    "EVENTS_ERRORS",
    "EVENTS_HEADERS",
    "LEGACY_ERRORS",
    "PARAMETER_ERRORS",
    "READ_ERRORS",
    "READ_LINKS",
    "RESUME_ERRORS",
    "RESUME_HEADERS",
    "RETRY_AFTER_HEADER",
    "STREAM_KEY_MAX",
    "TOKEN_ERRORS",
    "IdempotencyKey",
    "body_errors",
    "errors",
]

_KEY_PATTERN, _KEY_MAX = r"^[\x21-\x7e]+$", 255
#: Optional to FastAPI, so that a missing key gets the route's own 400
#: ``idempotency_key_required``; documented as required (``_required_header``). An empty
#: header is a missing key too (400, not 422), hence ``*`` where the document says ``+``.
IdempotencyKey = Annotated[str | None, Header(max_length=_KEY_MAX, pattern=r"^[\x21-\x7e]*$",
                                              include_in_schema=False)]
STREAM_KEY_MAX = 128


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
    "`idempotency_key_required` (R-CREATE-2). Keys are scoped to tenant, principal and route: "
    "the route template, so a key used to create a run of one agent is the same key on "
    "another agent's create (422 `idempotency_key_reused` with another body). "
    "The legacy inline path (R-CREATE-6) also accepts a request without one.", **_IDEMPOTENCY)
RESUME_HEADERS = _required_header(
    "Idempotency-Key", "A new key per resume; without it 400 `idempotency_key_required` "
    "(R-RESUME-1). Replaying a key returns the same receipt.", **_IDEMPOTENCY)
EVENTS_HEADERS = {"parameters": [{
    "name": "X-Stream-Key", "in": "header", "required": False,
    "description": "The run's stream key from its receipt (R-AUTH-3); a browser's EventSource, "
                   "which cannot send headers, passes `stream_token` instead (R-EVENT-6). "
                   "Without either: 401 `stream_key_required`.",
    "schema": {"type": "string", "maxLength": STREAM_KEY_MAX}}]}


#: The 503s of any route that reads the database, its API key's lookup included (R-OPS-7):
#: both retryable, with ``Retry-After: 1`` (``qimpl.api.errors``).
DATABASE_ERRORS = (
    "run_busy (a row or table the request needs stayed locked past `QIMPL_API_LOCK_TIMEOUT_S`; "
    "retryable: true), database_unavailable (no database connection within "
    "`QIMPL_API_POOL_TIMEOUT_S`, or it was lost mid-request; retryable: true)")
#: The header a retryable answer carries.
RETRY_AFTER_HEADER = {"Retry-After": {
    "description": "seconds to wait before retrying: sent with `run_busy`, `database_unavailable`, "
                   "`idempotency_key_in_flight` and `too_many_streams`",
    "schema": {"type": "integer", "minimum": 1}}}


def errors(**by_status: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` listing every error code a route can return, by status:
    ``errors(s404="run_not_found")``. Every route that uses it takes an API key, whose
    lookup reads the database, so its 503 also lists ``DATABASE_ERRORS``. A 409, 429 or
    503 documents ``Retry-After``."""
    by_status["s503"] = ", ".join(filter(None, (by_status.get("s503"), DATABASE_ERRORS)))
    out: dict[int | str, dict[str, Any]] = {}
    for k, v in by_status.items():
        status = int(k.removeprefix("s"))
        out[status] = {"model": ErrorBody, "description": "codes: " + v}
        if status in (409, 429, 503):
            out[status]["headers"] = RETRY_AFTER_HEADER
    return out


def body_errors(*extra: str) -> str:
    """The 422 codes of a route with a JSON body: any body's, then the route's own fields'
    (``extra``), then ``invalid_parameter`` (a path, query or header parameter off its
    schema) and ``value_unstorable`` (a value PostgreSQL cannot store)."""
    return ", ".join(("malformed_body", "unknown_field", "invalid_request", *extra, "invalid_parameter",
                      "value_unstorable"))


#: The 422 of a route without a body: a path, query or header parameter off its schema.
PARAMETER_ERRORS = "invalid_parameter (a path, query or header parameter off its schema)"
_PROMPT = "prompt_required, prompt_empty, prompt_too_long, prompt_invalid"
_AUTH = "unauthenticated"
_NOT_FOUND = "run_not_found"
#: An operator key on a client route (R-OPS-7: operators act through the operator routes).
CLIENT_ONLY = "client_credential_required (an operator key on a client route)"
CREATE_ERRORS = errors(
    s400="idempotency_key_required", s401=_AUTH,
    s403=f"workspace_access_denied (no live grant for the body's workspace_id, R-AUTH-2), {CLIENT_ONLY}",
    s409="idempotency_key_in_flight",
    s422=body_errors(_PROMPT, "mode_unsupported", "response_mode_unsupported", "deadline_out_of_range",
                     "deadline_invalid", "durable_temporal_invalid", "workspace_id_invalid",
                     "idempotency_key_reused"),
    s503="durable_dispatch_unknown (the body carries the receipt; retryable: false)")
READ_ERRORS = errors(s401=_AUTH, s403=CLIENT_ONLY, s404=_NOT_FOUND, s422=PARAMETER_ERRORS)


def _link(operation_id: str, **parameters: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": parameters}


_RUN = {"agent_id": "$request.path.agent_id", "run_id": "$response.body#/run_id"}
#: OpenAPI links from a receipt to what a client does next with the run: read it, follow
#: its events (with the receipt's stream key), cancel it, resume it. Clients and stateful
#: contract tests (schemathesis) follow them.
#: The header a replayed receipt carries (R-CREATE-2, R-RESUME-1).
REPLAYED_HEADER = {"Idempotent-Replayed": {
    "description": "`true` when this receipt replays an earlier request with the same "
                   "Idempotency-Key and body (nothing new was started); absent otherwise",
    "schema": {"type": "string", "enum": ["true"]}}}
CREATE_LINKS: dict[int | str, dict[str, Any]] = {202: {"description": "Successful Response",
                                                       "headers": REPLAYED_HEADER, "links": {
    "ReadRun": _link("read_run_v1_agents__agent_id__runs__run_id__get", **_RUN),
    "RunEvents": _link("run_events_v1_agents__agent_id__runs__run_id__events_get", **_RUN,
                       **{"header.X-Stream-Key": "$response.body#/stream_key"}),
    "CancelRun": _link("cancel_run_v1_agents__agent_id__runs__run_id__cancel_post", **_RUN),
    "ResumeRun": _link("resume_run_v1_agents__agent_id__runs__run_id__resume_post", **_RUN),
}}}
#: From a read run to deciding its pending approval.
READ_LINKS: dict[int | str, dict[str, Any]] = {200: {"description": "Successful Response", "links": {
    "DecideApproval": _link(
        "decide_approval_v1_agents__agent_id__runs__run_id__tool_approval__approval_id__post",
        agent_id="$request.path.agent_id", run_id="$request.path.run_id",
        approval_id="$response.body#/result_json/pending_approval/approval_id"),
    "CancelRun": _link("cancel_run_v1_agents__agent_id__runs__run_id__cancel_post",
                       agent_id="$request.path.agent_id", run_id="$request.path.run_id"),
}}}
CANCEL_ERRORS = errors(s401=_AUTH, s403=CLIENT_ONLY, s404=_NOT_FOUND, s422=body_errors())
RESUME_ERRORS: dict[int | str, dict[str, Any]] = {202: {"description": "Successful Response",
                                                        "headers": REPLAYED_HEADER}, **errors(
    s400="idempotency_key_required", s401=_AUTH,
    s403=f"workspace_access_revoked (the grant for the run's workspace was revoked, R-AUTH-2), {CLIENT_ONLY}",
    s404=_NOT_FOUND,
    s409="run_active, run_terminal (also when the deadline passed: the run is expired), "
         "run_not_resumable, run_resume_conflict, run_reconciliation_required (a tool call's "
         "outcome is unknown, R-RESUME-3), tool_results_pending (R-TOOL-4), idempotency_key_in_flight",
    s422=body_errors("additional_prompt_empty", "additional_prompt_too_long", "additional_prompt_invalid",
                     "idempotency_key_reused"),
    s503="durable_dispatch_unknown (the body carries the receipt)")}
ANSWER_ERRORS = errors(s401=_AUTH, s403=CLIENT_ONLY, s422=body_errors(_PROMPT), s502="answer_failed")
TOKEN_ERRORS = errors(s401=_AUTH, s403=CLIENT_ONLY, s404=_NOT_FOUND, s422=body_errors())
EVENTS_ERRORS: dict[int | str, dict[str, Any]] = {
    **errors(s400="last_event_id_unknown (the live run sent no event with that id)",
             s429="too_many_streams (QIMPL_EVENT_STREAMS_PER_RUN open streams of this run already)",
             s401="stream_key_required, stream_token_invalid (not a token of this run), "
                  "stream_token_expired, unauthenticated (an `Authorization` header sent with an "
                  "unknown key: it is optional here, but never ignored)",
             s404=f"{_NOT_FOUND} (also for an `Authorization` key of another tenant than the run's, R-AUTH-3)",
             s422=PARAMETER_ERRORS,
             s410="event_stream_pruned (the run ended longer ago than the event retention and "
                  "its events were pruned, R-EVENT-5; read the run record instead)"),
    204: {"description": "the run ended and `Last-Event-ID` is its terminal event (or later): "
                         "nothing more will come; clients stop reconnecting"}}
APPROVAL_ERRORS = errors(
    s401=_AUTH, s403=CLIENT_ONLY, s404=f"{_NOT_FOUND}, approval_not_found",
    s409="action_version_mismatch, approval_conflict, approval_not_pending, run_terminal "
         "(also when the deadline passed: the run is expired)",
    s422=body_errors("approved_invalid", "action_version_invalid"))
LEGACY_ERRORS = errors(s401=_AUTH, s403=CLIENT_ONLY, s404=_NOT_FOUND, s422=PARAMETER_ERRORS,
                       s409="durable_lifecycle_conflict (lifecycle_version 2 runs)",
                       s501="legacy_control_unavailable (lifecycle_version 1 runs)")
