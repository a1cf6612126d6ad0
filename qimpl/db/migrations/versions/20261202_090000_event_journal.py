"""The run's event journal (R-EVENT-1..3, R-EVENT-5, R-OPS-3).

Revision ID: 20261202_090000_event_journal
Revises: 20261201_120000_writer_identity
Create Date: 2026-12-02 09:00:00

``run_events`` holds each run's ordered events, numbered per run by ``seq`` (1, 2, …: an
SSE id says nothing about other runs or tenants). Kinds: ``state`` (a state change),
``checkpoint`` (a committed step), ``tool_call`` / ``tool_result`` (the tool journal's
intent or request, and the worker's outcome, R-TOOL-1), ``output`` (a step's answer text),
``terminal`` (the run's last transition: its ``state``, ``row_version`` and ``generation``
are the run record's, R-EVENT-3), and ``usage`` (reserved: written by a later revision).

- Every event is written in the same transaction as the change it describes: a
  DEFERRABLE INITIALLY DEFERRED constraint trigger on ``run_transitions`` (the guard's
  audit, itself written by the trigger on ``runs``) runs at commit, when the step's
  checkpoint and tool invocation written after the run's UPDATE are visible, and appends
  the transition's event (and an ``output`` event for a checkpoint carrying an answer).
  The writer holds the run's row lock until commit, so events of one run are appended in
  ``row_version`` order.
- ``seq`` is assigned by a BEFORE INSERT trigger (``max(seq) + 1`` of the run; the primary
  key refuses a duplicate), so another event kind is one ``INSERT INTO run_events (run_id,
  tenant_id, kind, data)`` in the writing transaction.
- An AFTER INSERT trigger ``pg_notify``s channel ``qimpl_run_events`` with
  ``<run_id>:<seq>`` (nothing else: no tenant, no content), delivered at commit.
- The journal is written with the owner's rights only (SECURITY DEFINER): the application
  role reads it under row-level security (FORCEd, by tenant) and cannot write it.
- Pruning (R-EVENT-5): ``qimpl_prune_event_streams(retention_s, reconciler, limit)`` deletes
  the events of at most ``least(limit, 100)`` runs of the current tenant that ended more
  than ``retention_s`` ago, claimed with ``FOR UPDATE SKIP LOCKED`` (several reconcilers at
  once take disjoint runs), and leaves a tombstone in ``run_event_prunes`` (who, when: one
  transaction's tombstones share ``pruned_at``) so reading a pruned stream answers 410.
  ``reconciler_sweeps.pruned`` counts each sweep's prunes.
- Existing runs are backfilled from ``run_transitions`` in ``id`` order.
"""

from alembic import op

revision = "20261202_090000_event_journal"
down_revision = "20261201_120000_writer_identity"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: Event kinds the journal accepts (``usage`` is reserved for observed usage, R-Q34-2).
KINDS = ("state", "checkpoint", "tool_call", "tool_result", "output", "usage", "terminal")
#: The NOTIFY channel; payload ``<run_id>:<seq>``.
CHANNEL = "qimpl_run_events"
#: Most streams one call of the prune function removes (R-EVENT-5).
PRUNE_LIMIT = 100
_TERMINAL_SQL = "('completed', 'failed', 'expired', 'cancelled')"
#: Tables read by the backfill: FORCEd row-level security would hide every tenant's rows
#: from a non-superuser owner, so it is lifted while the backfill runs.
_BACKFILL_READS = ("runs", "run_transitions", "run_checkpoints", "tool_invocations")

TABLES_SQL = f"""
CREATE TABLE run_events (
    run_id      uuid NOT NULL REFERENCES runs (run_id),
    seq         bigint NOT NULL CHECK (seq >= 1),
    tenant_id   text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ({", ".join(f"'{k}'" for k in KINDS)})),
    row_version bigint,
    data        jsonb NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE run_event_prunes (
    run_id    uuid PRIMARY KEY REFERENCES runs (run_id),
    tenant_id text NOT NULL,
    pruned_by text NOT NULL,
    -- the pruning transaction's start: one sweep's tombstones share it
    pruned_at timestamptz NOT NULL DEFAULT now(),
    events    integer NOT NULL
);
CREATE INDEX runs_tenant_ended ON runs (tenant_id, completed_at) WHERE state IN {_TERMINAL_SQL};
ALTER TABLE reconciler_sweeps ADD COLUMN pruned integer NOT NULL DEFAULT 0;

CREATE FUNCTION public.run_events_number() RETURNS trigger LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    IF NEW.seq IS NULL THEN
        SELECT coalesce(max(e.seq), 0) + 1 INTO NEW.seq FROM public.run_events e
        WHERE e.run_id = NEW.run_id;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER run_events_number BEFORE INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION public.run_events_number();
"""

#: One transition's events (the stream's shape before the journal, plus ``output``).
RECORD_SQL = f"""
CREATE FUNCTION public.qimpl_record_events(t public.run_transitions) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    kind text;
    data jsonb;
    ti record;
    answer text;
BEGIN
    kind := CASE WHEN t.new_state IN {_TERMINAL_SQL} THEN 'terminal'
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
        END IF;
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
REVOKE ALL ON FUNCTION public.qimpl_record_events(public.run_transitions) FROM PUBLIC;

CREATE FUNCTION public.run_transitions_event() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
BEGIN
    PERFORM public.qimpl_record_events(NEW);
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.run_transitions_event() FROM PUBLIC;
"""

BACKFILL_SQL = (
    "\n".join(f"ALTER TABLE public.{t} NO FORCE ROW LEVEL SECURITY;" for t in _BACKFILL_READS)
    + """
DO $$
DECLARE
    t public.run_transitions;
BEGIN
    FOR t IN SELECT * FROM public.run_transitions ORDER BY id LOOP
        PERFORM public.qimpl_record_events(t);
    END LOOP;
END $$;
"""
    + "\n".join(f"ALTER TABLE public.{t} FORCE ROW LEVEL SECURITY;" for t in _BACKFILL_READS))

TRIGGERS_SQL = f"""
CREATE CONSTRAINT TRIGGER run_transitions_event AFTER INSERT ON run_transitions
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.run_transitions_event();

CREATE FUNCTION public.run_events_notify() RETURNS trigger LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', NEW.run_id::text || ':' || NEW.seq::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER run_events_notify AFTER INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION public.run_events_notify();
"""

PRUNE_SQL = f"""
CREATE FUNCTION public.qimpl_prune_event_streams(p_retention_s double precision,
                                                 p_reconciler text, p_limit integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER {SAFE_PATH} AS $$
DECLARE
    n integer;
BEGIN
    WITH victims AS (
        SELECT r.run_id, r.tenant_id FROM public.runs r
        WHERE r.tenant_id = current_setting('qimpl.tenant', true) AND r.state IN {_TERMINAL_SQL}
          AND coalesce(r.completed_at, r.accepted_at)
              <= clock_timestamp() - make_interval(secs => p_retention_s)
          AND NOT EXISTS (SELECT 1 FROM public.run_event_prunes p WHERE p.run_id = r.run_id)
        ORDER BY r.completed_at
        LIMIT least(greatest(p_limit, 0), {PRUNE_LIMIT})
        FOR UPDATE OF r SKIP LOCKED
    ), gone AS (
        DELETE FROM public.run_events e USING victims v WHERE e.run_id = v.run_id
        RETURNING e.run_id
    ), marked AS (
        INSERT INTO public.run_event_prunes (run_id, tenant_id, pruned_by, events)
        SELECT v.run_id, v.tenant_id, p_reconciler,
               (SELECT count(*) FROM gone g WHERE g.run_id = v.run_id)
        FROM victims v
        ON CONFLICT (run_id) DO NOTHING
        RETURNING run_id
    )
    SELECT count(*) INTO n FROM marked;
    RETURN n;
END;
$$;
REVOKE ALL ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.qimpl_prune_event_streams(double precision, text, integer)
    TO qimpl_app;
"""

SECURITY_SQL = """
GRANT SELECT ON run_events, run_event_prunes TO qimpl_app;
ALTER TABLE run_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_events FORCE ROW LEVEL SECURITY;
ALTER TABLE run_event_prunes ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_event_prunes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_events
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
CREATE POLICY tenant_isolation ON run_event_prunes
    USING (tenant_id = current_setting('qimpl.tenant', true))
    WITH CHECK (tenant_id = current_setting('qimpl.tenant', true));
"""

DOWNGRADE_SQL = """
DROP FUNCTION qimpl_prune_event_streams(double precision, text, integer);
DROP TRIGGER run_transitions_event ON run_transitions;
DROP FUNCTION run_transitions_event();
DROP FUNCTION qimpl_record_events(run_transitions);
DROP TABLE run_event_prunes;
DROP TABLE run_events;
DROP FUNCTION run_events_number();
DROP FUNCTION run_events_notify();
DROP INDEX runs_tenant_ended;
ALTER TABLE reconciler_sweeps DROP COLUMN pruned;
"""


def upgrade() -> None:
    op.execute(TABLES_SQL)
    op.execute(RECORD_SQL)
    op.execute(BACKFILL_SQL)
    op.execute(TRIGGERS_SQL)
    op.execute(PRUNE_SQL)
    op.execute(SECURITY_SQL)


def downgrade() -> None:
    op.execute(DOWNGRADE_SQL)
