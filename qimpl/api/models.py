"""Request and response bodies of the API (pydantic v2)."""

from __future__ import annotations

import unicodedata
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from qimpl.lifecycle import DEFAULT_DEADLINE_S, MAX_DEADLINE_S, MIN_DEADLINE_S

__all__ = [
    "AnswerIn",
    "AnswerOut",
    "ApprovalAnswer",
    "ApprovalDecision",
    "CancelAnswer",
    "CreateRunRequest",
    "ErrorBody",
    "Invocation",
    "InvocationList",
    "OperatorRunPage",
    "OperatorRunSummary",
    "Receipt",
    "Resolution",
    "ResumeRequest",
    "RunPage",
    "RunSummary",
    "RunView",
    "StreamToken",
    "StreamTokenRequest",
    "ToolResult",
    "ToolResultAnswer",
]

MAX_PROMPT_CHARS = 32_000
#: Text PostgreSQL can store: no NUL character (R-CREATE-1 rejects it with a 422).
_NO_NUL = r"^[^\x00]*$"


def _not_blank(text: str) -> str:
    """A prompt of whitespace only (zero-width and other invisible format characters
    included) is empty (R-CREATE-1: 422 ``prompt_empty``); the text itself is kept as sent."""
    if all(c.isspace() or unicodedata.category(c) == "Cf" for c in text):
        raise PydanticCustomError("string_blank", "the text is whitespace only")
    return text


#: A prompt: 1..MAX_PROMPT_CHARS characters, not all whitespace, no NUL.
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=_NO_NUL),
                   AfterValidator(_not_blank)]


#: More unknown fields than this in a request body are refused as one problem, before
#: pydantic lists each of them (a 1 MiB body holds about 100,000: listing them cost the
#: event loop 0.3 s a request, a tester's finding).
MAX_UNKNOWN_FIELDS = 20


class StrictBody(BaseModel):
    """A request body: unknown fields refused (``unknown_field``), no type coercion; more
    than ``MAX_UNKNOWN_FIELDS`` unknown fields are one problem, not one each."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > MAX_UNKNOWN_FIELDS:
            unknown = sum(1 for k in data if k not in cls.model_fields)
            if unknown > MAX_UNKNOWN_FIELDS:
                raise PydanticCustomError("extra_forbidden", "{n} unknown fields (at most {most} are listed)",
                                          {"n": unknown, "most": MAX_UNKNOWN_FIELDS})
        return data


class CreateRunRequest(StrictBody):
    """R-CREATE-1."""

    prompt: Prompt
    mode: Literal["ask"] = "ask"
    durable_temporal: bool = Field(default=False, strict=True, description=(
        "true: a durable run (Temporal; needs an Idempotency-Key). Omitted or false: the "
        "**legacy** inline path (`durability: legacy` in the receipt), executed in the API "
        "process and lost if it restarts (R-CREATE-6)"))
    response_mode: Literal["receipt"] = "receipt"
    deadline_seconds: int = Field(default=DEFAULT_DEADLINE_S, ge=MIN_DEADLINE_S, le=MAX_DEADLINE_S)
    #: The workspace whose data sources the run may read; the principal needs a grant (R-AUTH-2).
    workspace_id: str = Field(default="default", min_length=1, max_length=128,
                              pattern=r"^[A-Za-z0-9._:-]+$")


class ResumeRequest(StrictBody):
    """R-RESUME-1/2: input for an ``awaiting_input`` run; empty to retry an ``accepted``
    run's dispatch."""

    additional_prompt: Prompt | None = None


class CancelRequest(StrictBody):
    """R-CANCEL-1: a cancel takes no input; a body, if sent, is an empty object (a field
    such as ``reason`` is refused as ``unknown_field``, never silently dropped)."""


class ApprovalDecision(StrictBody):
    """R-APPROVAL-1: the decision, bound to the exact ``action_version`` it was taken on."""

    approved: bool = Field(strict=True)
    action_version: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")


class ApprovalAnswer(BaseModel):
    approval_id: str
    approved: bool
    state: str
    generation: int


class AnswerIn(StrictBody):
    """R-CREATE-7."""

    prompt: Prompt


class AnswerOut(BaseModel):
    answer: str
    steps: int
    usage: dict[str, int]


class Receipt(BaseModel):
    """What a create or resume answers (R-CREATE-3). ``durability`` is ``temporal`` for a
    durable run (``durable_temporal: true``) and **``legacy``** for the inline path taken
    when ``durable_temporal`` is omitted or false (R-CREATE-6): a legacy run executes
    inside the API process that accepted it and does **not** survive that process's
    restart. A replayed receipt (the same ``Idempotency-Key`` and body) carries the
    response header ``Idempotent-Replayed: true``."""

    agent_id: str
    run_id: str
    stream_key: str
    state: str
    lifecycle_version: int
    durability: Literal["temporal", "legacy"] = Field(description=(
        "`temporal`: durable (R-CREATE-3). `legacy`: executed inline in the accepting API "
        "process, lost if it restarts (R-CREATE-6) — the path taken when `durable_temporal` "
        "is omitted or false"))
    deadline_at: datetime


class RunView(BaseModel):
    """R-READ-1. Never carries grants, prompts of other principals or internals (R-READ-3)."""

    run_id: str
    agent_id: str
    state: str
    durability: str
    lifecycle_version: int
    row_version: int
    generation: int
    deadline_at: datetime
    accepted_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    result_json: dict[str, Any] | None
    error_code: str | None
    error_message: str | None
    #: The safe code of the run's last counted failure (a provider error such as
    #: ``provider_error:provider_unreachable``, ``unstored_result:…`` or, when the run's
    #: checkpoint, journal or grant could not be read, ``unrestored_state:…``), whatever its end:
    #: why a run ended ``agent_attempts_exhausted``; null when none was counted (R-EXEC-6).
    last_failure_code: str | None = None
    usage: dict[str, Any] = Field(description=(
        "observed usage (R-Q34-2): provider_calls (every call asked, by every attempt), "
        "provider_calls_no_outcome, input_tokens, output_tokens (null, unknown, once a call "
        "that answered did not report it; never a 0 for unknown), tool_calls, wall_time_s "
        "(accepted_at to the end or now, seconds), wall_s (started_at to the end or now)"))
    #: The run's tool journal (R-Q34-3): each call's ``call_id, tool, kind, step, sent,
    #: settled, outcome`` (``unknown`` for an intent with no outcome) and ``settled_by``: the
    #: role that settled it (``worker``, ``client`` or ``operator``) — a client is shown the
    #: role, never an operator's identity; the operator route shows ``operator:<principal>``.
    tool_invocations: list[dict[str, Any]] = Field(default_factory=list)


class ToolResult(StrictBody):
    """R-TOOL-4: the client's result of a developer-hosted call, validated against the
    call's ``result_schema``."""

    result: dict[str, Any]


class ToolResultAnswer(BaseModel):
    call_id: str
    status: str
    #: Call ids still waiting for a result; resume once this is empty.
    pending: list[str]


class Resolution(StrictBody):
    """R-TOOL-3: what an operator found in the owning system for an unknown outcome.
    ``succeeded`` needs the ``result`` the provider will be fed."""

    outcome: Literal["succeeded", "not_executed", "compensated"]
    result: dict[str, Any] | None = None
    note: str = Field(min_length=1, max_length=2000, pattern=_NO_NUL)


class Invocation(BaseModel):
    """One journal row as an operator sees it (arguments included, to look the call up)."""

    call_id: str
    tool: str
    kind: str
    step: int
    generation: int
    status: str
    arguments: dict[str, Any]
    arguments_digest: str
    result: dict[str, Any] | None
    intent_at: datetime
    outcome_at: datetime | None
    settled_by: str | None
    resolution_note: str | None


class InvocationList(BaseModel):
    run_id: str
    state: str
    error_message: str | None
    invocations: list[Invocation]


class ErrorBody(BaseModel):
    code: str
    message: str
    retryable: bool | None = None
    receipt: Receipt | None = None
    errors: list[dict[str, Any]] | None = None
    #: How many more problems a 422 found than it lists in ``errors`` (at most 20 listed).
    errors_omitted: int | None = None
    #: Call ids that block a resume (``run_reconciliation_required``, ``tool_results_pending``).
    pending: list[str] | None = None


class CancelAnswer(BaseModel):
    """R-CANCEL-1: ``cancelled`` and the state the run is in after the call."""

    cancelled: bool
    state: str


class RunSummary(BaseModel):
    """One run of a client's listing (R-READ-5): what finds it, not its content (read the
    run for ``result_json`` and ``usage``)."""

    run_id: str
    agent_id: str
    state: str
    row_version: int
    generation: int
    accepted_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    deadline_at: datetime
    error_code: str | None
    #: The safe code of the run's last counted failure, null when none (see ``RunView``).
    last_failure_code: str | None = None


class RunPage(BaseModel):
    """A page of a client's runs, newest first. ``next_cursor``: pass it as ``cursor`` for
    the next page; null on the last page."""

    runs: list[RunSummary]
    next_cursor: str | None


class OperatorRunSummary(RunSummary):
    """One run of an operator's listing (R-READ-5): also its tenant and principal, its age
    and time to its deadline (seconds, on the database's clock at the query, negative once
    overdue), whether its dispatch was confirmed, and whether it waits for an operator's
    reconciliation of a tool call whose outcome is unknown (R-TOOL-3)."""

    tenant_id: str
    principal_id: str
    age_s: float
    deadline_in_s: float
    dispatch_confirmed: bool
    awaiting_reconciliation: bool


class OperatorRunPage(BaseModel):
    """A page of an operator's runs across its tenants, oldest accepted first (the stuck
    ones lead). ``tenants``: the tenants the page read."""

    tenants: list[str]
    runs: list[OperatorRunSummary]
    next_cursor: str | None


class StreamTokenRequest(BaseModel):
    """R-EVENT-6: how long the stream token lives, seconds."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ttl_s: int = Field(default=300, ge=1, le=3600)


class StreamToken(BaseModel):
    """A short-lived credential for this run's event stream only, for a browser's
    ``EventSource`` (which cannot send ``X-Stream-Key``): pass it as the ``stream_token``
    query parameter (``events_path`` is the path with it). It is signed with the run's
    stream key and works on every API instance until ``expires_at`` (the database's clock);
    the access log redacts it."""

    token: str
    expires_at: datetime
    events_path: str
