"""Usage events in the run's event journal (R-EVENT-1, R-Q34-2).

Revision ID: 20261202_110000_usage_events
Revises: 20261202_100000_provider_calls
Create Date: 2026-12-02 11:00:00

When the owner settles a provider-call record (``started`` -> ``succeeded``, ``failed``
or ``cancelled``), the same transaction appends a ``usage`` event to ``run_events``: the
call (step, attempt, status, the tokens the provider reported) and the run's totals so
far as the record counts them (every call asked, by every attempt: ``provider_calls``,
``input_tokens``, ``output_tokens``). A settle is accepted only while the run is
``running`` and holds its row ``FOR SHARE``, so a usage event always comes before the
run's terminal event. The trigger runs with its owner's rights (the application may not
write the journal) and a pinned search path. A call whose attempt died has no settle and
so no usage event; the totals of the next usage event, and the run record, count it.
"""

from alembic import op

revision = "20261202_110000_usage_events"
down_revision = "20261202_100000_provider_calls"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


USAGE_EVENTS_SQL = f"""
CREATE FUNCTION public.provider_calls_usage_event() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    v bigint;
    totals record;
BEGIN
    SELECT r.row_version INTO v FROM public.runs r WHERE r.run_id = NEW.run_id;
    SELECT count(*) AS calls, coalesce(sum(p.input_tokens), 0) AS input_tokens,
           coalesce(sum(p.output_tokens), 0) AS output_tokens
      INTO totals FROM public.provider_calls p WHERE p.run_id = NEW.run_id;
    INSERT INTO public.run_events (run_id, tenant_id, kind, row_version, data)
    VALUES (NEW.run_id, NEW.tenant_id, 'usage', v, jsonb_build_object(
        'run_id', NEW.run_id, 'row_version', v, 'generation', NEW.generation,
        'attempt', NEW.attempt, 'step', NEW.step, 'status', NEW.status,
        'input_tokens', NEW.input_tokens, 'output_tokens', NEW.output_tokens,
        'totals', jsonb_build_object('provider_calls', totals.calls,
                                     'input_tokens', totals.input_tokens,
                                     'output_tokens', totals.output_tokens)));
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.provider_calls_usage_event() FROM PUBLIC;
CREATE TRIGGER provider_calls_usage_event AFTER UPDATE OF status ON public.provider_calls
    FOR EACH ROW WHEN (OLD.status = 'started' AND NEW.status <> 'started')
    EXECUTE FUNCTION public.provider_calls_usage_event();
"""

#: Usage events already journaled stay (removing them would leave gaps in ``seq``).
DOWN_SQL = """
DROP TRIGGER provider_calls_usage_event ON public.provider_calls;
DROP FUNCTION public.provider_calls_usage_event();
"""


def upgrade() -> None:
    op.execute(USAGE_EVENTS_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
