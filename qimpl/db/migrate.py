"""Run the schema migrations programmatically (R-OPS-1)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["BASELINE", "HEAD", "alembic_config", "downgrade", "upgrade"]

#: The newest revision (tests/integration/test_migrations.py checks it is the scripts' head).
HEAD = "20261210_100000_retry_after"
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


def main(argv: list[str]) -> int:
    """``python -m qimpl.db.migrate [DSN]`` (default ``QIMPL_ADMIN_DATABASE_URL``, else
    ``QIMPL_DATABASE_URL``): upgrade to head and print ``migrated to <revision>``. Exit
    codes: 0 done, 2 the database refused or cannot be reached (one line, the error's
    type), 64 no DSN."""
    import sys

    from qimpl.settings import AdminSettings, load_or_exit

    if len(argv) > 1:
        print("usage: python -m qimpl.db.migrate [DSN]", file=sys.stderr)
        return 64
    dsn = argv[0] if argv else load_or_exit(AdminSettings, "migrate").admin_database_url
    try:
        upgrade(dsn)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback (it may hold the DSN)
        print(f"migrate: failed: {type(exc).__name__}", file=sys.stderr)
        return 2
    print(f"migrated to {HEAD}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
