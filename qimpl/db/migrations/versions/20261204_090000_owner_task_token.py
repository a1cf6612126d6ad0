"""The owner's activity task token, and the runs whose lease is gone (R-EXEC-13).

Revision ID: 20261204_090000_owner_task_token
Revises: 20261203_090000_write_xacts
Create Date: 2026-12-04 09:00:00

- ``runs.owner_task_token`` (``bytea``): the Temporal task token of the attempt that
  owns the run, written by the claim in the same fenced UPDATE that sets
  ``owner_attempt``. The token names exactly one attempt of one activity: the Temporal
  server refuses it for any other attempt, so failing the activity by this token can
  only end the attempt that claimed, never a successor.
- ``qimpl_lease_orphans(p_limit)``: the ``running`` version-2 runs whose advisory lock (the
  ownership lease, ``hashtextextended('qimpl-run:' || run_id, 0)``) no session holds.
  The owner takes that lock before it claims and keeps it for the whole attempt on the
  session that makes every one of its writes, so a run whose row names an owner and
  whose lock is free has an owner that can never write again (its session has ended).
  ``SECURITY DEFINER``, owned by ``qimpl_lookup`` (it reads across tenants, like
  ``qimpl_tenant_of_run``): it returns the run's id, tenant, generation, owner attempt
  and token, never its content. It writes nothing.
"""

from alembic import op

revision = "20261204_090000_owner_task_token"
down_revision = "20261203_090000_write_xacts"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


UP_SQL = f"""
ALTER TABLE public.runs ADD COLUMN owner_task_token bytea;
CREATE INDEX runs_running ON public.runs (run_id) WHERE state = 'running';
GRANT SELECT (state, generation, owner_attempt, owner_task_token, lifecycle_version) ON public.runs TO qimpl_lookup;

CREATE FUNCTION public.qimpl_lease_orphans(p_limit integer)
RETURNS TABLE (run_id uuid, tenant_id text, generation integer, owner_attempt integer,
               owner_task_token bytea)
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} AS $$
    WITH held AS (
        -- A bigint advisory key is stored as (classid, objid) = (high, low) 32 bits,
        -- objsubid 1; granted locks of this database only.
        SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
        FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname = pg_catalog.current_database())
    )
    SELECT r.run_id, r.tenant_id, r.generation, r.owner_attempt, r.owner_task_token
    FROM public.runs r
    WHERE r.state = 'running' AND r.lifecycle_version = 2
      AND NOT EXISTS (SELECT 1 FROM held
                      WHERE held.key = pg_catalog.hashtextextended('qimpl-run:' || r.run_id::text, 0))
    ORDER BY r.run_id
    LIMIT greatest(1, least(p_limit, 1000))
$$;
REVOKE ALL ON FUNCTION public.qimpl_lease_orphans(integer) FROM PUBLIC;
-- A new owner must be able to create in the function's schema (as 20261201_100000_hardening
-- does): a schema owner that is not a superuser is refused without it.
GRANT CREATE ON SCHEMA public TO qimpl_lookup;
ALTER FUNCTION public.qimpl_lease_orphans(integer) OWNER TO qimpl_lookup;
REVOKE CREATE ON SCHEMA public FROM qimpl_lookup;
GRANT EXECUTE ON FUNCTION public.qimpl_lease_orphans(integer) TO qimpl_app;
"""

DOWN_SQL = """
DROP FUNCTION public.qimpl_lease_orphans(integer);
REVOKE SELECT (state, generation, owner_attempt, owner_task_token, lifecycle_version) ON public.runs FROM qimpl_lookup;
DROP INDEX public.runs_running;
ALTER TABLE public.runs DROP COLUMN owner_task_token;
"""


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
