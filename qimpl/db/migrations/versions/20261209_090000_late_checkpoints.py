"""A checkpoint is refused once its run's deadline has passed (R-EXEC-8): ``QG006`` from the
checkpoint guard too, and the row stamped at that check.

Revision ID: 20261209_090000_late_checkpoints
Revises: 20261208_090000_state_deltas
Create Date: 2026-12-09 09:00:00

An owner checkpoints in one transaction but two statements: the fenced ``UPDATE`` of the
run, which the transition guard checks against ``deadline_at`` (``QG006``), then the
``INSERT`` of the checkpoint row, a round trip later. Under load the round trip crossed
the deadline: ``qualify run`` (``expiry-mid-run``, 2026-12-03) recorded a checkpoint
stamped 0.000 s after its run's deadline, which the run's guard had let through an
instant before. ``run_checkpoints_guard`` now stamps ``created_at`` itself, at its own
check, and refuses a row stamped at or after the deadline with ``QG006`` (the owner's
``DeadlinePassed``: the attempt expires the run, as for any write past the deadline).
"""

from alembic import op

revision = "20261209_090000_late_checkpoints"
down_revision = "20261208_090000_state_deltas"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"

#: The checkpoint guard as 20261205_090000_guard_all_writes wrote it (the downgrade).
PREVIOUS_GUARD_SQL = f"""
CREATE OR REPLACE FUNCTION public.run_checkpoints_guard() RETURNS trigger LANGUAGE plpgsql
    {SAFE_PATH} AS $$
DECLARE
    r public.runs%ROWTYPE;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'checkpoint %/% may not be changed or deleted', OLD.run_id, OLD.step
            USING ERRCODE = 'QG015';
    END IF;
    SELECT * INTO r FROM public.runs WHERE run_id = NEW.run_id;
    IF r.state IS DISTINCT FROM 'running' OR r.generation IS DISTINCT FROM NEW.generation
       OR r.owner_attempt IS DISTINCT FROM NEW.attempt
       OR r.row_version IS DISTINCT FROM NEW.row_version
       OR r.checkpoint_step IS DISTINCT FROM NEW.step
       OR NOT EXISTS (SELECT 1 FROM public.run_transitions t
                      WHERE t.run_id = NEW.run_id AND t.row_version = NEW.row_version
                        AND t.xact_id = pg_catalog.pg_current_xact_id()) THEN
        RAISE EXCEPTION 'checkpoint % of run %: not its owner''s fenced write (run % g% a% v% step %)',
            NEW.step, NEW.run_id, r.state, r.generation, r.owner_attempt, r.row_version,
            r.checkpoint_step USING ERRCODE = 'QG015';
    END IF;
    NEW.committed_by := current_user;
    RETURN NEW;
END;
$$;
"""

#: The checkpoint guard with the deadline refusal after the owner's.
GUARD_SQL = f"""
CREATE OR REPLACE FUNCTION public.run_checkpoints_guard() RETURNS trigger LANGUAGE plpgsql
    {SAFE_PATH} AS $$
DECLARE
    r public.runs%ROWTYPE;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'checkpoint %/% may not be changed or deleted', OLD.run_id, OLD.step
            USING ERRCODE = 'QG015';
    END IF;
    SELECT * INTO r FROM public.runs WHERE run_id = NEW.run_id;
    IF r.state IS DISTINCT FROM 'running' OR r.generation IS DISTINCT FROM NEW.generation
       OR r.owner_attempt IS DISTINCT FROM NEW.attempt
       OR r.row_version IS DISTINCT FROM NEW.row_version
       OR r.checkpoint_step IS DISTINCT FROM NEW.step
       OR NOT EXISTS (SELECT 1 FROM public.run_transitions t
                      WHERE t.run_id = NEW.run_id AND t.row_version = NEW.row_version
                        AND t.xact_id = pg_catalog.pg_current_xact_id()) THEN
        RAISE EXCEPTION 'checkpoint % of run %: not its owner''s fenced write (run % g% a% v% step %)',
            NEW.step, NEW.run_id, r.state, r.generation, r.owner_attempt, r.row_version,
            r.checkpoint_step USING ERRCODE = 'QG015';
    END IF;
    -- The row's time is the time of this check: a checkpoint is stamped before its run's
    -- deadline or not written at all (the run's own guard checked an earlier instant).
    NEW.created_at := pg_catalog.clock_timestamp();
    IF r.lifecycle_version = 2 AND NEW.created_at >= r.deadline_at THEN
        RAISE EXCEPTION 'checkpoint % of run %: deadline % passed; the run may only end',
            NEW.step, NEW.run_id, r.deadline_at USING ERRCODE = 'QG006';
    END IF;
    NEW.committed_by := current_user;
    RETURN NEW;
END;
$$;
"""

def upgrade() -> None:
    op.execute(GUARD_SQL)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD_SQL)
