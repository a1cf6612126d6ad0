"""The last counted failure's safe code on the run, in its failure events, and the
terminal event of the stream equal to the run record (issue 25, items 6 and 7; R-EXEC-6,
R-EVENT-1, R-READ-1).

Revision ID: 20261207_110000_failure_codes
Revises: 20261207_100000_unknown_tokens
Create Date: 2026-12-07 11:00:00

A run that failed ``agent_attempts_exhausted`` after its model server went away said
nothing more: the cause (``provider_unreachable``) was only in the worker's log. The
owner's failure count now writes the failure's safe kind code (``qimpl.errors``: never a
provider's text) into ``runs.last_failure_code`` in the same fenced UPDATE, and
``qimpl_record_events`` (written whole) puts it in that write's ``failure`` event as
``code``. The API shows it on the run record and in the operator's listing.
"""

from alembic import op

revision = "20261207_110000_failure_codes"
down_revision = "20261207_100000_unknown_tokens"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"



def _record_events(codes: bool) -> str:
    """``qimpl_record_events`` whole: with ``codes``, this revision's (a failure event
    carries the run's ``last_failure_code``); without, the previous revision's."""
    failure = ("jsonb_build_object('attempt', t.owner_attempt,\n"
               "                                                       'code', (SELECT r.last_failure_code"
               " FROM public.runs r WHERE r.run_id = t.run_id))" if codes
               else "jsonb_build_object('attempt', t.owner_attempt)")
    running = f"""
        IF NOT FOUND THEN
            SELECT p.owner_attempt INTO previous FROM public.run_transitions p
            WHERE p.run_id = t.run_id AND p.row_version = t.row_version - 1;
            IF NOT EXISTS (SELECT 1 FROM public.run_checkpoints c
                           WHERE c.run_id = t.run_id AND c.row_version = t.row_version) THEN
                IF previous IS DISTINCT FROM t.owner_attempt THEN
                    kind := 'claim';
                    data := data || jsonb_build_object('attempt', t.owner_attempt,
                                                       'previous_attempt', previous);
                ELSE
                    kind := 'failure';
                    data := data || {failure};
                END IF;
            END IF;
        END IF;"""
    return f"""
CREATE OR REPLACE FUNCTION public.qimpl_record_events(t public.run_transitions) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    kind text;
    data jsonb;
    ti record;
    answer text;
    previous integer;
BEGIN
    kind := CASE WHEN t.new_state IN ('completed', 'failed', 'expired', 'cancelled') THEN 'terminal'
                 WHEN t.old_state = 'running' AND t.new_state = 'running' THEN 'checkpoint'
                 ELSE 'state' END;
    data := jsonb_build_object('run_id', t.run_id::text, 'row_version', t.row_version,
                               'state', t.new_state, 'previous', t.old_state,
                               'generation', t.generation, 'checkpoint_step', t.checkpoint_step);
    IF kind = 'checkpoint' THEN
        SELECT i.call_id, i.tool, i.status, i.outcome_row_version INTO ti
        FROM public.tool_invocations i
        WHERE i.run_id = t.run_id
          AND (i.intent_row_version = t.row_version OR i.outcome_row_version = t.row_version)
        ORDER BY i.call_id LIMIT 1;
        IF FOUND THEN
            data := data || jsonb_build_object('call_id', ti.call_id, 'tool', ti.tool);
            IF ti.outcome_row_version = t.row_version THEN
                kind := 'tool_result';
                data := data || jsonb_build_object('status', ti.status);
            ELSE
                kind := 'tool_call';
            END IF;
        END IF;{running}
    END IF;
    INSERT INTO public.run_events (run_id, tenant_id, kind, row_version, data)
    VALUES (t.run_id, t.tenant_id, kind, t.row_version, data);
    IF kind = 'checkpoint' THEN
        SELECT c.answer INTO answer FROM public.run_checkpoints c
        WHERE c.run_id = t.run_id AND c.row_version = t.row_version AND c.answer IS NOT NULL;
        IF FOUND THEN
            INSERT INTO public.run_events (run_id, tenant_id, kind, row_version, data)
            VALUES (t.run_id, t.tenant_id, 'output', t.row_version,
                    jsonb_build_object('run_id', t.run_id::text, 'row_version', t.row_version,
                                       'step', t.checkpoint_step, 'text', answer));
        END IF;
    END IF;
END;
$$;
"""


def upgrade() -> None:
    op.execute("ALTER TABLE public.runs ADD COLUMN last_failure_code text;\n" + _record_events(codes=True))


def downgrade() -> None:
    op.execute(_record_events(codes=False) + "ALTER TABLE public.runs DROP COLUMN last_failure_code;\n")
