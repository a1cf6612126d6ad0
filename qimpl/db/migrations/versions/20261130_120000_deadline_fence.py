"""Lifecycle hardening: the deadline and the fencing token enforced by the database.

Revision ID: 20261130_120000_deadline_fence
Revises: 20261007_230000_run_lifecycle
Create Date: 2026-11-30 12:00:00

The transition guard (R-STATE-1) gains three refusals, each with its own SQLSTATE so
that writers can tell them apart:

- ``QG006`` (R-EXEC-8): a version-2 run whose ``deadline_at`` has passed by the
  database's clock may only end (``expired``, ``failed``, ``cancelled``): no claim,
  checkpoint, park, resume or dispatch confirmation commits after the deadline.
- ``QG007`` (R-EXEC-12): ``expired`` is never written before ``deadline_at`` by the
  database's clock, whatever the writer's clock says.
- ``QG008`` (R-EXEC-7): within a generation the fencing token only goes forward: a
  write may not lower ``owner_attempt``.

``queued -> queued`` becomes legal: it records that a generation queued by an approval
was confirmed dispatched (``dispatch_confirmed_at``), so the reconciler does not
re-dispatch a run that is only waiting for a tenant slot. ``dispatch_requested_at``
records when the current generation was handed to dispatch (creation, resume,
approval): the reconciler's grace period runs from it (R-OPS-3).
"""

from alembic import op

revision = "20261130_120000_deadline_fence"
down_revision = "20261007_230000_run_lifecycle"
branch_labels = None
depends_on = None

#: Transitions added by this revision.
ADDED = (("queued", "queued"),)

#: The guard as 20261007_230000_run_lifecycle left it (restored by the downgrade).
PREVIOUS_GUARD_SQL = """
CREATE OR REPLACE FUNCTION runs_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('completed', 'failed', 'expired', 'cancelled') THEN
        RAISE EXCEPTION 'run % is terminal (%)', OLD.run_id, OLD.state
            USING ERRCODE = 'QG001';
    END IF;
    IF NEW.row_version IS DISTINCT FROM OLD.row_version + 1 THEN
        RAISE EXCEPTION 'run %: row_version must go from % to %, not %',
            OLD.run_id, OLD.row_version, OLD.row_version + 1, NEW.row_version
            USING ERRCODE = 'QG003';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM run_allowed_transitions
                   WHERE from_state = OLD.state AND to_state = NEW.state) THEN
        RAISE EXCEPTION 'run %: transition % -> % is not allowed', OLD.run_id, OLD.state, NEW.state
            USING ERRCODE = 'QG002';
    END IF;
    IF NEW.run_id <> OLD.run_id OR NEW.tenant_id <> OLD.tenant_id
       OR NEW.principal_id <> OLD.principal_id OR NEW.accepted_at <> OLD.accepted_at
       OR NEW.deadline_at <> OLD.deadline_at OR NEW.lifecycle_version <> OLD.lifecycle_version
       OR NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'run %: identity, deadline and generation are immutable', OLD.run_id
            USING ERRCODE = 'QG004';
    END IF;
    RETURN NEW;
END;
$$;
"""

#: The guard with this revision's three refusals (QG007, QG006, QG008) after QG004.
GUARD_SQL = """
CREATE OR REPLACE FUNCTION runs_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('completed', 'failed', 'expired', 'cancelled') THEN
        RAISE EXCEPTION 'run % is terminal (%)', OLD.run_id, OLD.state
            USING ERRCODE = 'QG001';
    END IF;
    IF NEW.row_version IS DISTINCT FROM OLD.row_version + 1 THEN
        RAISE EXCEPTION 'run %: row_version must go from % to %, not %',
            OLD.run_id, OLD.row_version, OLD.row_version + 1, NEW.row_version
            USING ERRCODE = 'QG003';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM run_allowed_transitions
                   WHERE from_state = OLD.state AND to_state = NEW.state) THEN
        RAISE EXCEPTION 'run %: transition % -> % is not allowed', OLD.run_id, OLD.state, NEW.state
            USING ERRCODE = 'QG002';
    END IF;
    IF NEW.run_id <> OLD.run_id OR NEW.tenant_id <> OLD.tenant_id
       OR NEW.principal_id <> OLD.principal_id OR NEW.accepted_at <> OLD.accepted_at
       OR NEW.deadline_at <> OLD.deadline_at OR NEW.lifecycle_version <> OLD.lifecycle_version
       OR NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'run %: identity, deadline and generation are immutable', OLD.run_id
            USING ERRCODE = 'QG004';
    END IF;
    IF NEW.state = 'expired' AND clock_timestamp() < OLD.deadline_at THEN
        RAISE EXCEPTION 'run %: expired before its deadline (% < %)',
            OLD.run_id, clock_timestamp(), OLD.deadline_at
            USING ERRCODE = 'QG007';
    END IF;
    IF OLD.lifecycle_version = 2 AND clock_timestamp() >= OLD.deadline_at
       AND NEW.state NOT IN ('expired', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'run %: deadline % passed; it may only end', OLD.run_id, OLD.deadline_at
            USING ERRCODE = 'QG006';
    END IF;
    IF NEW.generation = OLD.generation AND NEW.owner_attempt < OLD.owner_attempt THEN
        RAISE EXCEPTION 'run %: attempt % may not take generation % back from attempt %',
            OLD.run_id, NEW.owner_attempt, OLD.generation, OLD.owner_attempt
            USING ERRCODE = 'QG008';
    END IF;
    RETURN NEW;
END;
$$;
"""


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN dispatch_requested_at timestamptz")
    values = ", ".join(f"('{a}', '{b}')" for a, b in ADDED)
    op.execute(f"INSERT INTO run_allowed_transitions (from_state, to_state) VALUES {values}")
    op.execute(GUARD_SQL)


def downgrade() -> None:
    op.execute(PREVIOUS_GUARD_SQL)
    for a, b in ADDED:
        op.execute(f"DELETE FROM run_allowed_transitions WHERE from_state = '{a}' AND to_state = '{b}'")
    op.execute("ALTER TABLE runs DROP COLUMN dispatch_requested_at")
