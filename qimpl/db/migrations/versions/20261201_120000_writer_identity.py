"""The audit trail names the writer (R-EXEC-7, R-Q-5): which session, which owner token,
holding the run's advisory lock or not.

Revision ID: 20261201_120000_writer_identity
Revises: 20261201_100000_hardening
Create Date: 2026-12-01 12:00:00

Before this revision ``run_transitions.owner_attempt`` was the run's *stored* owner after
the write, not the writer: a superseded attempt's write, had a fence ever failed open,
would have been recorded under its successor's attempt. Now the audit trigger records,
from the writing session itself:

- ``writer_pid``: ``pg_backend_pid()`` of the session that wrote;
- ``writer_role``: its ``session_user`` (the API, the worker or an operator's role);
- ``writer_token``: the session's ``qimpl.owner`` setting, ``<run_id>:<generation>:<attempt>``,
  which an activity attempt sets on its lease session before it claims (empty for the
  API, the reconciler and the operator tools, which own nothing);
- ``writer_lock``: whether that session held the run's session advisory lock
  (``hashtextextended('qimpl-run:' || run_id, 0)``, as ``pg_locks`` shows it) at the write.

The harness checks every owner write against the owner at that ``row_version``: the token's
generation and attempt must be the run's, and the lock must be held
(``qualify.checkers.every_write_by_its_owner``).
"""

from alembic import op

revision = "20261201_120000_writer_identity"
down_revision = "20261201_100000_hardening"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


#: The run's advisory lock as ``pg_locks`` shows a bigint key: high half in ``classid``,
#: low half in ``objid`` (both unsigned), ``objsubid = 1``.
_HOLDS_LOCK = """EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
          AND l.objsubid = 1
          AND ((l.classid::int8 << 32) | l.objid::int8)
              = pg_catalog.hashtextextended('qimpl-run:' || NEW.run_id::text, 0))"""

WRITER_SQL = f"""
ALTER TABLE public.run_transitions
    ADD COLUMN writer_pid   integer,
    ADD COLUMN writer_role  text,
    ADD COLUMN writer_token text,
    ADD COLUMN writer_lock  boolean;

CREATE OR REPLACE FUNCTION public.runs_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER {SAFE_PATH} AS $$
BEGIN
    INSERT INTO public.run_transitions (run_id, tenant_id, row_version, old_state, new_state,
                                        generation, owner_attempt, checkpoint_step,
                                        writer_pid, writer_role, writer_token, writer_lock)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step,
            pg_catalog.pg_backend_pid(), session_user,
            nullif(pg_catalog.current_setting('qimpl.owner', true), ''),
            {_HOLDS_LOCK});
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION public.runs_record_transition() FROM PUBLIC;
"""

#: The audit trigger as 20261201_100000_hardening wrote it, and the writer's columns gone.
WRITER_DOWN_SQL = """
CREATE OR REPLACE FUNCTION public.runs_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    INSERT INTO public.run_transitions (run_id, tenant_id, row_version, old_state, new_state,
                                        generation, owner_attempt, checkpoint_step)
    VALUES (NEW.run_id, NEW.tenant_id, NEW.row_version,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
            NEW.state, NEW.generation, NEW.owner_attempt, NEW.checkpoint_step);
    RETURN NULL;
END;
$$;

ALTER TABLE public.run_transitions
    DROP COLUMN writer_pid, DROP COLUMN writer_role, DROP COLUMN writer_token,
    DROP COLUMN writer_lock;
"""


def upgrade() -> None:
    op.execute(WRITER_SQL)


def downgrade() -> None:
    op.execute(WRITER_DOWN_SQL)
