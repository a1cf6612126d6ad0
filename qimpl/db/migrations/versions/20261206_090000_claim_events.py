"""Takeover claims and counted failures get event kinds of their own (issue 22, item 5;
R-EVENT-1, R-EXEC-13).

Revision ID: 20261206_090000_claim_events
Revises: 20261205_090000_guard_all_writes
Create Date: 2026-12-06 09:00:00

Until this revision every ``running -> running`` write without a tool invocation was
journaled as a ``checkpoint`` event, so a client saw a "checkpoint" when an attempt took
the run over (``owner_attempt`` changed) or when a provider failure was counted, and no
checkpoint was written. ``qimpl_record_events`` now names them:

- ``checkpoint``: a ``run_checkpoints`` row was committed at that ``row_version``;
- ``tool_call`` / ``tool_result``: as before (the tool journal's write at that version);
- ``claim``: the write changed the run's ``owner_attempt`` within the generation (a new
  attempt took it over); its data carries ``attempt`` and ``previous_attempt``;
- ``failure``: any other owner write while ``running`` (a counted provider failure: the
  only one today), with ``attempt``.

The function is written whole (the head schema is in ``qimpl/db/schema.sql``).
"""

from alembic import op

revision = "20261206_090000_claim_events"
down_revision = "20261205_090000_guard_all_writes"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


OLD_KINDS = ("state", "checkpoint", "tool_call", "tool_result", "output", "usage", "terminal")
KINDS = (*OLD_KINDS, "claim", "failure")


def _record_events(claims: bool) -> str:
    """``qimpl_record_events`` whole: with ``claims``, this revision's; without, the
    previous revision's (for the downgrade)."""
    running = """
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
                    data := data || jsonb_build_object('attempt', t.owner_attempt);
                END IF;
            END IF;
        END IF;""" if claims else ""
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


def _kinds_check(kinds: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{k}'" for k in kinds)
    return (f"ALTER TABLE public.run_events DROP CONSTRAINT run_events_kind_check;\n"
            f"ALTER TABLE public.run_events ADD CONSTRAINT run_events_kind_check"
            f" CHECK (kind IN ({listed}));\n")


def upgrade() -> None:
    op.execute(_kinds_check(KINDS) + _record_events(claims=True))


def downgrade() -> None:
    op.execute("UPDATE public.run_events SET kind = 'checkpoint' WHERE kind IN ('claim', 'failure');\n"
               + _kinds_check(OLD_KINDS) + _record_events(claims=False))
