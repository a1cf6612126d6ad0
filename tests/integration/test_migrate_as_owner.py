"""``python -m qimpl.db.migrate`` as the README's schema owner (not a superuser): every
migration applies and its downgrade's guard sees every tenant's runs (R-OPS-1, R-OPS-2).
The tables force row-level security on their owner, so the owner must be BYPASSRLS; one
that is not is refused before anything runs. Run as a user would: a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from qimpl.db.migrate import BASELINE, HEAD

ROOT = Path(__file__).resolve().parents[2]


def _migrate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QIMPL_")}
    return subprocess.run([sys.executable, "-m", "qimpl.db.migrate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _owner(stack: Any, attributes: str) -> Iterator[str]:
    """A login role with ``attributes`` owning a new database; yields its DSN (a URL, as
    the README's)."""
    role, db = f"owner_{uuid.uuid4().hex[:8]}", f"m_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'owner-secret' {attributes}")
        conn.execute(f"CREATE DATABASE {db} OWNER {role}")
        # The README's cluster is new: the owner's first migration creates qimpl's group
        # roles, and (PostgreSQL >= 16) may grant them. Here the stack made them already.
        for group in ("qimpl_app", "qimpl_lookup"):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (group,)).fetchone():
                conn.execute(f"GRANT {group} TO {role} WITH ADMIN OPTION")
    try:
        where = conninfo_to_dict(stack.postgres.dsn(db))
        yield f"postgresql://{role}:owner-secret@{where['host']}:{where['port']}/{db}"
    finally:
        with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {db} WITH (FORCE)")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def readme_owner(stack: Any) -> Iterator[str]:
    """As the README makes it: it may create roles and bypasses row-level security."""
    yield from _owner(stack, "CREATEROLE BYPASSRLS")


@pytest.fixture
def owner_under_rls(stack: Any) -> Iterator[str]:
    yield from _owner(stack, "CREATEROLE")


@pytest.mark.req("R-OPS-1")
@pytest.mark.req("R-OPS-2")
def test_the_readme_owner_migrates_up_and_down_and_the_guard_sees_every_tenant(readme_owner: str) -> None:
    up = _migrate(readme_owner)
    assert (up.returncode, up.stdout.strip()) == (0, f"migrated to {HEAD}"), up.stderr
    run_id = str(uuid.uuid4())
    with psycopg.connect(readme_owner, autocommit=True) as conn:  # no tenant set: the guard must still count it
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at) VALUES (%s, 'acme', 'p', 'a', 'accepted', 'x', 'k',"
                     " now() + interval '1 hour')", (run_id,))
    refused = _migrate("--downgrade", BASELINE, readme_owner)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "downgrade refused: 1 version-2 runs are not terminal" in refused.stderr
    assert "Traceback" not in refused.stderr and "owner-secret" not in refused.stderr
    with psycopg.connect(readme_owner, autocommit=True) as conn:
        conn.execute("UPDATE runs SET state = 'cancelled', row_version = row_version + 1 WHERE run_id = %s",
                     (run_id,))
    down = _migrate("--downgrade", BASELINE, readme_owner)
    assert (down.returncode, down.stdout.strip()) == (0, f"downgraded to {BASELINE}"), down.stderr
    with psycopg.connect(readme_owner, autocommit=True) as conn:
        assert conn.execute("SELECT status::text FROM runs").fetchall() == [("CANCELLED",)]
    again = _migrate(readme_owner)
    assert again.returncode == 0, again.stderr


@pytest.mark.req("R-OPS-1")
def test_an_owner_under_row_security_is_refused_before_anything_runs(owner_under_rls: str) -> None:
    out = _migrate(owner_under_rls)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "neither a superuser nor BYPASSRLS" in out.stderr and "Traceback" not in out.stderr
    with psycopg.connect(owner_under_rls, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.alembic_version')").fetchone() == (None,)


def test_migrate_usage() -> None:
    helped = _migrate("--help")
    assert helped.returncode == 0 and "--downgrade REVISION" in helped.stdout
    bad = _migrate("--nonsense")
    assert bad.returncode == 64 and "usage: python -m qimpl.db.migrate" in bad.stderr
    unreachable = _migrate("postgresql://nobody:pw-secret@127.0.0.1:1/db")
    assert unreachable.returncode == 2 and "OperationalError" in unreachable.stderr
    assert "pw-secret" not in unreachable.stderr and "Traceback" not in unreachable.stderr


@pytest.mark.req("R-OPS-1")
def test_an_application_role_is_sent_to_the_schema_owner_not_told_to_bypass_rls(
        stack: Any, readme_owner: str) -> None:
    """A tester ran migrate with the API's DSN and was told "ALTER ROLE qimpl_api
    BYPASSRLS, as a superuser": advice that would end the API's tenant isolation. A role
    that does not own the database is sent to the schema owner instead."""
    app = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {app} LOGIN PASSWORD 'app-secret' IN ROLE qimpl_app")
    try:
        owner = readme_owner.split("//", 1)[1].split(":", 1)[0]
        out = _migrate(readme_owner.replace(f"{owner}:owner-secret", f"{app}:app-secret"))
        assert out.returncode == 2, (out.stdout, out.stderr)
        assert "neither a superuser nor BYPASSRLS" in out.stderr and "Traceback" not in out.stderr
        assert f"migrate as the schema owner, {owner}" in out.stderr, out.stderr
        assert f"ALTER ROLE {app} BYPASSRLS" not in out.stderr and "app-secret" not in out.stderr
    finally:
        with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP ROLE {app}")


def test_an_unknown_revision_or_a_dsn_that_is_no_url_is_a_usage_error() -> None:
    """A tester's ``--downgrade nosuch`` was 'migrate: failed: CommandError' and a DSN
    ``notadsn`` 'migrate: failed: ArgumentError', both exit 2 (as if the database had
    refused): now usage errors (64) that say what to change, before any connection."""
    unknown = _migrate("--downgrade", "nosuch", "postgresql://nobody:pw-secret@127.0.0.1:1/db")
    assert unknown.returncode == 64, (unknown.stdout, unknown.stderr)
    assert "--downgrade nosuch: no such revision" in unknown.stderr and "pw-secret" not in unknown.stderr
    for dsn in ("notadsn", "127.0.0.1:5432"):
        bad = _migrate(dsn)
        assert bad.returncode == 64 and "must be a PostgreSQL URL" in bad.stderr, (dsn, bad.stderr)
    for revision in (BASELINE, "base", HEAD):  # known ones still reach the database
        known = _migrate("--downgrade", revision, "postgresql://nobody:pw-secret@127.0.0.1:1/db")
        assert known.returncode == 2 and "OperationalError" in known.stderr, (revision, known.stderr)


def test_a_postgres_scheme_dsn_migrates_like_a_postgresql_one(readme_owner: str) -> None:
    """``postgres://`` is a DSN the settings and libpq take, but migrate failed on it with
    'migrate: failed: NoSuchModuleError' (SQLAlchemy has no ``postgres`` dialect)."""
    up = _migrate(readme_owner.replace("postgresql://", "postgres://", 1))
    assert (up.returncode, up.stdout.strip()) == (0, f"migrated to {HEAD}"), up.stderr
