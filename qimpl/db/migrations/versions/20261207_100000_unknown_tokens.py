"""Token totals that a provider did not report are unknown, not zero (issue 25, item 9;
R-Q34-2).

Revision ID: 20261207_100000_unknown_tokens
Revises: 20261207_090000_key_admin
Create Date: 2026-12-07 10:00:00

A usage event's ``totals.input_tokens`` (and ``output_tokens``) was the sum of the counts
the provider reported, 0 where it reported none, so a provider that reports no usage
showed ``0`` tokens for a run that used some. A total is now ``null`` once any
*succeeded* call of the run did not report that count (its answer's tokens are unknown,
so the total is); calls that failed, were cancelled or are still open add nothing (they
returned no answer, and providers report no usage for them). A run with no call has 0.
The run record (``qimpl.db.usage.OBSERVED_SQL``) follows the same rule, so the terminal
read and the last usage event agree. ``provider_calls_usage_event`` is written whole.
"""

from alembic import op

revision = "20261207_100000_unknown_tokens"
down_revision = "20261207_090000_key_admin"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"



def total(column: str) -> str:
    """The SQL total of ``p.<column>`` over a run's provider calls ``p``: NULL once a
    succeeded call did not report it, else the sum (0 without calls)."""
    return (f"CASE WHEN bool_or(p.status = 'succeeded' AND p.{column} IS NULL) THEN NULL"
            f" ELSE coalesce(sum(p.{column}), 0) END")


def _usage_event(unknown: bool) -> str:
    tokens_in = total("input_tokens") if unknown else "coalesce(sum(p.input_tokens), 0)"
    tokens_out = total("output_tokens") if unknown else "coalesce(sum(p.output_tokens), 0)"
    return f"""
CREATE OR REPLACE FUNCTION public.provider_calls_usage_event() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    v bigint;
    totals record;
BEGIN
    SELECT r.row_version INTO v FROM public.runs r WHERE r.run_id = NEW.run_id;
    SELECT count(*) AS calls, {tokens_in} AS input_tokens,
           {tokens_out} AS output_tokens
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
"""


def upgrade() -> None:
    op.execute(_usage_event(unknown=True))


def downgrade() -> None:
    op.execute(_usage_event(unknown=False))
