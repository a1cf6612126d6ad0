"""Checkpoints store the state's delta since the previous one (issue 22, item 5; R-EXEC-3).

Revision ID: 20261208_090000_state_deltas
Revises: 20261207_120000_audit_deletes
Create Date: 2026-12-08 09:00:00

``run_checkpoints.state_delta`` (``qimpl.state_delta``: top-level ``set``, ``unset`` and
``append``) holds what changed since the run's previous checkpoint, and ``state_json`` is
then NULL: exactly one of them is set. A run's first checkpoint, and any whose delta
would be no smaller than its state, hold the whole state. Storage grows with what the
state gains per step, not with the state's size times the steps.

A worker from before this revision reads only the latest checkpoint's ``state_json``:
finding NULL its attempt fails and is retried (never run on a wrong state). Upgrade every
worker before the first new one checkpoints (docs/operations.md, "Rollout order").

Downgrade folds every delta back into a whole ``state_json`` (the same fold, in
PL/pgSQL), then drops the column.
"""

from alembic import op

revision = "20261208_090000_state_deltas"
down_revision = "20261207_120000_audit_deletes"
branch_labels = None
depends_on = None


UPGRADE = """
ALTER TABLE public.run_checkpoints ADD COLUMN state_delta jsonb;
ALTER TABLE public.run_checkpoints ALTER COLUMN state_json DROP NOT NULL;
ALTER TABLE public.run_checkpoints ADD CONSTRAINT run_checkpoints_state_check
    CHECK ((state_json IS NULL) <> (state_delta IS NULL));
"""

# Checkpoints are immutable to every role (QG015) and tenant-scoped (forced row-level
# security); the migration, as the table's owner, rewrites every tenant's with the guard
# disabled and the policy not forced, both only within its own transaction.
DOWNGRADE = """
ALTER TABLE public.run_checkpoints NO FORCE ROW LEVEL SECURITY;
ALTER TABLE public.run_checkpoints DISABLE TRIGGER run_checkpoints_guard;
DO $$
DECLARE
    c record;
    cur_run uuid := NULL;
    state jsonb;
    k text;
    tail jsonb;
BEGIN
    FOR c IN SELECT run_id, step, state_json, state_delta FROM public.run_checkpoints
             ORDER BY run_id, step LOOP
        IF cur_run IS DISTINCT FROM c.run_id THEN
            cur_run := c.run_id;
            state := NULL;
        END IF;
        IF c.state_json IS NOT NULL THEN
            state := c.state_json;
            CONTINUE;
        END IF;
        IF state IS NULL THEN
            RAISE EXCEPTION 'checkpoint %/% is a delta without a whole state before it', c.run_id, c.step;
        END IF;
        state := state - ARRAY(SELECT jsonb_array_elements_text(COALESCE(c.state_delta->'unset', '[]')));
        state := state || COALESCE(c.state_delta->'set', '{}');
        FOR k, tail IN SELECT * FROM jsonb_each(COALESCE(c.state_delta->'append', '{}')) LOOP
            IF jsonb_typeof(state->k) = 'array' AND jsonb_typeof(tail) = 'array' THEN
                state := jsonb_set(state, ARRAY[k], (state->k) || tail);
            ELSIF jsonb_typeof(state->k) = 'string' AND jsonb_typeof(tail) = 'string' THEN
                state := jsonb_set(state, ARRAY[k], to_jsonb((state->>k) || (tail#>>'{}')));
            ELSE
                RAISE EXCEPTION 'checkpoint %/% appends to %, not a list or a string', c.run_id, c.step, k;
            END IF;
        END LOOP;
        UPDATE public.run_checkpoints SET state_json = state, state_delta = NULL
            WHERE run_id = c.run_id AND step = c.step;
    END LOOP;
END
$$;
ALTER TABLE public.run_checkpoints ENABLE TRIGGER run_checkpoints_guard;
ALTER TABLE public.run_checkpoints FORCE ROW LEVEL SECURITY;
ALTER TABLE public.run_checkpoints DROP CONSTRAINT run_checkpoints_state_check;
ALTER TABLE public.run_checkpoints ALTER COLUMN state_json SET NOT NULL;
ALTER TABLE public.run_checkpoints DROP COLUMN state_delta;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
