"""Machine-readable codes for request validation errors (R-CREATE-1).

Pure: maps pydantic's error list to one error code per problem. The first problem's
code is the response's ``code``; every problem is listed in ``errors``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_LISTED_ERRORS", "VALIDATION_CODES", "code_for", "listed"]

#: Every code a 422 validation error can carry.
VALIDATION_CODES = (
    "malformed_body", "unknown_field", "prompt_required", "prompt_empty", "prompt_too_long",
    "prompt_invalid", "mode_unsupported", "response_mode_unsupported", "deadline_out_of_range",
    "deadline_invalid", "durable_temporal_invalid", "additional_prompt_empty",
    "additional_prompt_too_long", "additional_prompt_invalid", "workspace_id_invalid", "action_version_invalid", "approved_invalid", "invalid_parameter", "invalid_request",
    "value_unstorable",
)


#: At most this many problems are listed in a 422's ``errors`` (the rest are counted in
#: ``errors_omitted``): a 1 MiB body of 100,000 unknown fields was answered with all of
#: them, a 9.6 MB response that held the API's event loop for a second per request (a
#: tester's finding; eight at once stalled every other client for 11 s).
MAX_LISTED_ERRORS = 20


def listed(errors: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The first ``MAX_LISTED_ERRORS`` of pydantic's ``errors`` as ``{"loc", "code",
    "msg"}`` and how many more there were (0 when all are listed)."""
    shown = [{"loc": [str(p) for p in e.get("loc", ())], "code": code_for(e), "msg": str(e.get("msg", ""))}
             for e in errors[:MAX_LISTED_ERRORS]]
    return shown, max(0, len(errors) - MAX_LISTED_ERRORS)


def code_for(error: Mapping[str, Any]) -> str:
    """The code of one pydantic error (``{"loc", "type", ...}``)."""
    loc: Sequence[Any] = error.get("loc", ())
    kind = str(error.get("type", ""))
    if kind in ("json_invalid", "model_attributes_type") or (
            kind in ("missing", "dict_type") and tuple(loc) == ("body",)):
        return "malformed_body"
    if kind == "extra_forbidden":
        return "unknown_field"
    field = str(loc[-1]) if loc else ""
    if loc and loc[0] in ("path", "query", "header"):
        return "invalid_parameter"
    if field in ("prompt", "additional_prompt"):
        if kind == "missing":
            return f"{field}_required"
        if kind in ("string_too_short", "string_blank"):
            return f"{field}_empty"
        if kind == "string_too_long":
            return f"{field}_too_long"
        return f"{field}_invalid"  # a NUL character, not a string
    if field == "mode":
        return "mode_unsupported"
    if field == "response_mode":
        return "response_mode_unsupported"
    if field == "deadline_seconds":
        return "deadline_out_of_range" if kind in ("greater_than_equal", "less_than_equal") else "deadline_invalid"
    if field == "action_version":
        return "action_version_invalid"
    if field == "approved":
        return "approved_invalid"
    if field == "workspace_id":
        return "workspace_id_invalid"
    if field == "durable_temporal":
        return "durable_temporal_invalid"
    return "invalid_request"
