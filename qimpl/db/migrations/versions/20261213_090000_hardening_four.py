"""Hardening, fourth pass (issue 56): the guards fire in every replication role; the
listings' indexes.

Revision ID: 20261213_090000_hardening_four
Revises: 20261212_090000_sweep_retention
Create Date: 2026-12-13 09:00:00

- **Every trigger fires ``ALWAYS``** (item 4). The transition guard, the checkpoint
  guard, the tool journal's and the provider calls' guards, the transition audit, the
  event journal and the key audit are ordinary triggers, which PostgreSQL skips in a
  session whose ``session_replication_role`` is ``replica``. A role granted ``SET ON
  PARAMETER session_replication_role`` wrote ``running -> completed`` with no
  ``row_version`` bump and no audit row. ``ENABLE ALWAYS`` makes each fire whatever the
  session's replication role (the start-up role check refuses such a role as well,
  ``qimpl/db/roles.py``). A logical-replication subscriber of this schema (none is
  supported) would now run them on the rows it applies too.
  The downgrade puts each back to ``ENABLE`` (fires in ``origin`` and ``local`` only).
- **The listings read a page in index order** (item 7). A client's listing (its tenant,
  principal and agent, newest accepted first) and the operator's (one tenant at a time,
  oldest first) sorted all the matching runs for each page: no index matched their
  filter and ``ORDER BY accepted_at, run_id``. ``runs_tenant_principal_agent_accepted``
  and ``runs_tenant_accepted`` do (``qimpl/db/listing.py``). The downgrade drops them.
"""

from alembic import op

revision = "20261213_090000_hardening_four"
down_revision = "20261212_090000_sweep_retention"
branch_labels = None
depends_on = None

#: (table, trigger) for every trigger of the schema at this revision.
_TRIGGERS = (
    ("api_key_audit", "api_key_audit_append_only"),
    ("api_keys", "api_keys_audit"),
    ("api_keys", "api_keys_guard"),
    ("operator_tenants", "operator_tenants_audit"),
    ("provider_calls", "provider_calls_guard"),
    ("provider_calls", "provider_calls_usage_event"),
    ("provider_calls", "provider_calls_xact"),
    ("run_checkpoints", "run_checkpoints_guard"),
    ("run_checkpoints", "run_checkpoints_xact"),
    ("run_events", "run_events_notify"),
    ("run_events", "run_events_number"),
    ("run_events", "run_events_xact"),
    ("run_transitions", "run_transitions_event"),
    ("run_transitions", "run_transitions_xact"),
    ("runs", "runs_forbid_delete"),
    ("runs", "runs_record_transition"),
    ("runs", "runs_terminal_clears_pending"),
    ("runs", "runs_transition_guard"),
    ("tool_invocations", "tool_invocations_guard"),
    ("tool_invocations", "tool_invocations_xact"),
)

UP_SQL = "".join(f"ALTER TABLE public.{table} ENABLE ALWAYS TRIGGER {trigger};\n"
                 for table, trigger in _TRIGGERS) + """
CREATE INDEX runs_tenant_principal_agent_accepted
    ON public.runs (tenant_id, principal_id, agent_id, accepted_at, run_id);
CREATE INDEX runs_tenant_accepted ON public.runs (tenant_id, accepted_at, run_id);
"""

DOWN_SQL = """
DROP INDEX public.runs_tenant_accepted;
DROP INDEX public.runs_tenant_principal_agent_accepted;
""" + "".join(f"ALTER TABLE public.{table} ENABLE TRIGGER {trigger};\n" for table, trigger in _TRIGGERS)


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
