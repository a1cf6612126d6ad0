"""The worker's SECURITY DEFINER functions are the worker's alone, and pruning keeps a
stream at least the owner's floor (issue 56, item 5; R-AUTH-4, R-EXEC-13, R-EVENT-5).

``qimpl_lease_orphans`` and ``qimpl_prune_event_streams`` were granted to ``qimpl_app``,
which the API's role is a member of: as the API with no tenant set,
``qimpl_lease_orphans(1000)`` returned runs of two tenants and a Temporal task token, and
``qimpl_prune_event_streams(0, …)`` deleted a run's journal the moment it ended. Since
``20261213_090000_hardening_four`` both are granted to ``qimpl_worker_role`` only, and the
retention a prune uses is at least ``event_retention_floor.seconds`` (60 s)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db.roles import refuse_unsafe_role
from qimpl.errors import IncompleteDatabaseRole, UnsafeDatabaseRole
from qualify.stack._embedded import API_ROLE, WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def db(stack: Any) -> str:
    return str(stack.create_database())


def _run(db: str, tenant: str, state: str, token: bytes | None = None) -> str:
    """A run of ``tenant`` seeded by the superuser: ``running`` (with ``token``) or ended
    (``cancelled`` just now, its events journaled)."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                     " deadline_at) VALUES (%s, %s, 'p', 'a', 'queued', 'x', 'k', now() + interval '1 hour')",
                     (run_id, tenant))
        if state == "running":
            conn.execute("UPDATE runs SET state = 'running', row_version = row_version + 1, owner_attempt = 1,"
                         " owner_task_token = %s WHERE run_id = %s", (token, run_id))
        else:
            conn.execute("UPDATE runs SET state = %s, row_version = row_version + 1,"
                         " completed_at = clock_timestamp() WHERE run_id = %s", (state, run_id))
    return run_id


def _sqlstate(dsn: str, tenant: str | None, sql: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if tenant is not None:
            conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
        try:
            conn.execute(sql)
        except psycopg.Error as exc:
            return exc.sqlstate
    return None


@pytest.mark.req("R-AUTH-4")
@pytest.mark.req("R-EXEC-13")
@pytest.mark.parametrize("tenant", [None, "t-a"], ids=["no-tenant", "tenant-set"])
def test_the_api_role_may_not_call_the_workers_functions(db: str, tenant: str | None) -> None:
    _run(db, "t-a", "running", b"token-a")
    _run(db, "t-b", "running", b"token-b")
    api = with_user(db, API_ROLE)
    assert _sqlstate(api, tenant, "SELECT * FROM qimpl_lease_orphans(1000)") == "42501"
    assert _sqlstate(api, tenant, "SELECT qimpl_prune_event_streams(3600, 'api', 100)") == "42501"
    # The worker still may: its watcher sees every tenant's orphans.
    with psycopg.connect(with_user(db, WORKER_ROLE), autocommit=True) as worker:
        tenants = {r[0] for r in worker.execute("SELECT tenant_id FROM qimpl_lease_orphans(1000)")}
    assert tenants >= {"t-a", "t-b"}


def _events(db: str, run_id: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM run_events WHERE run_id = %s", (run_id,)).fetchone()[0])


@pytest.mark.req("R-EVENT-5")
def test_a_retention_below_the_floor_prunes_nothing_recent(db: str) -> None:
    ended = _run(db, "t-floor", "cancelled")
    before = _events(db, ended)
    assert before > 0
    with psycopg.connect(with_user(db, WORKER_ROLE), autocommit=True) as worker:
        worker.execute("SELECT set_config('qimpl.tenant', 't-floor', false)")
        for retention in (0, -3600, 59):
            pruned = worker.execute("SELECT qimpl_prune_event_streams(%s, 'r', 100)", (retention,)).fetchone()
            assert pruned == (0,), retention
        with pytest.raises(psycopg.DataError):  # an interval out of range: nothing pruned
            worker.execute("SELECT qimpl_prune_event_streams('NaN', 'r', 100)")
    assert _events(db, ended) == before
    with psycopg.connect(db, autocommit=True) as owner:
        assert owner.execute("SELECT count(*) FROM run_event_prunes WHERE run_id = %s",
                             (ended,)).fetchone() == (0,)
        # The floor is the schema owner's: lowered, the same call prunes that stream.
        owner.execute("UPDATE event_retention_floor SET seconds = 0")
    try:
        with psycopg.connect(with_user(db, WORKER_ROLE), autocommit=True) as worker:
            worker.execute("SELECT set_config('qimpl.tenant', 't-floor', false)")
            assert worker.execute("SELECT qimpl_prune_event_streams(0, 'r', 100)").fetchone() == (1,)
            # ... and no application role may read or move it.
            for role in (WORKER_ROLE, API_ROLE):
                assert _sqlstate(with_user(db, role), None,
                                 "UPDATE event_retention_floor SET seconds = 0") == "42501"
                assert _sqlstate(with_user(db, role), None, "SELECT * FROM event_retention_floor") == "42501"
    finally:
        with psycopg.connect(db, autocommit=True) as owner:
            owner.execute("UPDATE event_retention_floor SET seconds = 60")
    assert _events(db, ended) == 0


@pytest.mark.req("R-AUTH-4")
def test_start_up_checks_who_has_the_worker_role(db: str) -> None:
    async def check(role: str, *, worker_functions: bool) -> None:
        async with await psycopg.AsyncConnection.connect(with_user(db, role), autocommit=True) as conn:
            await refuse_unsafe_role(conn, "worker" if worker_functions else "API",
                                     logging.getLogger("test"), worker_functions=worker_functions)

    asyncio.run(check(WORKER_ROLE, worker_functions=True))
    asyncio.run(check(API_ROLE, worker_functions=False))
    with pytest.raises(IncompleteDatabaseRole, match="without qimpl_worker_role") as incomplete:
        asyncio.run(check(API_ROLE, worker_functions=True))
    assert incomplete.value.code == "database_role_incomplete"
    with pytest.raises(UnsafeDatabaseRole, match="a member of qimpl_worker_role") as unsafe:
        asyncio.run(check(WORKER_ROLE, worker_functions=False))
    assert unsafe.value.code == "database_role_unsafe"
