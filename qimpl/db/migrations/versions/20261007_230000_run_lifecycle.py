"""Run lifecycle v2: runs, checkpoints, idempotency records, transition guard and audit.

Revision ID: 20261007_230000_run_lifecycle
Revises:
Create Date: 2026-10-07 23:00:00

Implements R-STATE-1 (the guard trigger, driven by ``run_allowed_transitions``),
R-STATE-2 (lowercase VARCHAR states with a CHECK), R-CREATE-4 (runs, idempotency
records, dispatch identity) and R-EXEC-3 (checkpoints). Every insert and update of a
run is recorded by the database itself in ``run_transitions`` (the history that the
qualification checkers read).
"""

from alembic import op

revision = "20261007_230000_run_lifecycle"
down_revision = None
branch_labels = None
depends_on = None

STATES = (
    "accepted", "queued", "running", "awaiting_input", "awaiting_approval",
    "completed", "failed", "expired", "cancelled",
)

# Mirrors qimpl.lifecycle.TRANSITIONS; tests/unit/test_lifecycle_sql.py keeps them equal.
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

_STATE_LIST = ", ".join(f"'{s}'" for s in STATES)

UPGRADE_SQL = f"""
CREATE TABLE run_allowed_transitions (
    from_state varchar(32) NOT NULL,
    to_state   varchar(32) NOT NULL,
    PRIMARY KEY (from_state, to_state)
);

CREATE TABLE runs (
    run_id                uuid PRIMARY KEY,
    tenant_id             text NOT NULL,
    principal_id          text NOT NULL,
    agent_id              text NOT NULL,
    state                 varchar(32) NOT NULL CHECK (state IN ({_STATE_LIST})),
    lifecycle_version     smallint NOT NULL DEFAULT 2 CHECK (lifecycle_version IN (1, 2)),
    durability            varchar(16) NOT NULL DEFAULT 'temporal'
                          CHECK (durability IN ('temporal', 'legacy')),
    row_version           bigint NOT NULL DEFAULT 1 CHECK (row_version >= 1),
    generation            integer NOT NULL DEFAULT 1 CHECK (generation >= 1),
    owner_attempt         integer,
    prompt                text NOT NULL,
    request_json          jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    workflow_id           text,
    dispatch_confirmed_at timestamptz,
    stream_key            text NOT NULL,
    deadline_at           timestamptz NOT NULL,
    accepted_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at            timestamptz,
    completed_at          timestamptz,
    checkpoint_step       integer NOT NULL DEFAULT 0,
    provider_failures     integer NOT NULL DEFAULT 0,
    result_json           jsonb,
    error_code            text,
    error_message         text,
    usage                 jsonb NOT NULL DEFAULT '{{}}'::jsonb
);
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
    PRIMARY KEY (tenant_id, principal_id, route, key)
);

CREATE TABLE run_transitions (
    id              bigserial PRIMARY KEY,
    run_id          uuid NOT NULL,
    row_version     bigint NOT NULL,
    old_state       varchar(32),
    new_state       varchar(32) NOT NULL,
    generation      integer NOT NULL,
    owner_attempt   integer,
    checkpoint_step integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX run_transitions_run ON run_transitions (run_id, id);

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
    INSERT INTO run_transitions (run_id, row_version, old_state, new_state, generation,
                                 owner_attempt, checkpoint_step)
    VALUES (NEW.run_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step);
    RETURN NULL;
END;
$$;
CREATE TRIGGER runs_record_transition AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_record_transition();
"""

DOWNGRADE_SQL = """
DROP TABLE run_transitions;
DROP TABLE idempotency_records;
DROP TABLE run_checkpoints;
DROP TABLE runs;
DROP TABLE run_allowed_transitions;
DROP FUNCTION runs_transition_guard();
DROP FUNCTION runs_forbid_delete();
DROP FUNCTION runs_record_transition();
"""


def upgrade() -> None:
    op.execute(UPGRADE_SQL)
    values = ", ".join(f"('{a}', '{b}')" for a, b in ALLOWED)
    op.execute(f"INSERT INTO run_allowed_transitions (from_state, to_state) VALUES {values}")


def downgrade() -> None:
    # R-OPS-2: refuse while any version-2 run is still live.
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM runs WHERE lifecycle_version = 2
                       AND state NOT IN ('completed', 'failed', 'expired', 'cancelled')) THEN
                RAISE EXCEPTION 'downgrade refused: version-2 runs are not terminal; '
                                'drain them (cancel or wait) first';
            END IF;
        END $$;
        """
    )
    op.execute(DOWNGRADE_SQL)
