"""Run the schema migrations programmatically (R-OPS-1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import psycopg
from alembic import command
from alembic.config import Config

from qimpl.errors import MigrationRefused

__all__ = ["BASELINE", "HEAD", "MigrationRefused", "alembic_config", "downgrade", "failure_line", "main", "upgrade"]

#: The newest revision (tests/integration/test_migrations.py checks it is the scripts' head).
HEAD = "20261213_090000_hardening_four"
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


def downgrade(dsn: str, revision: str, *, discard_keys: bool = False) -> None:
    """Downgrade ``dsn`` to ``revision`` (``base`` for an empty schema). A downgrade that
    would drop API keys, workspace grants or the key audit while they hold rows is refused
    (the database raises ``downgrade refused: …``) unless ``discard_keys``."""
    cfg = alembic_config(dsn)
    cfg.attributes["discard_keys"] = discard_keys
    command.downgrade(cfg, revision)


def failure_line(exc: BaseException) -> str:
    """What ``main`` prints of a failed migration: the database's own message and SQLSTATE
    when it refused (``permission denied for schema public [42501]``), a refusal's reason,
    else the error's type. Never a traceback, a DSN or a password: libpq's messages name
    the host, port and role at most."""
    if isinstance(exc, MigrationRefused):
        return str(exc)
    orig = getattr(exc, "orig", exc)  # SQLAlchemy wraps the driver's error
    if isinstance(orig, psycopg.Error):
        primary = orig.diag.message_primary or str(orig).strip().splitlines()[0]
        return f"{type(orig).__name__}: {primary}" + (f" [{orig.sqlstate}]" if orig.sqlstate else "")
    return type(exc).__name__


def _known_revision(revision: str) -> bool:
    """Whether alembic resolves ``revision`` among qimpl's migrations (read from the
    scripts, without a database)."""
    from alembic.script import ScriptDirectory

    try:
        ScriptDirectory.from_config(alembic_config("postgresql://")).get_revisions(revision)
    except Exception:  # noqa: BLE001 - alembic's CommandError or ResolutionError: unknown
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            self.print_usage(sys.stderr)
            print(f"migrate: {message}", file=sys.stderr)
            raise SystemExit(64)

    parser = Parser(prog="python -m qimpl.db.migrate",
                    description="Upgrade the schema to the newest migration (R-OPS-1), or downgrade it.")
    parser.add_argument("dsn", nargs="?", metavar="DSN",
                        help="the schema owner's postgresql:// DSN (default: QIMPL_ADMIN_DATABASE_URL,"
                             " else QIMPL_DATABASE_URL); the role must be a superuser or BYPASSRLS")
    parser.add_argument("--downgrade", metavar="REVISION",
                        help=f"downgrade to REVISION instead (e.g. {BASELINE}; refused while a"
                             " run it cannot hold is live, R-OPS-2)")
    parser.add_argument("--discard-keys", action="store_true",
                        help="let a downgrade drop the API keys, workspace grants and key audit it"
                             " cannot keep (refused while they hold rows without it)")
    return parser


def main(argv: list[str]) -> int:
    """``python -m qimpl.db.migrate [--downgrade REVISION [--discard-keys]] [DSN]`` (default
    ``QIMPL_ADMIN_DATABASE_URL``, else ``QIMPL_DATABASE_URL``): upgrade to head and print
    ``migrated to <revision>``, or downgrade and print ``downgraded to <revision>``. Exit
    codes: 0 done, 2 the database refused or cannot be reached, or the role cannot see
    every tenant's rows (one line: ``failure_line``), 64 a usage error or no DSN."""
    from qimpl.settings import AdminSettings, load_or_exit

    parser = _parser()
    args = parser.parse_args(argv)
    if args.discard_keys and not args.downgrade:
        parser.error("--discard-keys goes with --downgrade")
    dsn = args.dsn or load_or_exit(AdminSettings, "migrate").admin_database_url
    # Usage errors, before any connection: they were 'migrate: failed: ArgumentError' and
    # 'migrate: failed: CommandError' (exit 2), which said nothing of what to change.
    if not dsn.startswith(("postgresql://", "postgres://")):
        parser.error("DSN must be a PostgreSQL URL postgresql://user:password@host:port/database")
    if args.downgrade and not _known_revision(args.downgrade):
        parser.error(f"--downgrade {args.downgrade}: no such revision (e.g. {BASELINE}, or base)")
    try:
        if args.downgrade:
            downgrade(dsn, args.downgrade, discard_keys=args.discard_keys)
        else:
            upgrade(dsn)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback (it may hold the DSN)
        print(f"migrate: failed: {failure_line(exc)}", file=sys.stderr)
        return 2
    print(f"downgraded to {args.downgrade}" if args.downgrade else f"migrated to {HEAD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
