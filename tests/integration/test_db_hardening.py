"""What the database refuses the application roles, and the owner (issue 13, items 3-5):
row-level security FORCEd on the owner, functions that a temporary relation cannot
hijack, no TEMP for the application, and an audit trail only the database writes
(R-AUTH-4, R-Q-5)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db import admin
from qimpl.db.roles import refuse_unsafe_role
from qimpl.errors import UnsafeDatabaseRole
from qualify.stack._embedded import API_ROLE, WORKER_ROLE, with_user

OWNER = "qimpl_test_owner"


@pytest.fixture
def db(stack: Any) -> str:
    """A database with one running run of tenant t-a, and a non-superuser role that owns
    the tenant tables (as on managed PostgreSQL, where the migrating role is no superuser)."""
    dsn = str(stack.create_database())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{OWNER}')"
                     f" THEN CREATE ROLE {OWNER} LOGIN NOSUPERUSER NOBYPASSRLS; END IF; END $$")
        for table in ("runs", "run_transitions", "workspace_grants"):
            conn.execute(f"ALTER TABLE {table} OWNER TO {OWNER}")
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at) VALUES (%s, 't-a', 'p', 'a', 'running', 'x', 'k',"
                     " now() + interval '1 hour')", (str(uuid.uuid4()),))
    return dsn


def _as(dsn: str, role: str, tenant: str | None = None) -> psycopg.Connection[Any]:
    conn = psycopg.connect(with_user(dsn, role), autocommit=True)
    if tenant is not None:
        conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
    return conn


def _run_id(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return str(conn.execute("SELECT run_id FROM runs").fetchone()[0])  # type: ignore[index]


@pytest.mark.req("R-AUTH-4")
def test_row_level_security_binds_the_tables_owner(db: str) -> None:
    with _as(db, OWNER) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)  # no tenant: nothing
        assert conn.execute("SELECT count(*) FROM run_transitions").fetchone() == (0,)
        conn.execute("SELECT set_config('qimpl.tenant', 't-b', false)")
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)  # another tenant's
    with psycopg.connect(db, autocommit=True) as conn:
        forced = conn.execute("SELECT relname FROM pg_class WHERE relrowsecurity"
                              " AND NOT relforcerowsecurity AND relkind = 'r'"
                              " AND relnamespace = 'public'::regnamespace").fetchall()
    assert forced == [], f"row-level security not forced on {forced}"


@pytest.mark.req("R-AUTH-4")
@pytest.mark.req("R-AUTH-2")
def test_owner_run_admin_tools_still_work(db: str) -> None:
    with _as(db, OWNER) as conn:
        admin.grant_workspace(conn, tenant_id="t-a", principal_id="p", workspace_id="w",
                              grant_token="g")
        assert admin.revoke_workspace(conn, tenant_id="t-a", principal_id="p", workspace_id="w") == 1
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT revoked_at IS NOT NULL FROM workspace_grants"
                            " WHERE tenant_id = 't-a' AND workspace_id = 'w'").fetchone() == (True,)


@pytest.mark.req("R-AUTH-4")
@pytest.mark.parametrize(("role", "problem"), [
    ("postgres", "a superuser"), (OWNER, "the owner"), ("member", "the owner"),
])
def test_start_up_refuses_roles_that_escape_row_level_security(db: str, role: str, problem: str) -> None:
    if role == "member":  # a member of the owner's role, e.g. a managed database's admin
        role = "qimpl_test_owner_member"
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}')"
                         f" THEN CREATE ROLE {role} LOGIN NOSUPERUSER IN ROLE {OWNER}; END IF; END $$")

    async def check(who: str) -> None:
        async with await psycopg.AsyncConnection.connect(with_user(db, who), autocommit=True) as conn:
            await refuse_unsafe_role(conn, "API", logging.getLogger("test"))

    with pytest.raises(UnsafeDatabaseRole, match=problem) as refused:
        asyncio.run(check(role))
    assert refused.value.code == "database_role_unsafe"
    for safe in (API_ROLE, WORKER_ROLE):
        asyncio.run(check(safe))  # the restricted roles start


@pytest.mark.req("R-AUTH-4")
def test_functions_pin_their_search_path_with_pg_temp_last(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.proconfig FROM pg_proc p"
            " WHERE p.pronamespace = 'public'::regnamespace"
            " AND (p.prosecdef OR p.prorettype = 'trigger'::regtype) ORDER BY 1").fetchall()
    assert {r[0] for r in rows} >= {"runs_transition_guard", "runs_record_transition",
                                    "runs_forbid_delete", "tool_invocations_guard",
                                    "qimpl_authenticate", "qimpl_authenticate_operator",
                                    "qimpl_stream_tenant", "qimpl_tenant_of_run"}
    # The takeover watcher's orphan query also plans without nested loops (its lock table
    # is estimated at one row: 20261213_100000_watcher_scale); nothing else is set.
    extra = {"qimpl_lease_orphans": ["enable_nestloop=off"]}
    for name, config in rows:
        assert config == ["search_path=pg_catalog, public, pg_temp", *extra.get(name, [])], (name, config)


@pytest.mark.req("R-AUTH-4")
@pytest.mark.parametrize("role", [API_ROLE, WORKER_ROLE])
def test_application_roles_cannot_create_temporary_relations(db: str, role: str) -> None:
    with _as(db, role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TEMP TABLE run_allowed_transitions (from_state text, to_state text)")


@pytest.mark.req("R-STATE-1")
@pytest.mark.req("R-AUTH-4")
def test_a_temporary_table_cannot_open_the_guard(db: str) -> None:
    """Even a role that may create temporary tables (here: TEMP granted back for the test)
    does not get an illegal transition past the guard by shadowing its table."""
    run_id = _run_id(db)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO qimpl_app',"
                      " current_database()); END $$")
    with _as(db, WORKER_ROLE, "t-a") as conn:
        conn.execute("CREATE TEMP TABLE run_allowed_transitions AS"
                     " SELECT 'running'::text AS from_state, 'accepted'::text AS to_state")
        with pytest.raises(psycopg.Error) as refused:  # running -> accepted is not allowed
            conn.execute("UPDATE runs SET state = 'accepted', row_version = row_version + 1"
                         " WHERE run_id = %s", (run_id,))
    assert refused.value.sqlstate == "QG002"


@pytest.mark.req("R-Q-5")
@pytest.mark.req("R-AUTH-4")
@pytest.mark.parametrize("role", [API_ROLE, WORKER_ROLE])
def test_the_audit_trail_is_written_only_by_the_database(db: str, role: str) -> None:
    run_id = _run_id(db)
    with _as(db, role, "t-a") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO run_transitions (run_id, tenant_id, row_version, new_state,"
                         " generation) VALUES (%s, 't-a', 99, 'completed', 1)", (run_id,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE run_transitions SET new_state = 'completed' WHERE run_id = %s",
                         (run_id,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE run_checkpoints SET answer = 'forged' WHERE run_id = %s", (run_id,))
        # The run's own fenced write is still recorded, by the trigger with the owner's rights.
        conn.execute("UPDATE runs SET state = 'running', owner_attempt = 2,"
                     " row_version = row_version + 1 WHERE run_id = %s", (run_id,))
    with psycopg.connect(db, autocommit=True) as conn:
        recorded = conn.execute("SELECT new_state FROM run_transitions"
                                " WHERE run_id = %s ORDER BY id", (run_id,)).fetchall()
    assert [r[0] for r in recorded] == ["running", "running"]  # the insert and the update only


@pytest.mark.req("R-AUTH-2")
def test_revoking_a_grant_that_is_not_live_warns(db: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """An operator's finding: ``api_keys revoke`` of a grant that does not exist printed
    ``revoked 0`` and nothing else. Still exit 0 (a repeated revoke is idempotent), with a
    warning naming what was asked."""
    from qimpl.scripts.api_keys import main

    monkeypatch.setenv("QIMPL_ADMIN_DATABASE_URL", db)
    args = ["--tenant", "t-a", "--principal", "p", "--workspace", "w"]
    assert main(["grant", *args, "--grant-token", "g"]) == 0
    capsys.readouterr()
    assert main(["revoke", *args]) == 0
    first = capsys.readouterr()
    assert "revoked 1" in first.out and "warning" not in first.err
    assert main(["revoke", *args]) == 0
    again = capsys.readouterr()
    assert "revoked 0" in again.out and "no live grant for tenant 't-a'" in again.err
