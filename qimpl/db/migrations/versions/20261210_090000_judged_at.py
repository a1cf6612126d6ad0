"""A run's transition is stamped at the instant its guard judged it (R-EXEC-8, R-EXEC-12):
``runs.updated_at``, and the ``at`` of its ``run_transitions`` record.

Revision ID: 20261210_090000_judged_at
Revises: 20261209_090000_late_checkpoints
Create Date: 2026-12-10 09:00:00

The transition guard (``BEFORE``) compared ``deadline_at`` with ``clock_timestamp()``,
and the audit trigger (``AFTER``, run at the end of the statement) stamped the record
with a later ``clock_timestamp()``. Under load the two instants straddled the deadline:
CI's ``qualify run`` (``resume-at-the-deadline``, 2026-12-05) recorded ``queued ->
running`` 0.002 s after its run's deadline, a transition the guard had let through an
instant before it; the reverse gap can record an ``expired`` its guard judged on time
as one before the deadline. The guard now reads the clock once, judges ``QG006`` and
``QG007`` at that instant, and writes it into ``runs.updated_at`` (whatever the writer
sent); the audit trigger records that instant as the transition's ``at``. A row last
written before this revision has ``updated_at`` NULL (no guess is made for it), and its
next write stamps it.
"""

from alembic import op

revision = "20261210_090000_judged_at"
down_revision = "20261209_090000_late_checkpoints"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"

#: The transition guard as 20261205_090000_guard_all_writes wrote it (the downgrade).
PREVIOUS_GUARD_SQL = f"""
CREATE OR REPLACE FUNCTION public.runs_transition_guard() RETURNS trigger LANGUAGE plpgsql
    {SAFE_PATH} AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF pg_catalog.current_setting('is_superuser') <> 'on' AND (
               NEW.state IS DISTINCT FROM 'accepted' OR NEW.row_version IS DISTINCT FROM 1
               OR NEW.generation IS DISTINCT FROM 1 OR NEW.owner_attempt IS NOT NULL
               OR NEW.owner_task_token IS NOT NULL OR NEW.started_at IS NOT NULL
               OR NEW.completed_at IS NOT NULL OR NEW.checkpoint_step IS DISTINCT FROM 0
               OR NEW.provider_failures IS DISTINCT FROM 0 OR NEW.dispatch_confirmed_at IS NOT NULL
               OR NEW.result_json IS NOT NULL OR NEW.error_code IS NOT NULL) THEN
            RAISE EXCEPTION 'run %: a new run is accepted, at row_version 1, generation 1, with no owner',
                NEW.run_id USING ERRCODE = 'QG014';
        END IF;
        RETURN NEW;
    END IF;
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
    IF NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.principal_id IS DISTINCT FROM OLD.principal_id
       OR NEW.agent_id IS DISTINCT FROM OLD.agent_id OR NEW.prompt IS DISTINCT FROM OLD.prompt
       OR NEW.stream_key IS DISTINCT FROM OLD.stream_key
       OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
       OR NEW.durability IS DISTINCT FROM OLD.durability
       OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at
       OR NEW.deadline_at IS DISTINCT FROM OLD.deadline_at
       OR NEW.lifecycle_version IS DISTINCT FROM OLD.lifecycle_version
       OR NEW.generation IS NULL OR NEW.generation NOT IN (OLD.generation, OLD.generation + 1) THEN
        RAISE EXCEPTION 'run %: identity, request, deadline are immutable; generation steps by one',
            OLD.run_id USING ERRCODE = 'QG004';
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
    IF NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL
       AND (NEW.owner_attempt IS NULL OR NEW.owner_attempt < OLD.owner_attempt) THEN
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

#: The transition guard judging, and stamping, one instant.
GUARD_SQL = f"""
CREATE OR REPLACE FUNCTION public.runs_transition_guard() RETURNS trigger LANGUAGE plpgsql
    {SAFE_PATH} AS $$
DECLARE
    -- One instant for the whole judgement: the deadline is compared with it and the row
    -- is stamped with it (``updated_at``, the time its transition record carries).
    v_now timestamptz := pg_catalog.clock_timestamp();
BEGIN
    NEW.updated_at := v_now;
    IF TG_OP = 'INSERT' THEN
        IF pg_catalog.current_setting('is_superuser') <> 'on' AND (
               NEW.state IS DISTINCT FROM 'accepted' OR NEW.row_version IS DISTINCT FROM 1
               OR NEW.generation IS DISTINCT FROM 1 OR NEW.owner_attempt IS NOT NULL
               OR NEW.owner_task_token IS NOT NULL OR NEW.started_at IS NOT NULL
               OR NEW.completed_at IS NOT NULL OR NEW.checkpoint_step IS DISTINCT FROM 0
               OR NEW.provider_failures IS DISTINCT FROM 0 OR NEW.dispatch_confirmed_at IS NOT NULL
               OR NEW.result_json IS NOT NULL OR NEW.error_code IS NOT NULL) THEN
            RAISE EXCEPTION 'run %: a new run is accepted, at row_version 1, generation 1, with no owner',
                NEW.run_id USING ERRCODE = 'QG014';
        END IF;
        RETURN NEW;
    END IF;
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
    IF NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.principal_id IS DISTINCT FROM OLD.principal_id
       OR NEW.agent_id IS DISTINCT FROM OLD.agent_id OR NEW.prompt IS DISTINCT FROM OLD.prompt
       OR NEW.stream_key IS DISTINCT FROM OLD.stream_key
       OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
       OR NEW.durability IS DISTINCT FROM OLD.durability
       OR NEW.accepted_at IS DISTINCT FROM OLD.accepted_at
       OR NEW.deadline_at IS DISTINCT FROM OLD.deadline_at
       OR NEW.lifecycle_version IS DISTINCT FROM OLD.lifecycle_version
       OR NEW.generation IS NULL OR NEW.generation NOT IN (OLD.generation, OLD.generation + 1) THEN
        RAISE EXCEPTION 'run %: identity, request, deadline are immutable; generation steps by one',
            OLD.run_id USING ERRCODE = 'QG004';
    END IF;
    IF NEW.state = 'expired' AND v_now < OLD.deadline_at THEN
        RAISE EXCEPTION 'run %: expired before its deadline (% < %)',
            OLD.run_id, v_now, OLD.deadline_at
            USING ERRCODE = 'QG007';
    END IF;
    IF OLD.lifecycle_version = 2 AND v_now >= OLD.deadline_at
       AND NEW.state NOT IN ('expired', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'run %: deadline % passed; it may only end', OLD.run_id, OLD.deadline_at
            USING ERRCODE = 'QG006';
    END IF;
    IF NEW.generation = OLD.generation AND OLD.owner_attempt IS NOT NULL
       AND (NEW.owner_attempt IS NULL OR NEW.owner_attempt < OLD.owner_attempt) THEN
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

#: The audit trigger as 20261201_120000_writer_identity wrote it (the downgrade).
PREVIOUS_RECORDER_SQL = f"""
CREATE OR REPLACE FUNCTION public.runs_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
BEGIN
    INSERT INTO public.run_transitions (run_id, tenant_id, row_version, old_state, new_state,
                                        generation, owner_attempt, checkpoint_step,
                                        writer_pid, writer_role, writer_token, writer_lock)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step,
            pg_catalog.pg_backend_pid(), session_user,
            nullif(pg_catalog.current_setting('qimpl.owner', true), ''),
            EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
          AND l.objsubid = 1
          AND ((l.classid::int8 << 32) | l.objid::int8)
              = pg_catalog.hashtextextended('qimpl-run:' || NEW.run_id::text, 0)));
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.runs_record_transition() FROM PUBLIC;
"""

#: The audit trigger recording the guard's instant.
RECORDER_SQL = f"""
CREATE OR REPLACE FUNCTION public.runs_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
BEGIN
    INSERT INTO public.run_transitions (run_id, tenant_id, row_version, old_state, new_state,
                                        generation, owner_attempt, checkpoint_step,
                                        writer_pid, writer_role, writer_token, writer_lock, at)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step,
            pg_catalog.pg_backend_pid(), session_user,
            nullif(pg_catalog.current_setting('qimpl.owner', true), ''),
            EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
          AND l.objsubid = 1
          AND ((l.classid::int8 << 32) | l.objid::int8)
              = pg_catalog.hashtextextended('qimpl-run:' || NEW.run_id::text, 0)),
            coalesce(NEW.updated_at, pg_catalog.clock_timestamp()));
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.runs_record_transition() FROM PUBLIC;
"""


def upgrade() -> None:
    op.execute("ALTER TABLE public.runs ADD COLUMN updated_at timestamptz;"
               "\nCOMMENT ON COLUMN public.runs.updated_at IS 'the database clock at which the"
               " transition guard judged the row''s last write (NULL: last written before"
               " 20261210_090000_judged_at)';")
    op.execute(GUARD_SQL)
    op.execute(RECORDER_SQL)


def downgrade() -> None:
    op.execute(PREVIOUS_RECORDER_SQL)
    op.execute(PREVIOUS_GUARD_SQL)
    op.execute("ALTER TABLE public.runs DROP COLUMN updated_at;")
