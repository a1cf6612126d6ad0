"""A failed provider call keeps the ``Retry-After`` its provider sent (R-EXEC-6):
``provider_calls.retry_after_s``.

Revision ID: 20261210_100000_retry_after
Revises: 20261210_090000_judged_at
Create Date: 2026-12-10 10:00:00

Until this revision a ``Retry-After`` was known only to the failing attempt, which hands
it to Temporal as the retry's delay. A retry that came without that delay (the attempt's
own failure report lost to a watcher that failed it by its task token first, a crash
right after the count) waited out only the exponential backoff: CI's ``qualify run``
(``openai-provider-stream-breaks``, 2026-12-05) saw a 429 with ``Retry-After: 1`` asked
again 0.667 s later. The record of the failed call now carries the seconds the provider
asked for, and every new attempt waits for the larger of the backoff and that
(``qimpl.backoff.backoff_left``). Only a ``failed`` record may carry it, never negative.
"""

from alembic import op

revision = "20261210_100000_retry_after"
down_revision = "20261210_090000_judged_at"
branch_labels = None
depends_on = None

UP_SQL = """
ALTER TABLE public.provider_calls
    ADD COLUMN retry_after_s double precision,
    ADD CONSTRAINT provider_calls_retry_after_check
        CHECK (retry_after_s IS NULL OR (status = 'failed' AND retry_after_s >= 0));
COMMENT ON COLUMN public.provider_calls.retry_after_s IS
    'seconds the provider asked to be left alone after this failed call (HTTP Retry-After); NULL: it did not say';
"""

DOWN_SQL = """
ALTER TABLE public.provider_calls DROP COLUMN retry_after_s;
"""


def upgrade() -> None:
    op.execute(UP_SQL)


def downgrade() -> None:
    op.execute(DOWN_SQL)
