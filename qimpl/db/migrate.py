"""Run the schema migrations programmatically (R-OPS-1)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["BASELINE", "HEAD", "alembic_config", "downgrade", "upgrade"]

HEAD = "20261201_100000_hardening"
BASELINE = "20261001_000000_baseline"
_DIR = Path(__file__).with_name("migrations")


def alembic_config(dsn: str) -> Config:
    """An alembic ``Config`` for ``dsn`` (``postgresql://...``) without an ini file."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_DIR))
    cfg.set_main_option("sqlalchemy.url", dsn.replace("%", "%%"))
    return cfg


def upgrade(dsn: str, revision: str = "head") -> None:
    """Upgrade ``dsn`` to ``revision``; raises whatever the migration raises."""
    command.upgrade(alembic_config(dsn), revision)


def downgrade(dsn: str, revision: str) -> None:
    """Downgrade ``dsn`` to ``revision`` (``base`` for an empty schema)."""
    command.downgrade(alembic_config(dsn), revision)


if __name__ == "__main__":
    import sys

    upgrade(sys.argv[1])
