"""A run that ends leaves no pending request in ``result_json`` (R-READ-2):
``pending_input`` is set in ``awaiting_input`` and ``pending_approval`` in
``awaiting_approval``, and no longer once the run is terminal.

Revision ID: 20261211_090000_clear_pending
Revises: 20261210_100000_retry_after
Create Date: 2026-12-11 09:00:00

Until this revision a parked run that was cancelled or expired kept what it had asked
for: an expired ``awaiting_input`` run read ``{"pending_input": {"kind": "input"}}``, and a
client that decides by ``pending_input`` would prompt a user about a finished run (a
tester's finding, 2026-12-06). Every way a run ends (the owner, a cancel, the deadline's
sweep, the reconciler, an operator) writes its new state to ``runs``, so the rule is the
database's: a BEFORE UPDATE trigger removes both keys when the state becomes terminal (an
empty object then reads as NULL). The answer of a ``completed`` run, and an error's code
and message, are untouched; the tool journal still shows what was sent (R-Q34-3). The
upgrade clears the runs that already ended so; the downgrade drops the trigger only.
"""

from alembic import op

revision = "20261211_090000_clear_pending"
down_revision = "20261210_100000_retry_after"
branch_labels = None
depends_on = None

SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"
TERMINAL = "('completed', 'failed', 'cancelled', 'expired')"

UP_SQL = f"""
CREATE FUNCTION public.qimpl_terminal_clears_pending() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    IF NEW.result_json ? 'pending_input' OR NEW.result_json ? 'pending_approval' THEN
        NEW.result_json := nullif(NEW.result_json - 'pending_input' - 'pending_approval', '{{}}'::jsonb);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER runs_terminal_clears_pending BEFORE UPDATE OF state ON public.runs
    FOR EACH ROW WHEN (NEW.state IN {TERMINAL} AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION public.qimpl_terminal_clears_pending();
-- Runs that already ended so (as the owner: the rule above, once; no transition is made).
ALTER TABLE public.runs DISABLE TRIGGER USER;
UPDATE public.runs
   SET result_json = nullif(result_json - 'pending_input' - 'pending_approval', '{{}}'::jsonb)
 WHERE state IN {TERMINAL} AND (result_json ? 'pending_input' OR result_json ? 'pending_approval');
ALTER TABLE public.runs ENABLE TRIGGER USER;
"""

DOWN_SQL = """
DROP TRIGGER runs_terminal_clears_pending ON public.runs;
DROP FUNCTION public.qimpl_terminal_clears_pending();
"""


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
