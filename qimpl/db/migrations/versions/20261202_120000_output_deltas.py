"""Output deltas in the run's event journal (R-EVENT-1).

Revision ID: 20261202_120000_output_deltas
Revises: 20261202_110000_usage_events
Create Date: 2026-12-02 12:00:00

A provider streaming its output hands each piece to the runtime, which appends it to
the run's journal as an ``output`` event ``{step, attempt, generation, row_version,
delta, partial: true}`` while the step runs (the ``output`` event written with the
step's checkpoint carries the whole answer, ``text``). A delta is tentative: an attempt
that dies before its checkpoint leaves its deltas, and the step's retry streams again
(clients key deltas by ``attempt``; the checkpoint's ``output`` is what counts).

The application may not write the journal, so deltas go through
``qimpl_append_output(run, generation, attempt, row_version, step, delta)``, a SECURITY
DEFINER function that is an owner write fenced like the provider-call record: it locks
the run's row ``FOR SHARE`` and accepts the delta only while the run is ``running`` in
that generation, owned by that attempt, at exactly that ``row_version`` and before
``deadline_at``; otherwise it raises ``QG013`` (``QG006`` after the deadline), and the
owner stops (R-EXEC-7). The run's tenant must be the session's (row-level security).
"""

from alembic import op

revision = "20261202_120000_output_deltas"
down_revision = "20261202_110000_usage_events"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: The largest delta one call appends (characters); a provider's pieces are far smaller.
MAX_DELTA_CHARS = 65536

APPEND_SQL = f"""
CREATE FUNCTION public.qimpl_append_output(p_run uuid, p_generation integer, p_attempt integer,
                                           p_row_version bigint, p_step integer, p_delta text)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    r public.runs%ROWTYPE;
    got bigint;
BEGIN
    SELECT * INTO r FROM public.runs WHERE run_id = p_run
        AND tenant_id = pg_catalog.current_setting('qimpl.tenant', true) FOR SHARE;
    IF r.state IS DISTINCT FROM 'running' OR r.generation <> p_generation
       OR r.owner_attempt IS DISTINCT FROM p_attempt OR r.row_version <> p_row_version THEN
        RAISE EXCEPTION 'output of run %: streamed by no owner (run % g% a% v%)',
            p_run, r.state, r.generation, r.owner_attempt, r.row_version
            USING ERRCODE = 'QG013';
    END IF;
    IF r.deadline_at <= pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION 'run %: deadline passed', p_run USING ERRCODE = 'QG006';
    END IF;
    IF p_delta IS NULL OR length(p_delta) = 0 OR length(p_delta) > {MAX_DELTA_CHARS} THEN
        RAISE EXCEPTION 'output of run %: a delta is 1..{MAX_DELTA_CHARS} characters', p_run
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO public.run_events (run_id, tenant_id, kind, row_version, data)
    VALUES (p_run, r.tenant_id, 'output', p_row_version, jsonb_build_object(
        'run_id', p_run, 'row_version', p_row_version, 'generation', p_generation,
        'attempt', p_attempt, 'step', p_step, 'delta', p_delta, 'partial', true))
    RETURNING seq INTO got;
    RETURN got;
END;
$$;
REVOKE ALL ON FUNCTION public.qimpl_append_output(uuid, integer, integer, bigint, integer, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.qimpl_append_output(uuid, integer, integer, bigint, integer, text)
    TO qimpl_app;
"""

#: Deltas already journaled stay (removing them would leave gaps in ``seq``).
DOWN_SQL = """
DROP FUNCTION public.qimpl_append_output(uuid, integer, integer, bigint, integer, text);
"""


def upgrade() -> None:
    op.execute(APPEND_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
