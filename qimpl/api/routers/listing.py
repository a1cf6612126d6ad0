"""Run listings (R-READ-5): a client's own runs of an agent, and an operator's runs across
the tenants it is assigned (its key's own, and those of ``api_keys assign``).

- ``GET /v1/agents/{agent_id}/runs``  the caller's runs of that agent, newest first;
- ``GET /v1/operator/runs``  an operator's runs, oldest accepted first, with the filters
  an operator needs to find stuck runs: accepted age, awaiting reconciliation, deadline
  near.

Both are keyset-paginated (``cursor`` from the previous page's ``next_cursor``) and read
under row-level security, one tenant per transaction (R-AUTH-4)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from qimpl.api.deps import AgentId, CurrentPrincipal, OperatorPrincipal, Svc
from qimpl.api.errors import ApiError
from qimpl.api.models import OperatorRunPage, OperatorRunSummary, RunPage, RunSummary
from qimpl.api.openapi import CLIENT_ONLY, errors
from qimpl.api.paging import decode_cursor, encode_cursor, merge_pages
from qimpl.db.listing import Filters, page_of_runs
from qimpl.lifecycle import RunState

__all__ = ["router"]

router = APIRouter()

#: At most this many runs per page (``limit``), 50 by default.
MAX_PAGE = 200
#: A query parameter off its schema (an unknown state, a limit out of range) is
#: ``invalid_parameter``; a cursor this listing did not issue is ``cursor_invalid``.
_VALIDATION = "invalid_parameter (a query parameter off its schema)"
LIST_ERRORS = errors(s401="unauthenticated", s403=CLIENT_ONLY,
                     s422=f"{_VALIDATION}, cursor_invalid (not a cursor this listing issued)")
OPERATOR_LIST_ERRORS = errors(
    s401="unauthenticated",
    s403="operator_credential_required (R-OPS-7), tenant_not_assigned (the `tenant` asked for "
         "is not one of the key's tenants)",
    s422=f"{_VALIDATION}, cursor_invalid (not a cursor this listing issued)")

States = Annotated[list[RunState] | None, Query(
    description="keep runs in any of these states (repeat the parameter); all states when absent")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"runs per page, 1..{MAX_PAGE}")]
Cursor = Annotated[str | None, Query(max_length=200, description="`next_cursor` of the previous page")]


def _after(cursor: str | None, *, newest_first: bool) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    try:
        return decode_cursor(cursor, newest_first=newest_first)
    except ValueError:
        raise ApiError(422, "cursor_invalid", "cursor is not one this listing issued") from None


@router.get("/v1/agents/{agent_id}/runs", response_model=RunPage, responses=LIST_ERRORS)
async def list_runs(
    agent_id: AgentId,
    svc: Svc,
    principal: CurrentPrincipal,
    state: States = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> RunPage:
    """The caller's own runs of ``agent_id`` (R-READ-5), newest accepted first: another
    principal's runs, even of the same tenant, are never listed (R-AUTH-1)."""
    after = _after(cursor, newest_first=True)
    filters = Filters(states=tuple(state or ()), principal_id=principal.principal_id, agent_id=agent_id)
    async with svc.tenant(principal.tenant_id) as conn:
        rows = await page_of_runs(conn, filters, limit=limit + 1, newest_first=True,
                                  after=after)
    page, more = rows[:limit], len(rows) > limit
    return RunPage(runs=[RunSummary.model_validate(r) for r in page],
                   next_cursor=encode_cursor(page[-1], newest_first=True) if more else None)


@router.get("/v1/operator/runs", response_model=OperatorRunPage, responses=OPERATOR_LIST_ERRORS)
async def list_operator_runs(
    svc: Svc,
    principal: OperatorPrincipal,
    tenant: Annotated[str | None, Query(min_length=1, max_length=128,
                                        description="one of the key's tenants; all of them when absent")] = None,
    state: States = None,
    accepted_before_s: Annotated[float | None, Query(
        ge=0, le=10 * 365 * 86400, description="accepted at least this many seconds ago")] = None,
    awaiting_reconciliation: Annotated[bool | None, Query(
        description="true: parked on a tool call whose outcome is unknown, or ended (cancelled, "
                    "expired, failed) with one unrecorded (an operator must record what happened, "
                    "R-TOOL-3); false: every other run")] = None,
    deadline_within_s: Annotated[float | None, Query(
        ge=0, le=10 * 365 * 86400, description="not ended and due within this many seconds "
                                               "(overdue runs included)")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> OperatorRunPage:
    """Runs across the operator's tenants (R-READ-5, R-OPS-7), oldest accepted first, each
    with its tenant, age and time to deadline on the database's clock."""
    tenants = list(principal.tenants or (principal.tenant_id,))
    if tenant is not None:
        if tenant not in tenants:
            raise ApiError(403, "tenant_not_assigned", "this operator key is not assigned that tenant")
        tenants = [tenant]
    after = _after(cursor, newest_first=False)
    filters = Filters(states=tuple(state or ()), accepted_before_s=accepted_before_s,
                      deadline_within_s=deadline_within_s, awaiting_reconciliation=awaiting_reconciliation)
    pages = []
    for t in tenants:
        async with svc.tenant(t) as conn:
            pages.append(await page_of_runs(conn, filters, limit=limit + 1, newest_first=False,
                                            after=after))
    page, more = merge_pages(pages, limit=limit, newest_first=False)
    return OperatorRunPage(tenants=tenants, runs=[OperatorRunSummary.model_validate(r) for r in page],
                           next_cursor=encode_cursor(page[-1], newest_first=False) if more else None)
