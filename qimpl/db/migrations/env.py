"""Alembic environment: raw SQL migrations run over one SQLAlchemy connection."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or ""
    # Both schemes libpq and the settings take (``qimpl.settings``): SQLAlchemy knows no
    # ``postgres`` dialect, and a ``postgres://`` DSN failed with NoSuchModuleError.
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url.removeprefix(scheme)
    return url


def _refuse_a_role_under_row_security(connection: Connection) -> None:
    """Raise MigrationRefused unless the migrating role bypasses row-level security (a
    superuser, or BYPASSRLS). qimpl's tables force it on their owner too, so a migration's
    UPDATE or DELETE, and a downgrade's guard count, would see no tenant's rows: data
    migrations would skip every row and the guard would count no live run."""
    from qimpl.errors import MigrationRefused

    bypass, role, owner = connection.exec_driver_sql(
        "SELECT r.rolsuper OR r.rolbypassrls, r.rolname, pg_catalog.pg_get_userbyid(d.datdba)"
        " FROM pg_catalog.pg_roles r, pg_catalog.pg_database d"
        " WHERE r.rolname = current_user AND d.datname = pg_catalog.current_database()").one()
    if not bypass:
        # Only the database's owner is told to take BYPASSRLS: a tester who migrated with the
        # API's DSN was told "ALTER ROLE qimpl_api BYPASSRLS", which would end tenant
        # isolation for the API (and make it refuse to start, database_role_unsafe).
        advice = (f"ALTER ROLE {role} BYPASSRLS, as a superuser" if role == owner else
                  f"{role} does not own the database: migrate as the schema owner, {owner}"
                  " (QIMPL_ADMIN_DATABASE_URL); an application role must never bypass row-level security")
        raise MigrationRefused(
            f"role {role} is neither a superuser nor BYPASSRLS: the tables force row-level security on"
            f" their owner, so migrations would not see the tenants' rows ({advice})")


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transactional_ddl=True)
        with context.begin_transaction():
            # Inside the migrations' transaction: a statement before it would begin one of
            # SQLAlchemy's own, and alembic would then leave the migrations uncommitted.
            _refuse_a_role_under_row_security(connection)
            if context.config.attributes.get("discard_keys"):
                # Read by the downgrades that drop API keys, grants or their audit: without
                # it they refuse while those hold rows. For this transaction only.
                connection.exec_driver_sql("SELECT set_config('qimpl.downgrade_discards_keys', 'on', true)")
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
