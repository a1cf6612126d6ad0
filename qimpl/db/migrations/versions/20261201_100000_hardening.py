"""Security hardening (issue 13): no cross-tenant aggregate for the API, an index for the
per-tenant metrics (R-OPS-7, R-AUTH-4).

Revision ID: 20261201_100000_hardening
Revises: 20261130_160000_tool_journal
Create Date: 2026-12-01 10:00:00

- ``qimpl_run_stats()``, the SECURITY DEFINER aggregate of every tenant's runs that the
  API's anonymous ``/metrics`` served, is dropped: the API now reads the scraping
  operator's tenant only, under row-level security.
- ``runs_tenant_state_accepted (tenant_id, state, accepted_at)`` replaces
  ``runs_tenant_state (tenant_id, state)`` (a prefix of it): the per-tenant metrics query
  is an index-only scan of one tenant's entries, never a scan of the table.
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "20261201_100000_hardening"
down_revision = "20261130_160000_tool_journal"
branch_labels = None
depends_on = None


def _previous():  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(f"{down_revision}.py")
    spec = importlib.util.spec_from_file_location("qimpl_migration_previous", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_PREV = _previous()
STATES = _PREV.STATES
ALLOWED = _PREV.ALLOWED  # no transition changes in this revision
PREVIOUS_GUARD_SQL = _PREV.GUARD_SQL
GUARD_SQL = PREVIOUS_GUARD_SQL

METRICS_SQL = """
DROP FUNCTION qimpl_run_stats();
CREATE INDEX runs_tenant_state_accepted ON runs (tenant_id, state, accepted_at);
DROP INDEX runs_tenant_state;
"""

METRICS_DOWN_SQL = """
CREATE INDEX runs_tenant_state ON runs (tenant_id, state);
DROP INDEX runs_tenant_state_accepted;
CREATE FUNCTION qimpl_run_stats()
RETURNS TABLE (tenant_id text, state varchar, runs bigint, oldest_s float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT r.tenant_id, r.state, count(*),
           extract(epoch FROM clock_timestamp() - min(r.accepted_at))::float8
    FROM runs r GROUP BY r.tenant_id, r.state
$$;
REVOKE ALL ON FUNCTION qimpl_run_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qimpl_run_stats() TO qimpl_app;
"""


def upgrade() -> None:
    op.execute(METRICS_SQL)


def downgrade() -> None:
    op.execute(METRICS_DOWN_SQL)
