"""The tool invocation journal (R-TOOL-1..5, R-RESUME-3) and operator credentials (R-OPS-7).

Revision ID: 20261130_160000_tool_journal
Revises: 20261130_120000_deadline_fence
Create Date: 2026-11-30 16:00:00

``tool_invocations`` holds one row per tool call of a durable run, keyed by the call's
journal id. The owner inserts it as an ``intent`` (instrumented and uninstrumented tools)
before the side effect, or ``requested`` (developer-hosted tools), and settles it after:
``succeeded`` or ``failed`` by the worker, ``rejected``/``denied`` when nothing ran,
``succeeded``/``not_executed``/``compensated`` by an operator's reconciliation, or the
client's result for a developer-hosted call. The database enforces the journal's rules:

- ``QG009``: a journal write by the worker must come from the run's owner in the same
  transaction as its fenced write: the run is ``running`` in that generation, owned by
  that attempt, at exactly the recorded ``row_version``. Operators and clients settle
  only parked (``awaiting_input``) or ended runs.
- ``QG011``: a settled invocation never changes again, and what was asked (tool,
  arguments, digest, step, generation) never changes; rows are never deleted.
- ``QG010`` (in the transition guard): a run does not leave ``awaiting_input`` for a new
  generation while an invocation is unsettled (``intent`` or ``requested``): the
  journal is reconciled first (R-RESUME-3, R-TOOL-4).

``run_checkpoints.tool_calls`` stores the calls a step asked for, so a retried attempt
restores the pre-tool checkpoint and meets the same call ids (R-TOOL-2).

``api_keys.role`` marks operator keys; ``qimpl_authenticate_operator`` answers only for
them (the reconciliation route is an operator surface, R-OPS-7).
"""

from alembic import op

revision = "20261130_160000_tool_journal"
down_revision = "20261130_120000_deadline_fence"
branch_labels = None
depends_on = None


#: The guard as 20261130_120000_deadline_fence left it (restored by the downgrade).
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
    RETURN NEW;
END;
$$;
"""

#: The guard with this revision's refusal QG010 (unsettled tool invocations) last.
GUARD_SQL = """
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

JOURNAL_SQL = """
CREATE TABLE tool_invocations (
    run_id              uuid NOT NULL REFERENCES runs (run_id),
    call_id             text NOT NULL,
    tenant_id           text NOT NULL,
    generation          integer NOT NULL,
    step                integer NOT NULL CHECK (step >= 1),
    position            integer NOT NULL CHECK (position >= 0),
    tool                text NOT NULL,
    kind                text NOT NULL
        CHECK (kind IN ('instrumented', 'uninstrumented', 'developer_hosted')),
    provider_call_id    text,
    arguments           jsonb NOT NULL,
    arguments_digest    text NOT NULL,
    approval_id         text,
    status              text NOT NULL CHECK (status IN ('intent', 'requested', 'succeeded',
        'failed', 'rejected', 'denied', 'not_executed', 'compensated')),
    result              jsonb,
    intent_attempt      integer,
    intent_row_version  bigint,
    outcome_row_version bigint,
    intent_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    outcome_at          timestamptz,
    -- 'worker', 'client:<principal>' or 'operator:<principal>'
    settled_by          text,
    resolution_note     text,
    committed_by        text NOT NULL DEFAULT current_user,
    PRIMARY KEY (run_id, call_id)
);
CREATE INDEX tool_invocations_unsettled ON tool_invocations (run_id)
    WHERE status IN ('intent', 'requested');

CREATE FUNCTION tool_invocations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER tool_invocations_guard BEFORE INSERT OR UPDATE OR DELETE ON tool_invocations
    FOR EACH ROW EXECUTE FUNCTION tool_invocations_guard();

ALTER TABLE run_checkpoints ADD COLUMN tool_calls jsonb;

GRANT SELECT, INSERT, UPDATE ON tool_invocations TO qimpl_app;
ALTER TABLE tool_invocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tool_invocations
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));

ALTER TABLE api_keys ADD COLUMN role text NOT NULL DEFAULT 'client'
    CHECK (role IN ('client', 'operator'));
CREATE FUNCTION qimpl_authenticate_operator(p_key_hash text)
RETURNS TABLE (tenant_id text, principal_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS $$
    SELECT k.tenant_id, k.principal_id FROM api_keys k
    WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL AND k.role = 'operator'
$$;
REVOKE ALL ON FUNCTION qimpl_authenticate_operator(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION qimpl_authenticate_operator(text) TO qimpl_app;
"""


def upgrade() -> None:
    op.execute(JOURNAL_SQL)
    op.execute(GUARD_SQL)


#: R-OPS-2: the journal (and QG010 with it) may not be dropped under a run that still
#: needs it: a live run with journaled calls would replay its side effects, and a run
#: parked on an unknown outcome could be resumed without its reconciliation.
REFUSE_DOWN_SQL = """
DO $$
DECLARE
    live text;
BEGIN
    LOCK TABLE runs IN EXCLUSIVE MODE;
    LOCK TABLE tool_invocations IN EXCLUSIVE MODE;
    SELECT string_agg(DISTINCT r.run_id::text, ', ') INTO live
    FROM runs r JOIN tool_invocations t ON t.run_id = r.run_id
    WHERE r.state NOT IN ('completed', 'failed', 'expired', 'cancelled');
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'downgrade refused: runs % are not terminal and have journaled tool calls; settle and end them first', live;
    END IF;
END $$;
"""


def downgrade() -> None:
    op.execute(REFUSE_DOWN_SQL)
    op.execute(PREVIOUS_GUARD_SQL)
    op.execute("DROP FUNCTION qimpl_authenticate_operator(text)")
    op.execute("ALTER TABLE api_keys DROP COLUMN role")
    op.execute("ALTER TABLE run_checkpoints DROP COLUMN tool_calls")
    op.execute("DROP TABLE tool_invocations")
    op.execute("DROP FUNCTION tool_invocations_guard()")
