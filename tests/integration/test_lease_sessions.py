"""The worker's ready lease sessions (``qimpl.db.lease_sessions``, issue 21): a pooled
session serves one lease at a time with every lease setting applied and read back at
claim (R-EXEC-2, R-EXEC-11); it goes back to the pool only after a clean end, with the
run's lock already free and nothing of the lease left; any other end closes it; one that
PostgreSQL ended while it waited is replaced before a lease uses it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import pq

from qimpl.db import lease_sessions
from qimpl.db.lease import LeaseNotBounded, OwnershipLease, client_params, lock_key_sql
from qimpl.db.lease_sessions import IDLE_APPLICATION_NAME, LeaseSessions
from qimpl.db.owner import RunOwner
from qimpl.errors import LeaseSessionUnavailable, LostOwnership
from qualify.stack._embedded import WORKER_ROLE, with_user
from tests.integration.test_lease import _IgnoredSettings

LEASE_S = 1.5


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return with_user(str(stack.create_database()), WORKER_ROLE)


def _sessions(dsn: str) -> LeaseSessions:
    return LeaseSessions(dsn, lease_s=LEASE_S, max_size=1, min_size=1,
                         connect_params=client_params(LEASE_S))


@contextlib.asynccontextmanager
async def _ready(dsn: str) -> AsyncIterator[LeaseSessions]:
    """One ready session, open for the block and closed after it."""
    sessions = _sessions(dsn)
    await sessions.open()
    try:
        yield sessions
    finally:
        await sessions.close()


async def _waiting_pid(sessions: LeaseSessions) -> int:
    """The backend pid of the session waiting in ``sessions`` (left there)."""
    conn = await sessions.acquire(timeout_s=5)
    try:
        return int((await _state(conn))[0])
    finally:
        await sessions.release(conn, reuse=True)


def _lease(dsn: str, run_id: str, sessions: LeaseSessions | None,
           cls: type[OwnershipLease] = OwnershipLease) -> OwnershipLease:
    return cls(dsn, run_id, lease_s=LEASE_S, application_name=f"lease-test:{run_id}",
               tenant_id="t", sessions=sessions)


async def _state(conn: psycopg.AsyncConnection[Any]) -> tuple[Any, ...]:
    """(backend pid, application_name, tenant, idle_session_timeout, lock_timeout,
    advisory locks held) of ``conn``'s own session."""
    cur = await conn.execute(
        "SELECT pg_backend_pid(), current_setting('application_name'),"
        " coalesce(current_setting('qimpl.tenant', true), ''),"
        " current_setting('idle_session_timeout'), current_setting('lock_timeout'),"
        " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())")
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def _lock_is_free(dsn: str, run_id: str) -> bool:
    """Whether another session takes ``run_id``'s lock at once (it lets it go again)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        cur = await other.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (run_id,))
        row = await cur.fetchone()
        return bool(row and row[0])


async def _alive(dsn: str, pid: int) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        cur = await other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return await cur.fetchone() == (1,)


@pytest.mark.req("R-EXEC-2", "R-EXEC-11")
def test_a_clean_lease_gives_its_session_back_unlocked_and_reset(dsn: str) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())

    async def go() -> None:
        async with _ready(dsn) as sessions:
            async with _lease(dsn, first, sessions) as lease:
                pid, name, tenant, idle, lock, held = await _state(lease.conn)
                assert (name, tenant, idle, lock, held) == (f"lease-test:{first}", "t", "1500ms", "1500ms", 1)
                assert not await _lock_is_free(dsn, first), "another session took a held lease's lock"
            # Free the moment the lease ended: no wait, no retry.
            assert await _lock_is_free(dsn, first), "the run's lock outlived its clean lease"
            async with _lease(dsn, second, sessions) as lease:
                again = await _state(lease.conn)
                assert again == (pid, f"lease-test:{second}", "t", "1500ms", "1500ms", 1), \
                    "the second lease did not reuse the ready session with its own settings"
            conn = await sessions.acquire(timeout_s=5)
            try:
                assert await _state(conn) == (pid, IDLE_APPLICATION_NAME, "", "5min", "0", 0), \
                    "a session back in the pool kept something of its lease, or waits unbounded"
            finally:
                await sessions.release(conn, reuse=True)

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2")
def test_a_waiting_session_is_bounded_by_the_server_from_its_connect(dsn: str) -> None:
    """A session that never served a lease waits under the waiting bound too, so a paused
    or lost worker's pool gives its connection slots back (``WAITING_BOUND_S``)."""
    async def go() -> None:
        async with _ready(dsn) as sessions:
            conn = await sessions.acquire(timeout_s=5)
            try:
                assert (await _state(conn))[3] == f"{lease_sessions.WAITING_BOUND_S // 60}min"
            finally:
                await sessions.release(conn, reuse=True)

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2")
def test_no_ready_session_within_the_lease_is_its_own_error_not_a_lost_ownership(dsn: str) -> None:
    """Every session in use: the next lease waits at most the lease, then raises
    LeaseSessionUnavailable (the activity retries it and counts it apart from fenced
    owners), never psycopg_pool's PoolTimeout, an OperationalError the activity would
    report as a lost ownership."""
    async def go() -> None:
        async with _ready(dsn) as sessions, _lease(dsn, str(uuid.uuid4()), sessions):
            started = asyncio.get_running_loop().time()
            with pytest.raises(LeaseSessionUnavailable, match="no lease session ready"):
                async with _lease(dsn, str(uuid.uuid4()), sessions):
                    pass
            waited = asyncio.get_running_loop().time() - started
            assert LEASE_S <= waited < LEASE_S + 1.0, waited

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2")
def test_a_lease_that_ends_with_an_error_closes_its_session(dsn: str) -> None:
    run_id = str(uuid.uuid4())

    async def go() -> None:
        async with _ready(dsn) as sessions:
            with pytest.raises(RuntimeError):
                async with _lease(dsn, run_id, sessions) as lease:
                    pid = (await _state(lease.conn))[0]
                    raise RuntimeError("the owner failed")
            assert not await _alive(dsn, pid), "a failed lease's session was kept"
            assert await _lock_is_free(dsn, run_id)
            async with _lease(dsn, run_id, sessions) as lease:
                assert (await _state(lease.conn))[0] != pid

    asyncio.run(go())


@pytest.mark.req("R-EXEC-11")
def test_a_pooled_session_without_the_lease_timeouts_is_refused_and_closed(dsn: str) -> None:
    run_id = str(uuid.uuid4())

    async def go() -> None:
        async with _ready(dsn) as sessions:
            pid = await _waiting_pid(sessions)
            with pytest.raises(LeaseNotBounded):
                async with _lease(dsn, run_id, sessions, _IgnoredSettings):
                    pytest.fail("a lease without its timeouts was granted")
            assert await _lock_is_free(dsn, run_id), "a refused lease took the run's lock"
            assert not await _alive(dsn, pid), "the refused session went back to the pool"

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2")
def test_a_ready_session_the_server_ended_is_replaced(dsn: str) -> None:
    run_id = str(uuid.uuid4())

    async def go() -> None:
        async with _ready(dsn) as sessions:
            pid = await _waiting_pid(sessions)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            async with _lease(dsn, run_id, sessions) as lease:
                assert (await _state(lease.conn))[0] != pid

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2", "R-EXEC-11")
def test_an_owner_cannot_reach_its_session_once_its_lease_ended(dsn: str) -> None:
    """The session outlives the lease in the pool: a call the ended attempt still makes (a
    provider emitting output after its step returned) is refused before any statement,
    even while the same session serves the next run's lease."""
    first, second = str(uuid.uuid4()), str(uuid.uuid4())

    async def go() -> None:
        async with _ready(dsn) as sessions:
            async with _lease(dsn, first, sessions) as lease:
                owner = RunOwner(lease.conn, run_id=first, generation=1, attempt=1, row_version=1,
                                 deadline_left_s=60, live=lease.live)
                session = owner.conn
            with pytest.raises(LostOwnership):
                await owner.output_delta(1, "late")
            async with _lease(dsn, second, sessions) as lease:
                assert lease.conn is session, "the next lease did not get the same session"
                async with lease.conn.transaction():
                    await lease.conn.execute("SELECT 1")
                    with pytest.raises(LostOwnership):
                        await owner.output_delta(1, "late")
                    # Nothing reached the session: the next run's transaction is intact.
                    assert lease.conn.info.transaction_status == pq.TransactionStatus.INTRANS, \
                        "the ended owner's call ran inside the next run's transaction"
                assert (await _state(lease.conn))[1] == f"lease-test:{second}"

    asyncio.run(go())


@pytest.mark.req("R-EXEC-2")
def test_a_release_cancelled_mid_reset_closes_the_session_and_keeps_the_slot(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An activity cancelled (or a worker stopping) while its session is being reset: the
    session is closed, which frees the run's lock, and its pool slot is not lost (a review
    found each such cancel took one slot for good: PoolTimeout for every attempt after)."""
    run_id = str(uuid.uuid4())
    monkeypatch.setattr(lease_sessions, "RESET_SQL",
                        "SELECT pg_sleep(2); SELECT pg_advisory_unlock_all(); RESET ALL")

    async def go() -> None:
        async with _ready(dsn) as sessions:  # one session
            lease = _lease(dsn, run_id, sessions)
            await lease.__aenter__()
            pid = (await _state(lease.conn))[0]
            ending = asyncio.create_task(lease.__aexit__(None, None, None))
            await asyncio.sleep(0.3)  # inside the reset
            ending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ending
            assert await _lock_is_free(dsn, run_id), "the cancelled release kept the run's lock"
            assert not await _alive(dsn, pid), "the session of a cancelled reset was kept"
            assert await _waiting_pid(sessions) != pid  # the slot is there, with a new session

    asyncio.run(go())


def test_a_lease_for_another_lease_length_connects_its_own(dsn: str) -> None:
    sessions = _sessions(dsn)
    assert OwnershipLease(dsn, "r", lease_s=LEASE_S, application_name="a", tenant_id="t",
                          sessions=sessions).sessions is sessions
    assert OwnershipLease(dsn, "r", lease_s=LEASE_S * 2, application_name="a", tenant_id="t",
                          sessions=sessions).sessions is None
