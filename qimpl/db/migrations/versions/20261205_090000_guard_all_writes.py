"""The transition guard on every write of a run, and an owner guard on its checkpoints
(R-STATE-1, R-EXEC-3, R-EXEC-4, R-EXEC-7, R-AUTH-4).

Revision ID: 20261205_090000_guard_all_writes
Revises: 20261204_090000_owner_task_token
Create Date: 2026-12-05 09:00:00

Until this revision the guard ran on ``UPDATE`` only and compared with ``<>`` and ``<``,
which are blind to NULL. Shown as the worker role: an ``INSERT`` straight into
``completed`` at ``row_version`` 7, ``owner_attempt`` 5 -> NULL -> 1, a ``generation``
jump of 40 and a changed ``prompt`` or ``stream_key`` were all accepted; so was a
``run_checkpoints`` row for step 99 from a session that owned nothing, which the next
attempt would have restored, with a ``committed_by`` of the writer's choosing.

This revision writes both guards whole (the head schema, with every function, is in
``qimpl/db/schema.sql``):

- ``runs_transition_guard`` now runs ``BEFORE INSERT OR UPDATE``. An ``INSERT`` by any
  role but a superuser (which could disable the trigger anyway; the harness seeds runs in
  arbitrary states that way) must be a new run: ``accepted``, ``row_version`` 1,
  ``generation`` 1, no owner, no token, nothing started, counted or checkpointed
  (``QG014``). On ``UPDATE`` every comparison is NULL-safe; ``generation`` moves by zero
  or one (``QG004``); ``agent_id``, ``prompt``, ``stream_key``, ``workspace_id`` and
  ``durability`` join the immutable columns (``QG004``); within a generation
  ``owner_attempt`` may not go back, nor to NULL (``QG008``).
- ``run_checkpoints_guard`` (``BEFORE INSERT``; checkpoints are never updated or
  deleted, ``QG015``): a checkpoint is accepted only from the run's current owner, in
  the transaction of its fenced write: the run is ``running`` in that generation, owned
  by that attempt, at exactly that ``row_version``, with ``checkpoint_step`` equal to the
  row's step, and the audit trail holds that ``row_version``'s write in this very
  transaction (``QG015``). ``committed_by`` is the session's role, whatever the writer
  sent.
"""

from alembic import op

revision = "20261205_090000_guard_all_writes"
down_revision = "20261204_090000_owner_task_token"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: The transition guard as 20261201_100000_hardening left it (restored by the downgrade).
PREVIOUS_GUARD_SQL = """
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

GUARD_SQL = f"""
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

CHECKPOINT_GUARD_SQL = f"""
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
REVOKE ALL ON FUNCTION public.run_checkpoints_guard() FROM PUBLIC;
"""

UP_SQL = GUARD_SQL + """
DROP TRIGGER runs_transition_guard ON public.runs;
CREATE TRIGGER runs_transition_guard BEFORE INSERT OR UPDATE ON public.runs
    FOR EACH ROW EXECUTE FUNCTION public.runs_transition_guard();
""" + CHECKPOINT_GUARD_SQL + """
CREATE TRIGGER run_checkpoints_guard BEFORE INSERT OR UPDATE OR DELETE ON public.run_checkpoints
    FOR EACH ROW EXECUTE FUNCTION public.run_checkpoints_guard();
"""

DOWN_SQL = """
DROP TRIGGER run_checkpoints_guard ON public.run_checkpoints;
DROP FUNCTION public.run_checkpoints_guard();
DROP TRIGGER runs_transition_guard ON public.runs;
CREATE TRIGGER runs_transition_guard BEFORE UPDATE ON public.runs
    FOR EACH ROW EXECUTE FUNCTION public.runs_transition_guard();
""" + PREVIOUS_GUARD_SQL


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
