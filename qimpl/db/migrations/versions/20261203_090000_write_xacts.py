"""Each row names the transaction that wrote it (R-EXEC-3, R-EXEC-7, R-EVENT-1, R-Q-5).

Revision ID: 20261203_090000_write_xacts
Revises: 20261202_120000_output_deltas
Create Date: 2026-12-03 09:00:00

An owner write is one transaction: the fenced UPDATE of ``runs`` that bumps
``row_version``, the audit row the trigger writes into ``run_transitions``, the step's
checkpoint, the tool journal's row and the journal's events (R-EXEC-3, R-TOOL-1,
R-EVENT-1). That they really commit together is invisible in what the rows say (two
transactions a millisecond apart write the same values), so the database now stamps
each row with the top-level transaction that wrote it, ``pg_current_xact_id()`` (an
``xid8``, the same inside a savepoint, unlike the ``xmin`` system column, which also
changes when a row is updated):

- ``run_transitions.xact_id``, ``run_checkpoints.xact_id``, ``run_events.xact_id``: the
  inserting transaction (these rows are never updated);
- ``tool_invocations.intent_xact`` (the insert: the intent, a request, or an outcome
  written at once) and ``outcome_xact`` (the transaction that settled an intent or
  request; the insert's for a row inserted settled);
- ``provider_calls.started_xact`` and ``ended_xact`` (the settle, which also writes the
  call's ``usage`` event).

A BEFORE trigger sets them, whatever the writer sent, and keeps them on update except
when the row is settled. Rows written before this revision keep NULL (unknown): the
harness judges only stamped rows (``qualify.checkers.writes_committed_whole``).
"""

from alembic import op

revision = "20261203_090000_write_xacts"
down_revision = "20261202_120000_output_deltas"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: Insert-only tables whose rows carry their inserting transaction in ``xact_id``.
STAMPED = ("run_transitions", "run_checkpoints", "run_events")

XACTS_SQL = f"""
CREATE FUNCTION public.qimpl_stamp_xact() RETURNS trigger LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    NEW.xact_id := pg_catalog.pg_current_xact_id();
    RETURN NEW;
END;
$$;
REVOKE ALL ON FUNCTION public.qimpl_stamp_xact() FROM PUBLIC;
""" + "".join(f"""
ALTER TABLE public.{t} ADD COLUMN xact_id xid8;
CREATE TRIGGER {t}_xact BEFORE INSERT ON public.{t}
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_stamp_xact();
""" for t in STAMPED) + f"""
ALTER TABLE public.tool_invocations ADD COLUMN intent_xact xid8, ADD COLUMN outcome_xact xid8;
CREATE FUNCTION public.tool_invocations_xact() RETURNS trigger LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.intent_xact := pg_catalog.pg_current_xact_id();
        NEW.outcome_xact := CASE WHEN NEW.status NOT IN ('intent', 'requested')
                                 THEN pg_catalog.pg_current_xact_id() END;
    ELSE
        NEW.intent_xact := OLD.intent_xact;
        NEW.outcome_xact := CASE WHEN NEW.status IS DISTINCT FROM OLD.status
                                 THEN pg_catalog.pg_current_xact_id() ELSE OLD.outcome_xact END;
    END IF;
    RETURN NEW;
END;
$$;
REVOKE ALL ON FUNCTION public.tool_invocations_xact() FROM PUBLIC;
CREATE TRIGGER tool_invocations_xact BEFORE INSERT OR UPDATE ON public.tool_invocations
    FOR EACH ROW EXECUTE FUNCTION public.tool_invocations_xact();

ALTER TABLE public.provider_calls ADD COLUMN started_xact xid8, ADD COLUMN ended_xact xid8;
CREATE FUNCTION public.provider_calls_xact() RETURNS trigger LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.started_xact := pg_catalog.pg_current_xact_id();
        NEW.ended_xact := NULL;
    ELSE
        NEW.started_xact := OLD.started_xact;
        NEW.ended_xact := CASE WHEN NEW.status IS DISTINCT FROM OLD.status
                               THEN pg_catalog.pg_current_xact_id() ELSE OLD.ended_xact END;
    END IF;
    RETURN NEW;
END;
$$;
REVOKE ALL ON FUNCTION public.provider_calls_xact() FROM PUBLIC;
CREATE TRIGGER provider_calls_xact BEFORE INSERT OR UPDATE ON public.provider_calls
    FOR EACH ROW EXECUTE FUNCTION public.provider_calls_xact();
"""

DOWN_SQL = "".join(f"""
DROP TRIGGER {t}_xact ON public.{t};
ALTER TABLE public.{t} DROP COLUMN xact_id;
""" for t in STAMPED) + """
DROP FUNCTION public.qimpl_stamp_xact();
DROP TRIGGER tool_invocations_xact ON public.tool_invocations;
DROP FUNCTION public.tool_invocations_xact();
ALTER TABLE public.tool_invocations DROP COLUMN intent_xact, DROP COLUMN outcome_xact;
DROP TRIGGER provider_calls_xact ON public.provider_calls;
DROP FUNCTION public.provider_calls_xact();
ALTER TABLE public.provider_calls DROP COLUMN started_xact, DROP COLUMN ended_xact;
"""


def upgrade() -> None:
    op.execute(XACTS_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
