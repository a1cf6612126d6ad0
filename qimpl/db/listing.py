"""Run listings (R-READ-5): one tenant's runs a page at a time, keyset-paginated on
``(accepted_at, run_id)`` under row-level security (the caller's connection is scoped to
the tenant: ``Services.tenant``). Times in the rows are the database's; ``age_s`` and
``deadline_in_s`` are seconds on its clock at the query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["Filters", "listing_query", "page_of_runs"]

AConn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class Filters:
    """What a listing keeps. ``states``: any of these (empty: every state);
    ``principal_id``: that principal's runs only (a client's own); ``agent_id``: that
    agent's; ``accepted_before_s``: accepted at least this many seconds ago;
    ``deadline_within_s``: not terminal and due within this many seconds (overdue
    included); ``awaiting_reconciliation``: parked on, or ended with, a tool call whose
    outcome is unknown and unrecorded (True), or not (False)."""

    states: Sequence[str] = ()
    principal_id: str | None = None
    agent_id: str | None = None
    accepted_before_s: float | None = None
    deadline_within_s: float | None = None
    awaiting_reconciliation: bool | None = None


_TERMINAL = "('completed', 'failed', 'expired', 'cancelled')"

#: A run with a tool call whose outcome is unknown that an operator must record (R-TOOL-3):
#: parked on it (what a normal resume refuses with 409 ``run_reconciliation_required``,
#: R-RESUME-3), or ended (cancelled, expired, failed) with it unrecorded: the side effect
#: may have happened, and the client cannot settle it. A call out right now (a running
#: run's intent) is not listed.
_AWAITING_RECONCILIATION = (
    "(EXISTS (SELECT 1 FROM tool_invocations t WHERE t.run_id = r.run_id AND t.status = 'intent')"
    f" AND (r.state IN {_TERMINAL}"
    "      OR (r.state = 'awaiting_input'"
    "          AND r.result_json -> 'pending_input' ->> 'kind' = 'reconciliation_required')))")

_COLUMNS = (
    "r.run_id::text AS run_id, r.tenant_id, r.principal_id, r.agent_id, r.state, r.row_version,"
    " r.generation, r.accepted_at, r.started_at, r.completed_at, r.deadline_at, r.error_code,"
    " r.last_failure_code,"
    " r.dispatch_confirmed_at IS NOT NULL AS dispatch_confirmed,"
    " extract(epoch FROM clock_timestamp() - r.accepted_at)::float8 AS age_s,"
    " extract(epoch FROM r.deadline_at - clock_timestamp())::float8 AS deadline_in_s,"
    f" {_AWAITING_RECONCILIATION} AS awaiting_reconciliation")


async def page_of_runs(conn: AConn, filters: Filters, *, limit: int, newest_first: bool,
                       after: tuple[datetime, str] | None = None) -> list[dict[str, Any]]:
    """Up to ``limit`` runs of the connection's tenant matching ``filters``, ordered by
    ``(accepted_at, run_id)`` (descending with ``newest_first``), strictly after the
    keyset position ``after`` (``(accepted_at, run_id)`` of the previous page's last row).
    Rows: ``run_id, tenant_id, principal_id, agent_id, state, row_version, generation,
    accepted_at, started_at, completed_at, deadline_at, error_code, last_failure_code, dispatch_confirmed,
    age_s, deadline_in_s, awaiting_reconciliation``."""
    sql, params = listing_query(filters, limit=limit, newest_first=newest_first, after=after)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return list(await cur.fetchall())


def listing_query(filters: Filters, *, limit: int, newest_first: bool,
                  after: tuple[datetime, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters of ``page_of_runs`` (pure). A page is read in index order,
    never sorted whole: a client's listing (principal and agent) walks
    ``runs_tenant_principal_agent_accepted``, the operator's (tenant only)
    ``runs_tenant_accepted`` (migration ``20261213_090000_hardening_four``;
    tests/integration/test_listing_plan.py)."""
    where: list[str] = ["TRUE"]
    params: dict[str, Any] = {"limit": limit}
    if filters.states:
        where.append("r.state = ANY(%(states)s)")
        params["states"] = list(filters.states)
    if filters.principal_id is not None:
        where.append("r.principal_id = %(principal)s")
        params["principal"] = filters.principal_id
    if filters.agent_id is not None:
        where.append("r.agent_id = %(agent)s")
        params["agent"] = filters.agent_id
    if filters.accepted_before_s is not None:
        where.append("r.accepted_at <= clock_timestamp() - make_interval(secs => %(age)s)")
        params["age"] = filters.accepted_before_s
    if filters.deadline_within_s is not None:
        where.append(f"r.state NOT IN {_TERMINAL}"
                     " AND r.deadline_at <= clock_timestamp() + make_interval(secs => %(due)s)")
        params["due"] = filters.deadline_within_s
    if filters.awaiting_reconciliation is not None:
        where.append(_AWAITING_RECONCILIATION if filters.awaiting_reconciliation
                     else f"NOT {_AWAITING_RECONCILIATION}")
    if after is not None:
        where.append(f"(r.accepted_at, r.run_id) {'<' if newest_first else '>'} (%(at)s, %(id)s::uuid)")
        params["at"], params["id"] = after
    order = "DESC" if newest_first else "ASC"
    sql = (f"SELECT {_COLUMNS} FROM runs r WHERE {' AND '.join(where)}"
           f" ORDER BY r.accepted_at {order}, r.run_id {order} LIMIT %(limit)s")
    return sql, params
