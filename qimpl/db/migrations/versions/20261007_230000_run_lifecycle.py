"""Run lifecycle v2: runs, checkpoints, idempotency records, transition guard and audit.

Revision ID: 20261007_230000_run_lifecycle
Revises: 20261001_000000_baseline
Create Date: 2026-10-07 23:00:00

Implements R-STATE-1 (the guard trigger, driven by ``run_allowed_transitions``),
R-STATE-2 (lowercase VARCHAR states with a CHECK), R-CREATE-4 (runs, idempotency
records, dispatch identity) and R-EXEC-3 (checkpoints). Every insert and update of a
run is recorded by the database itself in ``run_transitions`` (the history that the
qualification checkers read).
"""

from alembic import op

revision = "20261007_230000_run_lifecycle"
down_revision = "20261001_000000_baseline"
branch_labels = None
depends_on = None

STATES = (
    "accepted", "queued", "running", "awaiting_input", "awaiting_approval",
    "completed", "failed", "expired", "cancelled",
)

# The transitions at this revision (the head's table, in qimpl/db/schema.sql, is kept equal
# to qimpl.lifecycle.TRANSITIONS by tests/unit/test_migration_table.py).
ALLOWED = (
    ("accepted", "queued"), ("accepted", "cancelled"), ("accepted", "expired"),
    ("accepted", "failed"),
    ("queued", "running"), ("queued", "cancelled"), ("queued", "expired"), ("queued", "failed"),
    ("running", "running"), ("running", "awaiting_input"), ("running", "awaiting_approval"),
    ("running", "completed"), ("running", "failed"), ("running", "cancelled"),
    ("running", "expired"),
    ("awaiting_input", "accepted"), ("awaiting_input", "cancelled"),
    ("awaiting_input", "expired"),
    ("awaiting_approval", "running"), ("awaiting_approval", "queued"),
    ("awaiting_approval", "cancelled"), ("awaiting_approval", "expired"),
)

# Version-1 rows may still say `streaming` (R-READ-4): they may only end.
LEGACY_ALLOWED = (
    ("streaming", "completed"), ("streaming", "failed"), ("streaming", "cancelled"),
    ("streaming", "expired"),
)

_STATE_LIST = ", ".join(f"'{s}'" for s in STATES)

UPGRADE_SQL = f"""
CREATE TABLE run_allowed_transitions (
    from_state varchar(32) NOT NULL,
    to_state   varchar(32) NOT NULL,
    PRIMARY KEY (from_state, to_state)
);

-- Upgrade the baseline table in place (R-OPS-1): status enum -> lowercase VARCHAR with a
-- CHECK (R-STATE-2); every existing row becomes lifecycle_version 1, durability legacy.
ALTER TABLE runs RENAME COLUMN status TO state;
ALTER TABLE runs ALTER COLUMN state DROP DEFAULT;
ALTER TABLE runs ALTER COLUMN state TYPE varchar(32) USING lower(state::text);
DROP TYPE run_status;
ALTER TABLE runs RENAME COLUMN created_at TO accepted_at;
ALTER TABLE runs ALTER COLUMN accepted_at SET DEFAULT clock_timestamp();
ALTER TABLE runs
    ADD COLUMN lifecycle_version     smallint NOT NULL DEFAULT 1 CHECK (lifecycle_version IN (1, 2)),
    ADD COLUMN durability            varchar(16) NOT NULL DEFAULT 'legacy'
                                     CHECK (durability IN ('temporal', 'legacy')),
    ADD COLUMN row_version           bigint NOT NULL DEFAULT 1 CHECK (row_version >= 1),
    ADD COLUMN generation            integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
    ADD COLUMN owner_attempt         integer,
    ADD COLUMN request_json          jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    ADD COLUMN workflow_id           text,
    ADD COLUMN dispatch_confirmed_at timestamptz,
    ADD COLUMN stream_key            text,
    ADD COLUMN deadline_at           timestamptz,
    ADD COLUMN started_at            timestamptz,
    ADD COLUMN completed_at          timestamptz,
    ADD COLUMN checkpoint_step       integer NOT NULL DEFAULT 0,
    ADD COLUMN provider_failures     integer NOT NULL DEFAULT 0,
    ADD COLUMN error_code            text,
    ADD COLUMN usage                 jsonb NOT NULL DEFAULT '{{}}'::jsonb;
ALTER TABLE runs
    ADD COLUMN workspace_id          text NOT NULL DEFAULT 'default',
    -- the authorisation grant the run acts under; never projected (R-READ-3)
    ADD COLUMN grant_token           text;
-- stream keys from the server's CSPRNG (gen_random_uuid uses pg_strong_random)
UPDATE runs SET stream_key = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
                deadline_at = accepted_at + interval '1 hour',
                completed_at = CASE WHEN state IN ('completed', 'failed', 'cancelled')
                                    THEN updated_at END;
ALTER TABLE runs DROP COLUMN updated_at;
ALTER TABLE runs
    ALTER COLUMN stream_key SET NOT NULL,
    ALTER COLUMN deadline_at SET NOT NULL,
    ALTER COLUMN lifecycle_version SET DEFAULT 2,
    ALTER COLUMN durability SET DEFAULT 'temporal',
    ADD CONSTRAINT runs_state_check CHECK (
        state IN ({_STATE_LIST}) OR (lifecycle_version = 1 AND state = 'streaming'));
DROP INDEX runs_tenant;
CREATE INDEX runs_tenant_state ON runs (tenant_id, state);
CREATE INDEX runs_deadline_open ON runs (deadline_at)
    WHERE state NOT IN ('completed', 'failed', 'expired', 'cancelled');

CREATE TABLE run_checkpoints (
    run_id      uuid NOT NULL REFERENCES runs (run_id),
    step        integer NOT NULL CHECK (step >= 1),
    generation  integer NOT NULL,
    attempt     integer NOT NULL,
    row_version bigint NOT NULL,
    state_json  jsonb NOT NULL,
    answer      text,
    pending     jsonb,
    -- the database role that committed it: workers commit under their restricted role
    committed_by text NOT NULL DEFAULT current_user,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, step)
);

CREATE TABLE idempotency_records (
    tenant_id    text NOT NULL,
    principal_id text NOT NULL,
    route        text NOT NULL,
    key          text NOT NULL,
    fingerprint  text NOT NULL,
    run_id       uuid NOT NULL REFERENCES runs (run_id),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL while the first request with this key is still being answered (R-CREATE-2)
    completed_at timestamptz,
    PRIMARY KEY (tenant_id, principal_id, route, key)
);
CREATE INDEX idempotency_records_age ON idempotency_records (tenant_id, created_at);

CREATE TABLE run_transitions (
    id              bigserial PRIMARY KEY,
    run_id          uuid NOT NULL,
    tenant_id       text NOT NULL,
    row_version     bigint NOT NULL,
    old_state       varchar(32),
    new_state       varchar(32) NOT NULL,
    generation      integer NOT NULL,
    owner_attempt   integer,
    checkpoint_step integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX run_transitions_run ON run_transitions (run_id, id);

-- Decisions on pending tool approvals (R-APPROVAL-1), bound to the tenant, principal,
-- run and action version that raised them. One decision per approval: never changed.
CREATE TABLE approval_decisions (
    run_id         uuid NOT NULL REFERENCES runs (run_id),
    approval_id    text NOT NULL,
    tenant_id      text NOT NULL,
    principal_id   text NOT NULL,
    action_version text NOT NULL,
    approved       boolean NOT NULL,
    decided_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, approval_id)
);

-- One row per reconciler sweep of one tenant (R-OPS-3): operators' audit trail and the
-- qualification harness's evidence that no sweep took more than its limit.
CREATE TABLE reconciler_sweeps (
    id          bigserial PRIMARY KEY,
    reconciler  text NOT NULL,
    tenant_id   text NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    candidates  integer NOT NULL,
    expired     integer NOT NULL,
    dispatched  integer NOT NULL,
    errors      integer NOT NULL
);

-- The transition guard (R-STATE-1). Custom SQLSTATEs let writers tell a fenced write
-- (QG001 terminal, QG002 illegal transition, QG003 row_version, QG004 immutable column)
-- from any other error.
CREATE FUNCTION runs_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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
    RETURN NEW;
END;
$$;

CREATE TRIGGER runs_transition_guard BEFORE UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_transition_guard();

CREATE FUNCTION runs_forbid_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'runs are never deleted' USING ERRCODE = 'QG005';
END;
$$;
CREATE TRIGGER runs_forbid_delete BEFORE DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_forbid_delete();

CREATE FUNCTION runs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_transitions (run_id, tenant_id, row_version, old_state, new_state, generation,
                                 owner_attempt, checkpoint_step)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step);
    RETURN NULL;
END;
$$;
CREATE TRIGGER runs_record_transition AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_record_transition();
"""

DOWNGRADE_SQL = """
DROP TRIGGER runs_transition_guard ON runs;
DROP TRIGGER runs_forbid_delete ON runs;
DROP TRIGGER runs_record_transition ON runs;
DROP FUNCTION runs_transition_guard();
DROP FUNCTION runs_forbid_delete();
DROP FUNCTION runs_record_transition();
DROP TABLE approval_decisions;
DROP TABLE reconciler_sweeps;
DROP TABLE run_transitions;
DROP TABLE idempotency_records;
DROP TABLE run_checkpoints;
DROP TABLE run_allowed_transitions;
DROP INDEX runs_tenant_state;
DROP INDEX runs_deadline_open;
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
CREATE TYPE run_status AS ENUM ('QUEUED', 'STREAMING', 'COMPLETED', 'FAILED', 'CANCELLED');
ALTER TABLE runs ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
UPDATE runs SET updated_at = coalesce(completed_at, accepted_at);
-- Terminal version-2 states fold into the old enum: expired was reported as a failure.
ALTER TABLE runs ALTER COLUMN state TYPE run_status USING (CASE state
    WHEN 'accepted' THEN 'QUEUED' WHEN 'queued' THEN 'QUEUED'
    WHEN 'running' THEN 'STREAMING' WHEN 'streaming' THEN 'STREAMING'
    WHEN 'completed' THEN 'COMPLETED' WHEN 'cancelled' THEN 'CANCELLED'
    ELSE 'FAILED' END)::run_status;
ALTER TABLE runs RENAME COLUMN state TO status;
ALTER TABLE runs ALTER COLUMN status SET DEFAULT 'QUEUED';
ALTER TABLE runs RENAME COLUMN accepted_at TO created_at;
ALTER TABLE runs ALTER COLUMN created_at SET DEFAULT now();
ALTER TABLE runs
    DROP COLUMN lifecycle_version, DROP COLUMN durability, DROP COLUMN row_version,
    DROP COLUMN generation, DROP COLUMN owner_attempt, DROP COLUMN request_json,
    DROP COLUMN workflow_id, DROP COLUMN dispatch_confirmed_at, DROP COLUMN stream_key,
    DROP COLUMN deadline_at, DROP COLUMN started_at, DROP COLUMN completed_at,
    DROP COLUMN checkpoint_step, DROP COLUMN provider_failures, DROP COLUMN error_code,
    DROP COLUMN usage;
CREATE INDEX runs_tenant ON runs (tenant_id);
"""


# Authentication and tenant isolation (R-AUTH-1..4). API keys are stored hashed; the
# application reaches them only through a SECURITY DEFINER function. Row-level security
# keys every run table on the transaction's (or session's) `qimpl.tenant` setting; the
# application role `qimpl_app` is neither superuser nor BYPASSRLS. Login roles
# (qimpl_api, qimpl_worker, ...) are the deployment's: `CREATE ROLE qimpl_api LOGIN IN ROLE
# qimpl_app`.
SECURITY_SQL = """
CREATE TABLE api_keys (
    key_hash     text PRIMARY KEY,
    tenant_id    text NOT NULL,
    principal_id text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at   timestamptz
);
CREATE TABLE workspace_grants (
    tenant_id    text NOT NULL,
    principal_id text NOT NULL,
    workspace_id text NOT NULL,
    grant_token  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at   timestamptz,
    PRIMARY KEY (tenant_id, principal_id, workspace_id)
);

CREATE FUNCTION qimpl_authenticate(p_key_hash text)
RETURNS TABLE (tenant_id text, principal_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT k.tenant_id, k.principal_id FROM api_keys k
    WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL
$$;

-- Cross-tenant aggregates for operators' metrics (R-OPS-6): counts and ages only.
CREATE FUNCTION qimpl_run_stats()
RETURNS TABLE (tenant_id text, state varchar, runs bigint, oldest_s float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT r.tenant_id, r.state, count(*),
           extract(epoch FROM clock_timestamp() - min(r.accepted_at))::float8
    FROM runs r GROUP BY r.tenant_id, r.state
$$;

-- The tenant of a run whose stream key the caller holds (R-AUTH-3): NULL for any other key.
CREATE FUNCTION qimpl_stream_tenant(p_run_id uuid, p_stream_key text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT r.tenant_id FROM runs r WHERE r.run_id = p_run_id AND r.stream_key = p_stream_key
$$;

-- The tenant of a run, for version-1 activities whose input is a bare run id.
CREATE FUNCTION qimpl_tenant_of_run(p_run_id uuid) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT r.tenant_id FROM runs r WHERE r.run_id = p_run_id
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qimpl_app') THEN
        CREATE ROLE qimpl_app NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
END $$;

GRANT SELECT, INSERT, UPDATE ON runs, run_checkpoints, run_transitions, reconciler_sweeps
    TO qimpl_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO qimpl_app;
GRANT SELECT, INSERT ON approval_decisions TO qimpl_app;
GRANT SELECT ON run_allowed_transitions, workspace_grants TO qimpl_app;
GRANT USAGE ON SEQUENCE run_transitions_id_seq, reconciler_sweeps_id_seq TO qimpl_app;
REVOKE ALL ON FUNCTION qimpl_authenticate(text), qimpl_run_stats(), qimpl_tenant_of_run(uuid),
    qimpl_stream_tenant(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qimpl_authenticate(text), qimpl_run_stats(), qimpl_tenant_of_run(uuid),
    qimpl_stream_tenant(uuid, text) TO qimpl_app;

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_transitions ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_records ENABLE ROW LEVEL SECURITY;
ALTER TABLE reconciler_sweeps ENABLE ROW LEVEL SECURITY;
ALTER TABLE workspace_grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_checkpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE approval_decisions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON approval_decisions
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON runs
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON run_transitions
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON idempotency_records
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON reconciler_sweeps
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON workspace_grants
    USING (tenant_id = current_setting('qimpl.tenant', true));
-- A checkpoint belongs to the tenant of its run (the subquery is itself filtered).
CREATE POLICY tenant_isolation ON run_checkpoints
    USING (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = run_checkpoints.run_id))
    WITH CHECK (EXISTS (SELECT 1 FROM runs r WHERE r.run_id = run_checkpoints.run_id));
"""

SECURITY_DOWN_SQL = """
DROP FUNCTION qimpl_authenticate(text);
DROP FUNCTION qimpl_run_stats();
DROP FUNCTION qimpl_tenant_of_run(uuid);
DROP FUNCTION qimpl_stream_tenant(uuid, text);
DROP TABLE workspace_grants;
DROP TABLE api_keys;
DROP POLICY tenant_isolation ON runs;
ALTER TABLE runs DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON runs FROM qimpl_app;
ALTER TABLE runs DROP COLUMN workspace_id, DROP COLUMN grant_token;
"""


def upgrade() -> None:
    op.execute(UPGRADE_SQL)
    values = ", ".join(f"('{a}', '{b}')" for a, b in ALLOWED + LEGACY_ALLOWED)
    op.execute(f"INSERT INTO run_allowed_transitions (from_state, to_state) VALUES {values}")
    op.execute(SECURITY_SQL)


def downgrade() -> None:
    # R-OPS-2: refuse while any version-2 run is still live.
    op.execute(
        """
        DO $$
        BEGIN
            -- No run may be inserted or changed between this count and the schema change:
            -- the lock is held until the downgrade's transaction ends.
            LOCK TABLE runs IN EXCLUSIVE MODE;
            IF EXISTS (SELECT 1 FROM runs WHERE lifecycle_version = 2
                       AND state NOT IN ('completed', 'failed', 'expired', 'cancelled')) THEN
                RAISE EXCEPTION 'downgrade refused: % version-2 runs are not terminal; drain them (cancel or let them finish) first',
                    (SELECT count(*) FROM runs WHERE lifecycle_version = 2
                     AND state NOT IN ('completed', 'failed', 'expired', 'cancelled'));
            END IF;
            -- The keys and grants go with this revision: only when the operator said so
            -- (``migrate --downgrade REV --discard-keys`` sets the setting).
            IF coalesce(current_setting('qimpl.downgrade_discards_keys', true), '') <> 'on'
               AND (EXISTS (SELECT 1 FROM api_keys) OR EXISTS (SELECT 1 FROM workspace_grants)) THEN
                RAISE EXCEPTION 'downgrade refused: it drops % API keys and % workspace grants; pass --discard-keys to drop them',
                    (SELECT count(*) FROM api_keys), (SELECT count(*) FROM workspace_grants);
            END IF;
        END $$;
        """
    )
    op.execute(SECURITY_DOWN_SQL)
    op.execute(DOWNGRADE_SQL)
