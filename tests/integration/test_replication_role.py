"""``session_replication_role = replica`` switches no guard off (issue 56, item 4; R-STATE-1,
R-EXEC-3, R-Q-5, R-AUTH-4).

PostgreSQL skips every ordinary trigger in a session in the ``replica`` replication role.
A role granted ``SET ON PARAMETER session_replication_role`` wrote ``running -> completed``
with no ``row_version`` bump and no audit row before ``20261213_090000_hardening_four``:
the guards and the audit now fire ``ALWAYS``, and the start-up role check refuses such a
role (``database_role_unsafe``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from qimpl.db.roles import refuse_unsafe_role
from qimpl.errors import UnsafeDatabaseRole
from qualify.stack._embedded import WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def db(stack: Any) -> str:
    return str(stack.create_database())


@pytest.fixture(scope="module")
def replica_role(db: str) -> Iterator[str]:
    """A login role in qimpl_app that may ``SET session_replication_role``."""
    role = f"qimpl_srr_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE qimpl_app")
        conn.execute(f"GRANT SET ON PARAMETER session_replication_role TO {role}")
    try:
        yield role
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"REVOKE SET ON PARAMETER session_replication_role FROM {role}")
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _running_run(db: str) -> str:
    """A ``running`` run of tenant ``t-r`` owned by attempt 1, seeded by the superuser."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at, owner_attempt) VALUES (%s, 't-r', 'p', 'a', 'running',"
                     " 'x', 'k', now() + interval '1 hour', 1)", (run_id,))
    return run_id


def _replica(db: str, role: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(with_user(db, role), autocommit=True)
    conn.execute("SELECT set_config('qimpl.tenant', 't-r', false)")
    conn.execute("SET session_replication_role = replica")
    assert conn.execute("SHOW session_replication_role").fetchone() == ("replica",)
    return conn


def _sqlstate(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> str | None:
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


@pytest.mark.req("R-STATE-1")
@pytest.mark.req("R-Q-5")
@pytest.mark.req("R-AUTH-4")
def test_a_replica_session_is_refused_an_illegal_write_and_its_legal_one_is_audited(
        db: str, replica_role: str) -> None:
    run_id = _running_run(db)
    with _replica(db, replica_role) as conn:
        # running -> completed without the row_version bump: the guard still refuses it.
        assert _sqlstate(conn, "UPDATE runs SET state = 'completed' WHERE run_id = %s",
                         (run_id,)) == "QG003"
        # A checkpoint the owner's fenced write did not make: the checkpoint guard refuses it.
        assert _sqlstate(conn, "INSERT INTO run_checkpoints (run_id, step, generation, attempt,"
                               " row_version, state_json, answer) VALUES (%s, 0, 1, 1, 1, '{}', 'forged')",
                         (run_id,)) == "QG015"
        # A tool call's intent from no owner (another attempt): the tool journal's guard refuses it.
        assert _sqlstate(conn, "INSERT INTO tool_invocations (run_id, call_id, tenant_id, generation, step,"
                               " position, tool, kind, arguments, arguments_digest, status,"
                               " intent_attempt, intent_row_version) VALUES (%s, 'c-1', 't-r', 1, 1, 0,"
                               " 'charge', 'side_effect', '{}', 'd', 'intent', 9, 1)", (run_id,)) == "QG009"
        # A legal write in replica mode is stamped and audited like any other.
        conn.execute("UPDATE runs SET state = 'completed', row_version = row_version + 1"
                     " WHERE run_id = %s", (run_id,))
        # ... and the run is terminal for this session too.
        assert _sqlstate(conn, "UPDATE runs SET state = 'running', row_version = row_version + 1"
                               " WHERE run_id = %s", (run_id,)) == "QG001"
    with psycopg.connect(db, autocommit=True) as conn:
        audit = conn.execute("SELECT row_version, old_state, new_state, writer_role FROM run_transitions"
                             " WHERE run_id = %s ORDER BY id", (run_id,)).fetchall()
        events = conn.execute("SELECT kind FROM run_events WHERE run_id = %s ORDER BY seq",
                              (run_id,)).fetchall()
    assert audit == [(1, None, "running", "postgres"), (2, "running", "completed", replica_role)]
    assert ("terminal",) in events, events


@pytest.mark.req("R-AUTH-4")
def test_every_trigger_fires_always(db: str) -> None:
    """Each trigger of the schema fires in every replication role (``tgenabled = 'A'``):
    a trigger a later migration adds must be enabled ``ALWAYS`` too."""
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute("SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t"
                            " JOIN pg_class c ON c.oid = t.tgrelid"
                            " WHERE NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace"
                            " ORDER BY 1, 2").fetchall()
    assert len(rows) >= 20
    assert [r for r in rows if r[2] != "A"] == []


@pytest.mark.req("R-AUTH-4")
def test_start_up_refuses_a_role_that_may_set_the_replication_role(db: str, replica_role: str) -> None:
    async def check(dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await refuse_unsafe_role(conn, "worker", logging.getLogger("test"))

    with pytest.raises(UnsafeDatabaseRole, match="may SET session_replication_role") as refused:
        asyncio.run(check(with_user(db, replica_role)))
    assert refused.value.code == "database_role_unsafe"
    # A session started in replica mode (a role's default set by an administrator) is
    # refused too, whoever may set it.
    role = f"qimpl_srr_default_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE qimpl_app")
        conn.execute(f"ALTER ROLE {role} SET session_replication_role = replica")
    try:
        with pytest.raises(UnsafeDatabaseRole, match="session_replication_role = replica"):
            asyncio.run(check(with_user(db, role)))
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")
    asyncio.run(check(with_user(db, WORKER_ROLE)))  # the restricted role starts
