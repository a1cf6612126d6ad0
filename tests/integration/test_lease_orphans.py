"""The takeover watcher's view of the database (R-EXEC-13): ``qimpl_lease_orphans`` lists a
``running`` run exactly while no session holds its advisory lock, across tenants, as the
worker role, and returns ids and the owner's token, never a run's content; the watcher's
election admits one session at a time."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db import takeover as db
from qimpl.db.lease import lock_key_sql
from qualify.stack._embedded import WORKER_ROLE, with_user

pytestmark = pytest.mark.integration


def _running(dsn: str, tenant: str, token: bytes | None) -> str:
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at) VALUES (%s, %s, 'p', 'a', 'queued', 'secret prompt', 'k',"
            " now() + interval '1 hour')", (run_id, tenant))
        c.execute("UPDATE runs SET state = 'running', row_version = row_version + 1, owner_attempt = 3,"
                  " owner_task_token = %s WHERE run_id = %s", (token, run_id))
    return run_id


async def _orphans(dsn: str) -> dict[str, db.Orphan]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return {o.run_id: o for o in await db.lease_orphans(conn)}


@pytest.mark.req("R-EXEC-13")
def test_a_running_run_is_an_orphan_exactly_while_its_lock_is_free(stack: Any) -> None:
    dsn = stack.create_database()
    worker = with_user(dsn, WORKER_ROLE)
    mine, other_tenant = _running(dsn, "t", b"tok-t"), _running(dsn, "u", None)
    found = asyncio.run(_orphans(worker))
    assert found[mine] == db.Orphan(run_id=mine, tenant_id="t", generation=1, owner_attempt=3,
                                    owner_task_token=b"tok-t")
    assert found[other_tenant].owner_task_token is None  # across tenants, under RLS
    with psycopg.connect(worker, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({lock_key_sql})", (mine,))
        assert mine not in asyncio.run(_orphans(worker))
        assert other_tenant in asyncio.run(_orphans(worker))
    assert mine in asyncio.run(_orphans(worker))  # the holder's session ended: free again
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE runs SET state = 'cancelled', row_version = row_version + 1 WHERE run_id = %s",
                  (mine,))
    assert mine not in asyncio.run(_orphans(worker))  # not running: never an orphan


@pytest.mark.req("R-EXEC-13")
def test_the_function_exposes_no_content_and_the_worker_cannot_read_other_tenants(stack: Any) -> None:
    dsn = stack.create_database()
    worker = with_user(dsn, WORKER_ROLE)
    run_id = _running(dsn, "u", b"tok")
    with psycopg.connect(worker, autocommit=True) as c:
        cols = [d.name for d in c.execute("SELECT * FROM qimpl_lease_orphans(10)").description or []]
        assert cols == ["run_id", "tenant_id", "generation", "owner_attempt", "owner_task_token"]
        c.execute("SELECT set_config('qimpl.tenant', 't', false)")
        assert c.execute("SELECT count(*) FROM runs WHERE run_id = %s", (run_id,)).fetchone() == (0,)


@pytest.mark.req("R-EXEC-13")
def test_one_watcher_at_a_time(stack: Any) -> None:
    worker = with_user(stack.create_database(), WORKER_ROLE)

    async def elect() -> tuple[bool, bool, bool, bool]:
        a = await psycopg.AsyncConnection.connect(worker, autocommit=True)
        b = await psycopg.AsyncConnection.connect(worker, autocommit=True)
        try:
            first, again, other = await db.hold_watch(a), await db.hold_watch(a), await db.hold_watch(b)
            await a.close()
            # The lock goes with the server's session, which ends a moment after the client
            # closes it: the other session wins it then, within a deadline.
            deadline = time.monotonic() + 5
            won = await db.hold_watch(b)
            while not won and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                won = await db.hold_watch(b)
            return first, again, other, won
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(elect()) == (True, True, False, True)


def _set(dsn: str, run_id: str, sql: str, *args: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"UPDATE runs SET row_version = row_version + 1, {sql} WHERE run_id = %s", (*args, run_id))


async def _listed(dsn: str, **kw: Any) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return [o.run_id for o in await db.lease_orphans(conn, **kw)]


@pytest.mark.req("R-EXEC-14")
def test_a_run_in_its_counted_failures_backoff_is_no_orphan_until_it_passes(stack: Any) -> None:
    # Its owner let it go on purpose (issue 55): the watcher must not describe it at
    # every look. By the database's clock: due in the past, it is an orphan again.
    dsn = stack.create_database()
    worker = with_user(dsn, WORKER_ROLE)
    waiting, due = _running(dsn, "t", None), _running(dsn, "t", None)
    _set(dsn, waiting, "retry_not_before = clock_timestamp() + interval '1 hour'")
    _set(dsn, due, "retry_not_before = clock_timestamp() - interval '1 millisecond'")
    listed = asyncio.run(_listed(worker))
    assert waiting not in listed and due in listed
    # The old one-argument function (a release still running during a rollout) is unchanged.
    with psycopg.connect(worker, autocommit=True) as c:
        assert (waiting,) in [(str(r[0]),) for r in c.execute("SELECT run_id FROM qimpl_lease_orphans(10)")]


@pytest.mark.req("R-EXEC-14")
def test_one_election_per_task_queue(stack: Any) -> None:
    worker = with_user(stack.create_database(), WORKER_ROLE)

    async def elect() -> tuple[bool, bool, bool]:
        x = await psycopg.AsyncConnection.connect(worker, autocommit=True)
        y = await psycopg.AsyncConnection.connect(worker, autocommit=True)
        try:
            return (await db.hold_watch(x, "queue-a"), await db.hold_watch(y, "queue-b"),
                    await db.hold_watch(y, "queue-a"))
        finally:
            await x.close()
            await y.close()

    # Each queue elects its own watcher: a watcher of queue-b never keeps queue-a's out
    # (with one election per database it did, and queue-a's moved retries were left).
    assert asyncio.run(elect()) == (True, True, False)


@pytest.mark.req("R-EXEC-14")
def test_orphans_page_by_run_id_and_the_listing_stays_linear(stack: Any) -> None:
    # 2,000 running runs, 1,500 of them locked by 10 sessions: one page of 100 after another
    # reaches all 500 orphans, and the plan reads the lock table once (a hash anti join,
    # no nested loop: with one, 2,000 runs took 670-920 ms a call, issue 55).
    dsn = stack.create_database()
    worker = with_user(dsn, WORKER_ROLE)
    ids = sorted(str(uuid.uuid4()) for _ in range(2000))
    with psycopg.connect(dsn, autocommit=True) as c, c.cursor() as cur:
        cur.executemany(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at) VALUES (%s, 't', 'p', 'a', 'queued', 'x', 'k', now() + interval '1 hour')",
            [(i,) for i in ids])
        c.execute("UPDATE runs SET state = 'running', row_version = row_version + 1, owner_attempt = 1")
        c.execute("ANALYZE runs")
    holders = [psycopg.connect(worker, autocommit=True) for _ in range(10)]
    try:
        for k, run_id in enumerate(ids[:1500]):
            holders[k % 10].execute(f"SELECT pg_advisory_lock({lock_key_sql})", (run_id,))
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = asyncio.run(_listed(worker, limit=100, after=after))
            pages.append(page)
            if len(page) < 100:
                break
            after = page[-1]
        assert [len(p) for p in pages] == [100] * 5 + [0]
        assert [r for p in pages for r in p] == ids[1500:]
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("LOAD 'auto_explain'")
            c.execute("SET auto_explain.log_min_duration = 0")
            c.execute("SET auto_explain.log_nested_statements = on")
            c.execute("SET client_min_messages = log")
            c.execute("SET auto_explain.log_level = notice")
            notices: list[str] = []
            c.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            c.execute("SELECT count(*) FROM qimpl_lease_orphans(100, NULL)").fetchone()
            plan = "\n".join(notices)
        assert "Hash Anti Join" in plan and "Nested Loop" not in plan, plan
    finally:
        for h in holders:
            h.close()
