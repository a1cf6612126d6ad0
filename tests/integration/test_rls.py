"""Tenant isolation in PostgreSQL itself (R-AUTH-4): the application roles are restricted,
a session without tenant context sees no rows, and one tenant cannot read or write
another's."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from qualify.stack._embedded import API_ROLE, WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    db = stack.create_database()
    with psycopg.connect(db, autocommit=True) as conn:
        for tenant in ("t-a", "t-b"):
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                         " stream_key, deadline_at) VALUES (%s, %s, 'p', 'a', 'queued', 'x', 'k',"
                         " now() + interval '1 hour')", (str(uuid.uuid4()), tenant))
    return str(db)


def _as(dsn: str, role: str, tenant: str | None) -> psycopg.Connection[Any]:
    conn = psycopg.connect(with_user(dsn, role), autocommit=True)
    if tenant is not None:
        conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
    return conn


@pytest.mark.req("R-AUTH-4")
def test_application_roles_are_restricted(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT rolname, rolsuper, rolbypassrls FROM pg_roles"
                            " WHERE rolname IN (%s, %s, 'qimpl_app') ORDER BY 1",
                            (API_ROLE, WORKER_ROLE)).fetchall()
    assert [r[0] for r in rows] == ["qimpl_api", "qimpl_app", "qimpl_worker"]
    assert all(not r[1] and not r[2] for r in rows)


@pytest.mark.req("R-AUTH-4")
@pytest.mark.parametrize("role", [API_ROLE, WORKER_ROLE])
def test_no_tenant_context_sees_no_rows(dsn: str, role: str) -> None:
    with _as(dsn, role, None) as conn:
        for table in ("runs", "run_transitions", "run_checkpoints", "idempotency_records",
                      "workspace_grants"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM api_keys")


@pytest.mark.req("R-AUTH-4")
def test_one_tenant_cannot_read_or_write_another(dsn: str) -> None:
    with _as(dsn, API_ROLE, "t-a") as conn:
        assert conn.execute("SELECT DISTINCT tenant_id FROM runs").fetchall() == [("t-a",)]
        updated = conn.execute("UPDATE runs SET state = 'cancelled', row_version = row_version + 1"
                               " WHERE tenant_id = 't-b'").rowcount
        assert updated == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # WITH CHECK
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                         " stream_key, deadline_at) VALUES (%s, 't-b', 'p', 'a', 'accepted', 'x', 'k',"
                         " now() + interval '1 hour')", (str(uuid.uuid4()),))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT state FROM runs WHERE tenant_id = 't-b'").fetchone() == ("queued",)


@pytest.mark.req("R-AUTH-4")
def test_a_tenant_writes_its_own_rows(dsn: str) -> None:
    with _as(dsn, WORKER_ROLE, "t-a") as conn:
        run_id = conn.execute("SELECT run_id::text FROM runs").fetchone()[0]
        conn.execute("UPDATE runs SET state = 'running', row_version = row_version + 1 WHERE run_id = %s",
                     (run_id,))
        transitions = conn.execute("SELECT count(*) FROM run_transitions WHERE run_id = %s",
                                   (run_id,)).fetchone()[0]
    assert transitions == 2  # the insert and this update, recorded under RLS
