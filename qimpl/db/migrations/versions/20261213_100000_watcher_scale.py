"""The takeover watcher at scale (issue 55, R-EXEC-13, R-EXEC-14).

Revision ID: 20261213_100000_watcher_scale
Revises: 20261213_090000_hardening_four
Create Date: 2026-12-13 10:00:00

Measured at 20261212_090000_sweep_retention (a40a3c3) with 2,000 ``running`` runs and their 2,000
advisory locks held (embedded PostgreSQL 18, 2 cores): ``qimpl_lease_orphans(100)`` took
670-920 ms. ``pg_lock_status()`` is estimated at one row, so inside the (not inlined)
function the planner joins it in a nested loop and builds the whole lock table once per
running run: quadratic. The same statement with nested loops off is a hash anti join over
one read of the lock table: 3-8 ms. This revision:

* gives ``qimpl_lease_orphans(integer)`` ``SET enable_nestloop = off`` (a release that
  still calls it, during a rolling rollout, gets the linear plan too);
* adds ``qimpl_lease_orphans(p_limit, p_after)``: the same orphans, linear, from
  ``run_id > p_after`` on (a watcher pages through many orphans look by look, so the
  highest ids are reached too), and without the runs whose counted failure's backoff has
  not passed by the database's clock (``runs.retry_not_before``): their owner let the run
  go on purpose and Temporal will retry it; they are no lost owners, and describing each at
  every look cost about 990 Temporal calls a second for 100 such runs;
* adds ``runs.retry_not_before`` (written by the failure count, cleared by the next claim);
* adds ``qimpl_run_states(uuid[])``: the touch of a lease session that carries the locks
  of many runs, of several tenants (``qimpl.db.lease_carriers``): ids and states only.

The downgrade drops the function, the columns and the setting; no run is lost.
"""

from alembic import op

revision = "20261213_100000_watcher_scale"
down_revision = "20261213_090000_hardening_four"
branch_labels = None
depends_on = None

#: The pinned search path of every SECURITY DEFINER function (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"

UP_SQL = f"""
ALTER TABLE public.runs ADD COLUMN retry_not_before timestamptz;
GRANT SELECT (retry_not_before) ON public.runs TO qimpl_lookup;
ALTER FUNCTION public.qimpl_lease_orphans(integer) SET enable_nestloop = off;

CREATE FUNCTION public.qimpl_lease_orphans(p_limit integer, p_after uuid)
RETURNS TABLE (run_id uuid, tenant_id text, generation integer, owner_attempt integer,
               owner_task_token bytea)
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} SET enable_nestloop = off AS $$
    WITH held AS MATERIALIZED (
        -- One read of the lock table: a bigint advisory key is (classid, objid) = (high,
        -- low) 32 bits, objsubid 1; granted locks of this database only.
        SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
        FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname = pg_catalog.current_database())
    )
    SELECT r.run_id, r.tenant_id, r.generation, r.owner_attempt, r.owner_task_token
    FROM public.runs r
    WHERE r.state = 'running' AND r.lifecycle_version = 2
      AND (p_after IS NULL OR r.run_id > p_after)
      AND (r.retry_not_before IS NULL OR r.retry_not_before <= pg_catalog.clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM held
                      WHERE held.key = pg_catalog.hashtextextended('qimpl-run:' || r.run_id::text, 0))
    ORDER BY r.run_id
    LIMIT greatest(1, least(p_limit, 1000))
$$;
REVOKE ALL ON FUNCTION public.qimpl_lease_orphans(integer, uuid) FROM PUBLIC;
GRANT CREATE ON SCHEMA public TO qimpl_lookup;
ALTER FUNCTION public.qimpl_lease_orphans(integer, uuid) OWNER TO qimpl_lookup;
REVOKE CREATE ON SCHEMA public FROM qimpl_lookup;
GRANT EXECUTE ON FUNCTION public.qimpl_lease_orphans(integer, uuid) TO qimpl_worker_role;

-- A shared lease session's touch: the state of each run whose lock it carries, across
-- tenants (a session carries runs of several), ids and states only.
CREATE FUNCTION public.qimpl_run_states(p_run_ids uuid[])
RETURNS TABLE (run_id uuid, state varchar)
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} AS $$
    SELECT r.run_id, r.state FROM public.runs r WHERE r.run_id = ANY (p_run_ids)
$$;
REVOKE ALL ON FUNCTION public.qimpl_run_states(uuid[]) FROM PUBLIC;
GRANT CREATE ON SCHEMA public TO qimpl_lookup;
ALTER FUNCTION public.qimpl_run_states(uuid[]) OWNER TO qimpl_lookup;
REVOKE CREATE ON SCHEMA public FROM qimpl_lookup;
GRANT EXECUTE ON FUNCTION public.qimpl_run_states(uuid[]) TO qimpl_worker_role;
"""

DOWN_SQL = """
DROP FUNCTION public.qimpl_run_states(uuid[]);
DROP FUNCTION public.qimpl_lease_orphans(integer, uuid);
ALTER FUNCTION public.qimpl_lease_orphans(integer) RESET enable_nestloop;
REVOKE SELECT (retry_not_before) ON public.runs FROM qimpl_lookup;
ALTER TABLE public.runs DROP COLUMN retry_not_before;
"""


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
