"""Sweep records are kept for a retention, not forever (R-OPS-3).

Revision ID: 20261212_090000_sweep_retention
Revises: 20261211_090000_clear_pending
Create Date: 2026-12-12 09:00:00

Every sweep of every tenant by every reconciler leaves a row in ``reconciler_sweeps``:
at the default 5 s, three workers sweeping ten tenants write about 520,000 rows a day,
and nothing deleted them (an operator's walk-through, 2026-12-06). The reconciler now
deletes, in each sweep, up to 1,000 of its tenant's rows older than
``QIMPL_SWEEP_RETENTION_S`` (7 days by default): the application role may delete them,
and an index on ``(tenant_id, finished_at)`` finds them (and serves "which tenants were
swept lately"). The downgrade takes the privilege and the index away; no row is lost.
"""

from alembic import op

revision = "20261212_090000_sweep_retention"
down_revision = "20261211_090000_clear_pending"
branch_labels = None
depends_on = None

UP_SQL = """
GRANT DELETE ON public.reconciler_sweeps TO qimpl_app;
CREATE INDEX reconciler_sweeps_tenant_finished ON public.reconciler_sweeps (tenant_id, finished_at);
"""

DOWN_SQL = """
DROP INDEX public.reconciler_sweeps_tenant_finished;
REVOKE DELETE ON public.reconciler_sweeps FROM qimpl_app;
"""


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
