"""Security hardening (issue 13): no cross-tenant aggregate for the API, an index for the
per-tenant metrics (R-OPS-7); row-level security that the owner cannot skip, functions that
cannot be hijacked, and an audit trail the application cannot write (R-AUTH-4, R-Q-5).

Revision ID: 20261201_100000_hardening
Revises: 20261130_160000_tool_journal
Create Date: 2026-12-01 10:00:00

- ``qimpl_run_stats()``, the SECURITY DEFINER aggregate of every tenant's runs that the
  API's anonymous ``/metrics`` served, is dropped: the API now reads the scraping
  operator's tenant only, under row-level security.
- ``runs_tenant_state_accepted (tenant_id, state, accepted_at)`` replaces
  ``runs_tenant_state (tenant_id, state)`` (a prefix of it): the per-tenant metrics query
  is an index-only scan of one tenant's entries, never a scan of the table.
- Row-level security is FORCEd on every tenant table, so it binds the tables' owner too
  (a non-superuser owner, as on managed PostgreSQL; a superuser still bypasses it, which
  is why processes refuse to start as one, ``qimpl.db.roles``). The two lookups that must
  find a run before its tenant is known (``qimpl_stream_tenant``, ``qimpl_tenant_of_run``)
  are owned by ``qimpl_lookup`` (NOLOGIN), which may read ``run_id``, ``tenant_id`` and
  ``stream_key`` of any run through its own policy, and nothing else.
- Every trigger function and SECURITY DEFINER function runs with ``search_path =
  pg_catalog, public, pg_temp`` (temporary relations last: otherwise PostgreSQL searches
  ``pg_temp`` first, and a temporary ``run_allowed_transitions`` or ``api_keys`` would be
  read instead of the real one) and names its relations ``public.``-qualified; TEMPORARY
  on the database is revoked from PUBLIC (``qimpl.db.admin.harden_database``; a database
  cloned from a template must have it applied again: database privileges are not copied).
- ``run_transitions`` (the audit trail the harness trusts as the database's own record)
  is written only by the SECURITY DEFINER trigger ``runs_record_transition``: INSERT and
  UPDATE on it, its sequence, and UPDATE on ``run_checkpoints`` are revoked from
  ``qimpl_app``.
"""

from alembic import op

revision = "20261201_100000_hardening"
down_revision = "20261130_160000_tool_journal"
branch_labels = None
depends_on = None


#: Every trigger and SECURITY DEFINER function's search path: temporary relations last.
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: The transition guard as 20261130_160000_tool_journal left it (restored by the downgrade).
PREVIOUS_GUARD_SQL = """
CREATE OR REPLACE FUNCTION runs_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('completed', 'failed', 'expired', 'cancelled') THEN
        RAISE EXCEPTION 'run % is terminal (%)', OLD.run_id, OLD.state
            USING ERRCODE = 'QG001';
    END IF;
    IF NEW.row_version IS DISTINCT FROM OLD.row_version + 1 THEN
        RAISE EXCEPTION 'run %: row_version must go from % to %, not %',
            OLD.run_id, OLD.row_version, OLD.row_version + 1, NEW.row_version
            USING ERRCODE = 'QG003';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM run_allowed_transitions
                   WHERE from_state = OLD.state AND to_state = NEW.state) THEN
        RAISE EXCEPTION 'run %: transition % -> % is not allowed', OLD.run_id, OLD.state, NEW.state
            USING ERRCODE = 'QG002';
    END IF;
    IF NEW.run_id <> OLD.run_id OR NEW.tenant_id <> OLD.tenant_id
       OR NEW.principal_id <> OLD.principal_id OR NEW.accepted_at <> OLD.accepted_at
       OR NEW.deadline_at <> OLD.deadline_at OR NEW.lifecycle_version <> OLD.lifecycle_version
       OR NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'run %: identity, deadline and generation are immutable', OLD.run_id
            USING ERRCODE = 'QG004';
    END IF;
    IF NEW.state = 'expired' AND clock_timestamp() < OLD.deadline_at THEN
        RAISE EXCEPTION 'run %: expired before its deadline (% < %)',
            OLD.run_id, clock_timestamp(), OLD.deadline_at
            USING ERRCODE = 'QG007';
    END IF;
    IF OLD.lifecycle_version = 2 AND clock_timestamp() >= OLD.deadline_at
       AND NEW.state NOT IN ('expired', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'run %: deadline % passed; it may only end', OLD.run_id, OLD.deadline_at
            USING ERRCODE = 'QG006';
    END IF;
    IF NEW.generation = OLD.generation AND NEW.owner_attempt < OLD.owner_attempt THEN
        RAISE EXCEPTION 'run %: attempt % may not take generation % back from attempt %',
            OLD.run_id, NEW.owner_attempt, OLD.generation, OLD.owner_attempt
            USING ERRCODE = 'QG008';
    END IF;
    IF OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation
       AND EXISTS (SELECT 1 FROM tool_invocations t WHERE t.run_id = OLD.run_id
                   AND t.status IN ('intent', 'requested')) THEN
        RAISE EXCEPTION 'run %: unsettled tool invocations; reconcile the journal first', OLD.run_id
            USING ERRCODE = 'QG010';
    END IF;
    RETURN NEW;
END;
$$;
"""

#: The same guard with a pinned search path and ``public.``-qualified relations.
GUARD_SQL = """
CREATE OR REPLACE FUNCTION public.runs_transition_guard() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF OLD.state IN ('completed', 'failed', 'expired', 'cancelled') THEN
        RAISE EXCEPTION 'run % is terminal (%)', OLD.run_id, OLD.state
            USING ERRCODE = 'QG001';
    END IF;
    IF NEW.row_version IS DISTINCT FROM OLD.row_version + 1 THEN
        RAISE EXCEPTION 'run %: row_version must go from % to %, not %',
            OLD.run_id, OLD.row_version, OLD.row_version + 1, NEW.row_version
            USING ERRCODE = 'QG003';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.run_allowed_transitions
                   WHERE from_state = OLD.state AND to_state = NEW.state) THEN
        RAISE EXCEPTION 'run %: transition % -> % is not allowed', OLD.run_id, OLD.state, NEW.state
            USING ERRCODE = 'QG002';
    END IF;
    IF NEW.run_id <> OLD.run_id OR NEW.tenant_id <> OLD.tenant_id
       OR NEW.principal_id <> OLD.principal_id OR NEW.accepted_at <> OLD.accepted_at
       OR NEW.deadline_at <> OLD.deadline_at OR NEW.lifecycle_version <> OLD.lifecycle_version
       OR NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'run %: identity, deadline and generation are immutable', OLD.run_id
            USING ERRCODE = 'QG004';
    END IF;
    IF NEW.state = 'expired' AND clock_timestamp() < OLD.deadline_at THEN
        RAISE EXCEPTION 'run %: expired before its deadline (% < %)',
            OLD.run_id, clock_timestamp(), OLD.deadline_at
            USING ERRCODE = 'QG007';
    END IF;
    IF OLD.lifecycle_version = 2 AND clock_timestamp() >= OLD.deadline_at
       AND NEW.state NOT IN ('expired', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'run %: deadline % passed; it may only end', OLD.run_id, OLD.deadline_at
            USING ERRCODE = 'QG006';
    END IF;
    IF NEW.generation = OLD.generation AND NEW.owner_attempt < OLD.owner_attempt THEN
        RAISE EXCEPTION 'run %: attempt % may not take generation % back from attempt %',
            OLD.run_id, NEW.owner_attempt, OLD.generation, OLD.owner_attempt
            USING ERRCODE = 'QG008';
    END IF;
    IF OLD.state = 'awaiting_input' AND NEW.generation > OLD.generation
       AND EXISTS (SELECT 1 FROM public.tool_invocations t WHERE t.run_id = OLD.run_id
                   AND t.status IN ('intent', 'requested')) THEN
        RAISE EXCEPTION 'run %: unsettled tool invocations; reconcile the journal first', OLD.run_id
            USING ERRCODE = 'QG010';
    END IF;
    RETURN NEW;
END;
$$;
"""

#: The tool journal's guard as 20261130_160000_tool_journal created it.
PREVIOUS_JOURNAL_GUARD_SQL = """CREATE OR REPLACE FUNCTION tool_invocations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r runs%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'tool invocation %/% may not be deleted', OLD.run_id, OLD.call_id
            USING ERRCODE = 'QG011';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status NOT IN ('intent', 'requested') THEN
            RAISE EXCEPTION 'tool invocation %/% is settled (%)', OLD.run_id, OLD.call_id, OLD.status
                USING ERRCODE = 'QG011';
        END IF;
        IF NEW.run_id <> OLD.run_id OR NEW.call_id <> OLD.call_id OR NEW.tool <> OLD.tool
           OR NEW.kind <> OLD.kind OR NEW.arguments <> OLD.arguments
           OR NEW.arguments_digest <> OLD.arguments_digest OR NEW.step <> OLD.step
           OR NEW.generation <> OLD.generation OR NEW.position <> OLD.position
           OR NEW.intent_row_version IS DISTINCT FROM OLD.intent_row_version
           OR NEW.intent_attempt IS DISTINCT FROM OLD.intent_attempt THEN
            RAISE EXCEPTION 'tool invocation %/%: what was asked is immutable', OLD.run_id, OLD.call_id
                USING ERRCODE = 'QG011';
        END IF;
    END IF;
    SELECT * INTO r FROM runs WHERE run_id = NEW.run_id;
    IF NEW.settled_by IS NULL OR NEW.settled_by = 'worker' THEN
        -- The owner's write: same transaction as its fenced UPDATE of the run.
        IF r.state IS DISTINCT FROM 'running' OR r.generation <> NEW.generation
           OR r.owner_attempt IS DISTINCT FROM NEW.intent_attempt
           OR r.row_version <> coalesce(NEW.outcome_row_version, NEW.intent_row_version) THEN
            RAISE EXCEPTION 'tool invocation %/%: written by no owner (run % g% a% v%)',
                NEW.run_id, NEW.call_id, r.state, r.generation, r.owner_attempt, r.row_version
                USING ERRCODE = 'QG009';
        END IF;
    ELSIF TG_OP = 'INSERT' OR r.state IN ('accepted', 'queued', 'running', 'awaiting_approval') THEN
        RAISE EXCEPTION 'tool invocation %/%: settled by % while the run is %',
            NEW.run_id, NEW.call_id, NEW.settled_by, r.state
            USING ERRCODE = 'QG009';
    END IF;
    RETURN NEW;
END;
$$;
"""

#: The same journal guard with a pinned search path and qualified relations.
JOURNAL_GUARD_SQL = """CREATE OR REPLACE FUNCTION public.tool_invocations_guard() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    r public.runs%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'tool invocation %/% may not be deleted', OLD.run_id, OLD.call_id
            USING ERRCODE = 'QG011';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status NOT IN ('intent', 'requested') THEN
            RAISE EXCEPTION 'tool invocation %/% is settled (%)', OLD.run_id, OLD.call_id, OLD.status
                USING ERRCODE = 'QG011';
        END IF;
        IF NEW.run_id <> OLD.run_id OR NEW.call_id <> OLD.call_id OR NEW.tool <> OLD.tool
           OR NEW.kind <> OLD.kind OR NEW.arguments <> OLD.arguments
           OR NEW.arguments_digest <> OLD.arguments_digest OR NEW.step <> OLD.step
           OR NEW.generation <> OLD.generation OR NEW.position <> OLD.position
           OR NEW.intent_row_version IS DISTINCT FROM OLD.intent_row_version
           OR NEW.intent_attempt IS DISTINCT FROM OLD.intent_attempt THEN
            RAISE EXCEPTION 'tool invocation %/%: what was asked is immutable', OLD.run_id, OLD.call_id
                USING ERRCODE = 'QG011';
        END IF;
    END IF;
    SELECT * INTO r FROM public.runs WHERE run_id = NEW.run_id;
    IF NEW.settled_by IS NULL OR NEW.settled_by = 'worker' THEN
        -- The owner's write: same transaction as its fenced UPDATE of the run.
        IF r.state IS DISTINCT FROM 'running' OR r.generation <> NEW.generation
           OR r.owner_attempt IS DISTINCT FROM NEW.intent_attempt
           OR r.row_version <> coalesce(NEW.outcome_row_version, NEW.intent_row_version) THEN
            RAISE EXCEPTION 'tool invocation %/%: written by no owner (run % g% a% v%)',
                NEW.run_id, NEW.call_id, r.state, r.generation, r.owner_attempt, r.row_version
                USING ERRCODE = 'QG009';
        END IF;
    ELSIF TG_OP = 'INSERT' OR r.state IN ('accepted', 'queued', 'running', 'awaiting_approval') THEN
        RAISE EXCEPTION 'tool invocation %/%: settled by % while the run is %',
            NEW.run_id, NEW.call_id, NEW.settled_by, r.state
            USING ERRCODE = 'QG009';
    END IF;
    RETURN NEW;
END;
$$;
"""

#: The audit trail, written with the owner's rights (R-Q-5): the application cannot.
AUDIT_SQL = f"""
CREATE OR REPLACE FUNCTION public.runs_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
BEGIN
    INSERT INTO public.run_transitions (run_id, tenant_id, row_version, old_state, new_state,
                                        generation, owner_attempt, checkpoint_step)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step);
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.runs_record_transition() FROM PUBLIC;
ALTER FUNCTION public.runs_forbid_delete() {SAFE_PATH};
REVOKE INSERT, UPDATE ON public.run_transitions FROM qimpl_app;
REVOKE UPDATE ON public.run_checkpoints FROM qimpl_app;
REVOKE USAGE ON SEQUENCE public.run_transitions_id_seq FROM qimpl_app;
"""

AUDIT_DOWN_SQL = """
CREATE OR REPLACE FUNCTION runs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_transitions (run_id, tenant_id, row_version, old_state, new_state, generation,
                                 owner_attempt, checkpoint_step)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step);
    RETURN NULL;
END;
$$;
GRANT EXECUTE ON FUNCTION runs_record_transition() TO PUBLIC;
ALTER FUNCTION runs_forbid_delete() RESET search_path;
GRANT INSERT, UPDATE ON run_transitions TO qimpl_app;
GRANT UPDATE ON run_checkpoints TO qimpl_app;
GRANT USAGE ON SEQUENCE run_transitions_id_seq TO qimpl_app;
"""

#: ``(signature, returns, body with qualified names, body as before)`` of each SECURITY
#: DEFINER function; all four keep their owner's rights, now with a pinned search path.
_DEFINERS = (
    ("qimpl_authenticate(p_key_hash text)", "TABLE (tenant_id text, principal_id text)",
     "SELECT k.tenant_id, k.principal_id FROM {s}api_keys k\n"
     "    WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL"),
    ("qimpl_authenticate_operator(p_key_hash text)", "TABLE (tenant_id text, principal_id text)",
     "SELECT k.tenant_id, k.principal_id FROM {s}api_keys k\n"
     "    WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL AND k.role = 'operator'"),
    ("qimpl_stream_tenant(p_run_id uuid, p_stream_key text)", "text",
     "SELECT r.tenant_id FROM {s}runs r WHERE r.run_id = p_run_id AND r.stream_key = p_stream_key"),
    ("qimpl_tenant_of_run(p_run_id uuid)", "text",
     "SELECT r.tenant_id FROM {s}runs r WHERE r.run_id = p_run_id"),
)


def _definers(*, safe: bool) -> str:
    path, schema = (SAFE_PATH, "public.") if safe else ("SET search_path = public", "")
    return "\n".join(
        f"CREATE OR REPLACE FUNCTION {schema}{sig} RETURNS {ret}\n"
        f"LANGUAGE sql STABLE SECURITY DEFINER {path} AS $$\n    {body.format(s=schema)}\n$$;"
        for sig, ret, body in _DEFINERS)


#: Tables whose rows belong to a tenant: FORCE binds their owner to the policies.
TENANT_TABLES = ("runs", "run_transitions", "run_checkpoints", "idempotency_records",
                 "reconciler_sweeps", "workspace_grants", "approval_decisions", "tool_invocations")

FORCE_SQL = "\n".join(f"ALTER TABLE public.{t} FORCE ROW LEVEL SECURITY;" for t in TENANT_TABLES) + """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qimpl_lookup') THEN
        CREATE ROLE qimpl_lookup NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    -- ALTER ... OWNER TO needs the migrating role to be able to SET ROLE qimpl_lookup.
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT qimpl_lookup TO %I', current_user);
    END IF;
END $$;
GRANT USAGE, CREATE ON SCHEMA public TO qimpl_lookup;
GRANT SELECT (run_id, tenant_id, stream_key) ON public.runs TO qimpl_lookup;
CREATE POLICY definer_lookup ON public.runs FOR SELECT TO qimpl_lookup USING (true);
ALTER FUNCTION public.qimpl_stream_tenant(uuid, text) OWNER TO qimpl_lookup;
ALTER FUNCTION public.qimpl_tenant_of_run(uuid) OWNER TO qimpl_lookup;
REVOKE CREATE ON SCHEMA public FROM qimpl_lookup;
"""

FORCE_DOWN_SQL = "\n".join(f"ALTER TABLE {t} NO FORCE ROW LEVEL SECURITY;" for t in TENANT_TABLES) + """
ALTER FUNCTION qimpl_stream_tenant(uuid, text) OWNER TO CURRENT_USER;
ALTER FUNCTION qimpl_tenant_of_run(uuid) OWNER TO CURRENT_USER;
DROP POLICY definer_lookup ON runs;
REVOKE ALL ON runs FROM qimpl_lookup;
REVOKE ALL ON SCHEMA public FROM qimpl_lookup;
"""

#: TEMPORARY on the current database for nobody but its owner (and superusers).
REVOKE_TEMP_SQL = """
DO $$ BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END $$;
"""
GRANT_TEMP_SQL = """
DO $$ BEGIN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
END $$;
"""

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
    op.execute(GUARD_SQL)
    op.execute(JOURNAL_GUARD_SQL)
    op.execute(_definers(safe=True))
    op.execute(AUDIT_SQL)
    op.execute(FORCE_SQL)
    op.execute(REVOKE_TEMP_SQL)


def downgrade() -> None:
    # First: the owner sees every row again (the earlier downgrades count and fold runs).
    op.execute(FORCE_DOWN_SQL)
    op.execute(GRANT_TEMP_SQL)
    op.execute(AUDIT_DOWN_SQL)
    op.execute(_definers(safe=False))
    op.execute(PREVIOUS_JOURNAL_GUARD_SQL)
    op.execute(PREVIOUS_GUARD_SQL)
    op.execute(METRICS_DOWN_SQL)
