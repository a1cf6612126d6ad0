"""Lease sessions that carry many runs' locks (``qimpl.db.lease_carriers``, issue 55,
R-EXEC-2 as amended, R-EXEC-14): one backend holds the locks of several runs, each run's
statements run alone on it under its own tenant and writer, a second attempt of a run the
worker owns is refused before it asks for the lock, a lease gives its lock back while the
session goes on, and a lost session ends the ownership of exactly the runs it carried."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db.lease import OwnershipLease, lease_carriers, lock_key_sql
from qimpl.db.lease_carriers import AlreadyOwned, LeaseCarriers
from qimpl.errors import LostOwnership
from qualify.owner_sessions import LEASE_PIDS_SQL
from qualify.stack._embedded import WORKER_ROLE, with_user

pytestmark = pytest.mark.integration

LEASE_S = 1.5


@pytest.fixture(scope="module")
def dsns(stack: Any) -> tuple[str, str]:
    admin = str(stack.create_database())
    return admin, with_user(admin, WORKER_ROLE)


def _run(admin: str, tenant: str) -> str:
    run_id = str(uuid.uuid4())
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                  " deadline_at) VALUES (%s, %s, 'p', 'a', 'queued', 'x', 'k', now() + interval '1 hour')",
                  (run_id, tenant))
    return run_id


def _carriers(dsn: str, runs_per_session: int, max_runs: int = 10) -> LeaseCarriers:
    return lease_carriers(dsn, lease_s=LEASE_S, runs_per_session=runs_per_session, max_runs=max_runs)


def _lease(dsn: str, run_id: str, tenant: str, carriers: LeaseCarriers) -> OwnershipLease:
    return OwnershipLease(dsn, run_id, lease_s=LEASE_S, application_name=f"qimpl-owner:{run_id}",
                          tenant_id=tenant, carriers=carriers, writer=f"{run_id}:1:1")


def _holders(admin: str, run_id: str) -> list[int]:
    with psycopg.connect(admin, autocommit=True) as c:
        return [int(r[0]) for r in c.execute(f"SELECT pid FROM {LEASE_PIDS_SQL} p", (run_id,))]


@pytest.mark.req("R-EXEC-2")
def test_one_session_carries_the_locks_of_runs_of_several_tenants(dsns: tuple[str, str]) -> None:
    admin, dsn = dsns
    a, b = _run(admin, "ta"), _run(admin, "tb")

    async def go() -> tuple[list[int], list[int], Any, Any]:
        carriers = _carriers(dsn, runs_per_session=10)
        try:
            async with _lease(dsn, a, "ta", carriers) as la, _lease(dsn, b, "tb", carriers) as lb:
                pa, pb = _holders(admin, a), _holders(admin, b)
                # Each run's statement runs under its own tenant (row-level security) and
                # writer, however the two interleave on the one session.
                async def read(lease: OwnershipLease, run: str) -> Any:
                    cur = await lease.conn.execute(
                        "SELECT run_id::text, current_setting('qimpl.owner') FROM runs WHERE run_id = %s",
                        (run,))
                    return await cur.fetchall()

                ra, rb = await asyncio.gather(read(la, a), read(lb, b))
                return pa, pb, ra, rb
        finally:
            await carriers.close()

    pa, pb, ra, rb = asyncio.run(go())
    assert len(pa) == 1 and pa == pb  # one backend holds both locks
    assert ra == [(a, f"{a}:1:1")] and rb == [(b, f"{b}:1:1")]
    assert _holders(admin, a) == [] and _holders(admin, b) == []  # given back at the end


@pytest.mark.req("R-EXEC-2")
def test_a_second_attempt_of_an_owned_run_is_refused_before_the_lock(dsns: tuple[str, str]) -> None:
    # A session advisory lock is re-entrant: on the carrier a second pg_try_advisory_lock
    # would succeed. The worker refuses the second attempt itself, and the first lease's
    # end then leaves the lock free (one unlock for one lock).
    admin, dsn = dsns
    run = _run(admin, "t")

    async def go() -> tuple[bool, list[int], list[int]]:
        carriers = _carriers(dsn, runs_per_session=10)
        try:
            async with _lease(dsn, run, "t", carriers):
                try:
                    async with _lease(dsn, run, "t", carriers):
                        refused = False
                except AlreadyOwned:
                    refused = True
                during = _holders(admin, run)
            after = _holders(admin, run)
            return refused, during, after
        finally:
            await carriers.close()

    refused, during, after = asyncio.run(go())
    assert refused and len(during) == 1 and after == []


@pytest.mark.req("R-EXEC-14")
def test_a_lost_session_moves_exactly_the_runs_it_carried(dsns: tuple[str, str]) -> None:
    # Two runs a session, three runs: two sessions. Terminating the first run's session
    # ends the ownership of the two runs it carried, at their next touch; the third goes on.
    admin, dsn = dsns
    runs = [_run(admin, "t") for _ in range(3)]

    async def go() -> tuple[int, dict[str, bool]]:
        carriers = _carriers(dsn, runs_per_session=2)
        try:
            leases = [_lease(dsn, r, "t", carriers) for r in runs]
            for lease in leases:
                await lease.__aenter__()
            sessions = carriers.sessions
            victim = _holders(admin, runs[0])[0]
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(%s, 5000)", (victim,))
            carried = {r: victim in _holders(admin, r) for r in runs}
            lost: dict[str, bool] = {}
            for _ in range(40):  # the carrier's keeper touches every lease / 4
                await asyncio.sleep(LEASE_S / 8)
                for run, lease in zip(runs, leases, strict=True):
                    try:
                        await lease.touch()
                        lost[run] = False
                    except LostOwnership:
                        lost[run] = True
                if sum(lost.values()) >= 2:
                    break
            for lease in leases:
                await lease.__aexit__(None, None, None)
            assert not any(carried.values())  # its locks went with it
            return sessions, lost
        finally:
            await carriers.close()

    sessions, lost = asyncio.run(go())
    assert sessions == 2
    assert lost[runs[0]] and sorted(lost.values()) == [False, True, True], lost


@pytest.mark.req("R-EXEC-2")
def test_a_statement_of_one_run_never_runs_inside_another_runs_transaction(dsns: tuple[str, str]) -> None:
    admin, dsn = dsns
    a, b = _run(admin, "t"), _run(admin, "t")

    async def go() -> Any:
        carriers = _carriers(dsn, runs_per_session=10)
        try:
            async with _lease(dsn, a, "t", carriers) as la, _lease(dsn, b, "t", carriers) as lb:
                entered = asyncio.Event()

                async def in_a_transaction() -> None:
                    async with la.conn.transaction():
                        await la.conn.execute("SELECT pg_current_xact_id()")
                        entered.set()
                        await asyncio.sleep(0.2)  # the other run asks for the session meanwhile

                async def other() -> Any:
                    await entered.wait()
                    return (await (await lb.conn.execute("SELECT pg_current_xact_id_if_assigned()")).fetchone())

                _, seen = await asyncio.gather(in_a_transaction(), other())
                return seen
        finally:
            await carriers.close()

    assert asyncio.run(go()) == (None,)  # not inside the other's transaction


@pytest.mark.req("R-EXEC-11")
def test_a_lease_gives_its_lock_back_and_the_session_goes_on(dsns: tuple[str, str]) -> None:
    admin, dsn = dsns
    a, b = _run(admin, "t"), _run(admin, "t")

    async def go() -> tuple[list[int], list[int], bool]:
        carriers = _carriers(dsn, runs_per_session=10)
        try:
            async with _lease(dsn, b, "t", carriers):
                async with _lease(dsn, a, "t", carriers):
                    pass
                free = _holders(admin, a)
                held = _holders(admin, b)
                # Another session may take a's lock now: it is free, not merely unused.
                with psycopg.connect(dsn, autocommit=True) as c:
                    took = bool(c.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (a,)).fetchone()[0])  # type: ignore[index]
            return free, held, took
        finally:
            await carriers.close()

    free, held, took = asyncio.run(go())
    assert free == [] and len(held) == 1 and took
