"""A page of a listing is read in index order, never by sorting all of a tenant's runs
(issue 56, item 7; R-READ-5).

Before ``20261213_090000_hardening_four`` no index matched the client listing's filter
(tenant, principal, agent) and order (``accepted_at, run_id``), nor the operator
listing's (tenant; once per tenant of the key): each page read every matching run and
sorted them. EXPLAIN of the very SQL ``page_of_runs`` sends, on a few thousand runs, as
the API's role under row-level security, with the planner's custom and generic plans:
an Index Scan on the new index and no Sort node."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

from qimpl.db.listing import Filters, listing_query
from qualify.stack._embedded import API_ROLE, with_user

CLIENT_INDEX = "runs_tenant_principal_agent_accepted"
OPERATOR_INDEX = "runs_tenant_accepted"


@pytest.fixture(scope="module")
def db(stack: Any) -> str:
    """4,000 runs, one a second: 3,000 of tenant ``t-a``, 2,000 of them of one client
    (``p-1`` through agent ``a-2``, in four states), the rest spread over other principals
    and agents; 1,000 of ``t-b``; analysed."""
    dsn = str(stack.create_database())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at, accepted_at)"
            " SELECT gen_random_uuid(), CASE WHEN i % 4 = 0 THEN 't-b' ELSE 't-a' END,"
            "        CASE WHEN i % 3 = 0 THEN 'p-' || (i % 5) ELSE 'p-1' END,"
            "        CASE WHEN i % 3 = 0 THEN 'a-' || (i % 7) ELSE 'a-2' END,"
            "        (ARRAY['completed', 'failed', 'accepted', 'awaiting_input'])[1 + (i / 4) % 4],"
            "        'x', 'k', now() + interval '1 hour', now() - make_interval(secs => i)"
            " FROM generate_series(1, 4000) AS i")
        conn.execute("ANALYZE runs")
    return dsn


@pytest.fixture(scope="module")
def api(db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(with_user(db, API_ROLE), autocommit=True) as conn:
        conn.execute("SELECT set_config('qimpl.tenant', 't-a', false)")
        yield conn


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


_PLACEHOLDER = re.compile(r"%[(](\w+)[)]s")


def _plan(conn: psycopg.Connection[Any], filters: Filters, *, newest_first: bool,
          after: tuple[datetime, str] | None, generic: bool) -> list[dict[str, Any]]:
    """The plan of ``listing_query``'s statement: the planner's custom plan for these
    values, or (``generic``) the plan a prepared statement runs once PostgreSQL's plan
    cache switches to a generic one (psycopg prepares a statement at its fifth use)."""
    sql, params = listing_query(filters, limit=51, newest_first=newest_first, after=after)
    if not generic:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()
    else:
        names: list[str] = []

        def placeholder(m: re.Match[str]) -> str:
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        conn.execute("PREPARE listing_plan AS " + _PLACEHOLDER.sub(placeholder, sql))
        try:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            # EXPLAIN EXECUTE takes no bound parameters: the values go as literals.
            execute = psycopg.ClientCursor(conn).mogrify(
                "EXECUTE listing_plan(" + ", ".join(["%s"] * len(names)) + ")", [params[n] for n in names])
            row = conn.execute("EXPLAIN (FORMAT JSON) " + execute).fetchone()
        finally:
            conn.execute("RESET plan_cache_mode")
            conn.execute("DEALLOCATE listing_plan")
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return list(_nodes(doc[0]["Plan"]))


def _judge(nodes: list[dict[str, Any]], index: str) -> None:
    kinds = [n["Node Type"] for n in nodes]
    assert not any("Sort" in k for k in kinds), kinds
    assert any(n["Node Type"] == "Index Scan" and n.get("Index Name") == index for n in nodes), \
        [(n["Node Type"], n.get("Index Name")) for n in nodes]


@pytest.fixture(scope="module")
def middle(db: str) -> tuple[datetime, str]:
    """A keyset position in the middle of the client's runs (a later page's cursor)."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT accepted_at, run_id::text FROM runs WHERE tenant_id = 't-a'"
                           " AND principal_id = 'p-1' AND agent_id = 'a-2'"
                           " ORDER BY accepted_at DESC, run_id DESC OFFSET 1000 LIMIT 1").fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.req("R-READ-5")
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("later", [False, True], ids=["first-page", "later-page"])
@pytest.mark.parametrize("states", [(), ("completed",), ("completed", "failed")],
                         ids=["all", "one-state", "two-states"])
def test_the_client_listing_walks_its_index(api: psycopg.Connection[Any], middle: tuple[datetime, str],
                                            generic: bool, later: bool, states: tuple[str, ...]) -> None:
    filters = Filters(states=states, principal_id="p-1", agent_id="a-2")
    _judge(_plan(api, filters, newest_first=True, after=middle if later else None, generic=generic),
           CLIENT_INDEX)


@pytest.mark.req("R-READ-5")
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("later", [False, True], ids=["first-page", "later-page"])
@pytest.mark.parametrize("filters", [Filters(), Filters(accepted_before_s=60.0),
                                     Filters(deadline_within_s=7200.0)],
                         ids=["all", "accepted-before", "deadline-within"])
def test_the_operator_listing_walks_its_index(api: psycopg.Connection[Any], middle: tuple[datetime, str],
                                              generic: bool, later: bool, filters: Filters) -> None:
    _judge(_plan(api, filters, newest_first=False, after=middle if later else None, generic=generic),
           OPERATOR_INDEX)
