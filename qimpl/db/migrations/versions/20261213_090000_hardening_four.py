"""Hardening, fourth pass (issue 56): the guards fire in every replication role; the
listings' indexes; the worker's SECURITY DEFINER functions for the worker alone.

Revision ID: 20261213_090000_hardening_four
Revises: 20261212_090000_sweep_retention
Create Date: 2026-12-13 09:00:00

- **Every trigger fires ``ALWAYS``** (item 4). The transition guard, the checkpoint
  guard, the tool journal's and the provider calls' guards, the transition audit, the
  event journal and the key audit are ordinary triggers, which PostgreSQL skips in a
  session whose ``session_replication_role`` is ``replica``. A role granted ``SET ON
  PARAMETER session_replication_role`` wrote ``running -> completed`` with no
  ``row_version`` bump and no audit row. ``ENABLE ALWAYS`` makes each fire whatever the
  session's replication role (the start-up role check refuses such a role as well,
  ``qimpl/db/roles.py``). A logical-replication subscriber of this schema (none is
  supported) would now run them on the rows it applies too.
  The downgrade puts each back to ``ENABLE`` (fires in ``origin`` and ``local`` only).
- **The listings read a page in index order** (item 7). A client's listing (its tenant,
  principal and agent, newest accepted first) and the operator's (one tenant at a time,
  oldest first) sorted all the matching runs for each page: no index matched their
  filter and ``ORDER BY accepted_at, run_id``. ``runs_tenant_principal_agent_accepted``
  and ``runs_tenant_accepted`` do (``qimpl/db/listing.py``). The downgrade drops them.
- **The worker's functions are the worker's** (item 5). ``qimpl_lease_orphans`` (every
  tenant's running runs without a lease, with their Temporal task tokens) and
  ``qimpl_prune_event_streams`` were granted to ``qimpl_app``, which the API's role is a
  member of too: as the API with no tenant set, ``qimpl_lease_orphans(1000)`` returned
  runs of two tenants and a task token. Both are now granted to a new group role,
  ``qimpl_worker_role`` (NOLOGIN), that only the worker's login role (and the one-shot
  sweep's) is made a member of: ``CREATE ROLE qimpl_worker LOGIN … IN ROLE qimpl_app,
  qimpl_worker_role``; an existing one: ``GRANT qimpl_worker_role TO qimpl_worker``.
- **Pruning keeps a stream at least a floor** (item 5). ``qimpl_prune_event_streams``
  took its retention from its caller, so a retention of 0 deleted a run's journal the
  moment it ended. It now keeps every stream at least the schema owner's floor,
  ``event_retention_floor.seconds`` (60 s; one row, no application role may read or change
  it): the retention it uses is ``greatest(p_retention_s, floor)``.

The downgrade grants the two functions to ``qimpl_app`` again, restores the function
without the floor and drops the floor's table; roles are cluster-wide and stay.
"""

from alembic import op

revision = "20261213_090000_hardening_four"
down_revision = "20261212_090000_sweep_retention"
branch_labels = None
depends_on = None

#: (table, trigger) for every trigger of the schema at this revision.
_TRIGGERS = (
    ("api_key_audit", "api_key_audit_append_only"),
    ("api_keys", "api_keys_audit"),
    ("api_keys", "api_keys_guard"),
    ("operator_tenants", "operator_tenants_audit"),
    ("provider_calls", "provider_calls_guard"),
    ("provider_calls", "provider_calls_usage_event"),
    ("provider_calls", "provider_calls_xact"),
    ("run_checkpoints", "run_checkpoints_guard"),
    ("run_checkpoints", "run_checkpoints_xact"),
    ("run_events", "run_events_notify"),
    ("run_events", "run_events_number"),
    ("run_events", "run_events_xact"),
    ("run_transitions", "run_transitions_event"),
    ("run_transitions", "run_transitions_xact"),
    ("runs", "runs_forbid_delete"),
    ("runs", "runs_record_transition"),
    ("runs", "runs_terminal_clears_pending"),
    ("runs", "runs_transition_guard"),
    ("tool_invocations", "tool_invocations_guard"),
    ("tool_invocations", "tool_invocations_xact"),
)



def _prune_sql(retention: str) -> str:
    """``qimpl_prune_event_streams`` keeping each stream ``retention`` seconds after its run
    ended (an SQL expression over ``p_retention_s``); otherwise as
    ``20261202_090000_event_journal`` made it."""
    return """
CREATE OR REPLACE FUNCTION public.qimpl_prune_event_streams(p_retention_s double precision,
                                                            p_reconciler text, p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    WITH victims AS (
        SELECT r.run_id, r.tenant_id FROM public.runs r
        WHERE r.tenant_id = current_setting('qimpl.tenant', true) AND r.state IN ('completed', 'failed', 'expired', 'cancelled')
          AND coalesce(r.completed_at, r.accepted_at)
              <= clock_timestamp() - make_interval(secs => """ + retention + """)
          AND NOT EXISTS (SELECT 1 FROM public.run_event_prunes p WHERE p.run_id = r.run_id)
        ORDER BY r.completed_at
        LIMIT least(greatest(p_limit, 0), 100)
        FOR UPDATE OF r SKIP LOCKED
    ), gone AS (
        DELETE FROM public.run_events e USING victims v WHERE e.run_id = v.run_id
        RETURNING e.run_id
    ), marked AS (
        INSERT INTO public.run_event_prunes (run_id, tenant_id, pruned_by, events)
        SELECT v.run_id, v.tenant_id, p_reconciler,
               (SELECT count(*) FROM gone g WHERE g.run_id = v.run_id)
        FROM victims v
        ON CONFLICT (run_id) DO NOTHING
        RETURNING run_id
    )
    SELECT count(*) INTO n FROM marked;
    RETURN n;
END;
$$;
"""


UP_SQL = "".join(f"ALTER TABLE public.{table} ENABLE ALWAYS TRIGGER {trigger};\n"
                 for table, trigger in _TRIGGERS) + """
CREATE INDEX runs_tenant_principal_agent_accepted
    ON public.runs (tenant_id, principal_id, agent_id, accepted_at, run_id);
CREATE INDEX runs_tenant_accepted ON public.runs (tenant_id, accepted_at, run_id);
""" + """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'qimpl_worker_role') THEN
        CREATE ROLE qimpl_worker_role NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
END $$;
REVOKE ALL ON FUNCTION public.qimpl_lease_orphans(integer) FROM qimpl_app;
GRANT EXECUTE ON FUNCTION public.qimpl_lease_orphans(integer) TO qimpl_worker_role;
REVOKE ALL ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer) FROM qimpl_app;
GRANT EXECUTE ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer)
    TO qimpl_worker_role;
CREATE TABLE public.event_retention_floor (
    one_row boolean PRIMARY KEY DEFAULT true CHECK (one_row),
    seconds double precision NOT NULL CHECK (seconds >= 0 AND seconds < 'Infinity')
);
INSERT INTO public.event_retention_floor (seconds) VALUES (60);
""" + _prune_sql("""greatest(p_retention_s,
                    coalesce((SELECT f.seconds FROM public.event_retention_floor f), 60))""")

DOWN_SQL = _prune_sql("p_retention_s") + """
DROP TABLE public.event_retention_floor;
REVOKE ALL ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer) FROM qimpl_worker_role;
GRANT EXECUTE ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer) TO qimpl_app;
REVOKE ALL ON FUNCTION public.qimpl_lease_orphans(integer) FROM qimpl_worker_role;
GRANT EXECUTE ON FUNCTION public.qimpl_lease_orphans(integer) TO qimpl_app;
DROP INDEX public.runs_tenant_accepted;
DROP INDEX public.runs_tenant_principal_agent_accepted;
""" + "".join(f"ALTER TABLE public.{table} ENABLE TRIGGER {trigger};\n" for table, trigger in _TRIGGERS)


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
