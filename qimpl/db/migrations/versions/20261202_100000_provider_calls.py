"""Observed usage: a record of every provider call, written before the call (R-Q34-2).

Revision ID: 20261202_100000_provider_calls
Revises: 20261202_090000_event_journal
Create Date: 2026-12-02 10:00:00

``provider_calls`` holds one row per call of the provider seam by a run's owner. The
owner inserts it (``started``) *before* it asks the provider and settles it after the
call returns: ``succeeded`` with the token counts the provider reported, ``failed`` (the
provider raised or timed out; ``outcome_code`` is the failure's safe kind) or
``cancelled`` (the run's deadline cut the call). A row left ``started`` is a call whose
outcome nobody saw: its attempt died or lost its lease during it. Counting rows therefore
counts every call actually asked, including those of attempts that failed or died before
their checkpoint — which the run's checkpointed ``usage`` cannot (it is written with the
checkpoint and lost with the attempt).

The record is an owner write, fenced by the database like the tool journal (QG012): an
insert is accepted only while the run is ``running`` in the row's generation, owned by
the row's attempt, at exactly the row's ``row_version`` (the owner's fencing token), and
only before ``deadline_at`` by the database's clock (``QG006``, R-EXEC-8); the runs row
is locked ``FOR SHARE`` while the guard looks, so no other writer can slip between. A
refused record means the call is not made: an owner whose lease was lost asks nothing
(R-EXEC-7, R-EXEC-11). A settle is accepted from the same generation and attempt while
the run is ``running``; a settled row never changes and rows are never deleted. The
guard stamps ``tenant_id``, ``started_at`` and ``ended_at`` itself (the database's clock).

Row-level security and grants follow ``20261201_100000_hardening``: FORCEd tenant
isolation, ``qimpl_app`` may SELECT, INSERT and UPDATE (never DELETE), the guard runs
with a pinned search path and names its relations ``public.``-qualified.
"""

from alembic import op

revision = "20261202_100000_provider_calls"
down_revision = "20261202_090000_event_journal"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


PROVIDER_CALLS_SQL = f"""
CREATE TABLE public.provider_calls (
    id             bigserial PRIMARY KEY,
    run_id         uuid NOT NULL REFERENCES public.runs (run_id),
    tenant_id      text NOT NULL,
    generation     integer NOT NULL,
    attempt        integer NOT NULL,
    step           integer NOT NULL CHECK (step >= 1),
    -- the owner's fencing token (runs.row_version) when it asked
    row_version    bigint NOT NULL,
    status         text NOT NULL DEFAULT 'started'
        CHECK (status IN ('started', 'succeeded', 'failed', 'cancelled')),
    outcome_code   text,
    input_tokens   bigint CHECK (input_tokens >= 0),
    output_tokens  bigint CHECK (output_tokens >= 0),
    started_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at       timestamptz,
    committed_by   text NOT NULL DEFAULT current_user
);
CREATE INDEX provider_calls_run ON public.provider_calls (run_id);

CREATE FUNCTION public.provider_calls_guard() RETURNS trigger LANGUAGE plpgsql
    {SAFE_PATH} AS $$
DECLARE
    r public.runs%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'provider call % may not be deleted', OLD.id USING ERRCODE = 'QG012';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status <> 'started' THEN
            RAISE EXCEPTION 'provider call % is settled (%)', OLD.id, OLD.status
                USING ERRCODE = 'QG012';
        END IF;
        IF NEW.status = 'started' OR NEW.id <> OLD.id OR NEW.run_id <> OLD.run_id
           OR NEW.tenant_id <> OLD.tenant_id OR NEW.generation <> OLD.generation
           OR NEW.attempt <> OLD.attempt OR NEW.step <> OLD.step
           OR NEW.row_version <> OLD.row_version OR NEW.started_at <> OLD.started_at THEN
            RAISE EXCEPTION 'provider call %: only its outcome may be recorded', OLD.id
                USING ERRCODE = 'QG012';
        END IF;
    END IF;
    SELECT * INTO r FROM public.runs WHERE run_id = NEW.run_id FOR SHARE;
    IF r.state IS DISTINCT FROM 'running' OR r.generation <> NEW.generation
       OR r.owner_attempt IS DISTINCT FROM NEW.attempt
       OR (TG_OP = 'INSERT' AND r.row_version <> NEW.row_version) THEN
        RAISE EXCEPTION 'provider call of run %: asked by no owner (run % g% a% v%)',
            NEW.run_id, r.state, r.generation, r.owner_attempt, r.row_version
            USING ERRCODE = 'QG012';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF r.deadline_at <= clock_timestamp() THEN
            RAISE EXCEPTION 'run %: deadline passed', NEW.run_id USING ERRCODE = 'QG006';
        END IF;
        NEW.tenant_id := r.tenant_id;
        NEW.status := 'started';
        NEW.started_at := clock_timestamp();
        NEW.ended_at := NULL;
        NEW.input_tokens := NULL;
        NEW.output_tokens := NULL;
    ELSE
        NEW.ended_at := clock_timestamp();
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER provider_calls_guard BEFORE INSERT OR UPDATE OR DELETE ON public.provider_calls
    FOR EACH ROW EXECUTE FUNCTION public.provider_calls_guard();

GRANT SELECT, INSERT, UPDATE ON public.provider_calls TO qimpl_app;
GRANT USAGE ON SEQUENCE public.provider_calls_id_seq TO qimpl_app;
ALTER TABLE public.provider_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.provider_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON public.provider_calls
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
"""

DOWN_SQL = """
DROP TABLE public.provider_calls;
DROP FUNCTION public.provider_calls_guard();
"""


def upgrade() -> None:
    op.execute(PROVIDER_CALLS_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
