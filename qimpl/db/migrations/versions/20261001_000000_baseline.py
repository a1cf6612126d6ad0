"""Baseline: the pre-lifecycle schema, as deployed before durable runs.

Revision ID: 20261001_000000_baseline
Revises:
Create Date: 2026-10-01 00:00:00

Runs stored their status in a PostgreSQL enum type (``run_status``, upper case) and ran
inline in the API process. ``20261007_230000_run_lifecycle`` upgrades this schema.
"""

from alembic import op

revision = "20261001_000000_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TYPE run_status AS ENUM ('QUEUED', 'STREAMING', 'COMPLETED', 'FAILED', 'CANCELLED');
        CREATE TABLE runs (
            run_id        uuid PRIMARY KEY,
            tenant_id     text NOT NULL,
            principal_id  text NOT NULL,
            agent_id      text NOT NULL,
            status        run_status NOT NULL DEFAULT 'QUEUED',
            prompt        text NOT NULL,
            result_json   jsonb,
            error_message text,
            created_at    timestamptz NOT NULL DEFAULT now(),
            updated_at    timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX runs_tenant ON runs (tenant_id);
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE runs; DROP TYPE run_status;")
