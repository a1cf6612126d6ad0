"""The provider-call record (observed usage, R-Q34-2) against the real database: only the
owner at its fencing token records a call, before the deadline; a record settles once;
the run read counts every recorded call (R-EXEC-7, R-EXEC-8, R-AUTH-4)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from qimpl.db import usage as usage_db
from qimpl.db.lease import OwnershipLease
from qimpl.db.owner import RunOwner
from qimpl.errors import DeadlinePassed, LostOwnership
from qimpl.usage import run_usage
from qualify.stack._embedded import WORKER_ROLE, with_user
from tests.conftest import assert_eventually


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return str(stack.create_database())


def _running(dsn: str, *, attempt: int = 1, deadline: str = "1 hour") -> str:
    """A run of tenant ``t`` owned by ``attempt`` in generation 1, at row_version 3."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
            " deadline_at) VALUES (%s, 't', 'p', 'a', 'accepted', 'x', 'k', now() + %s::interval)",
            (run_id, deadline))
        conn.execute("UPDATE runs SET state = 'queued', row_version = 2 WHERE run_id = %s", (run_id,))
        conn.execute("UPDATE runs SET state = 'running', row_version = 3, owner_attempt = %s,"
                     " started_at = clock_timestamp() WHERE run_id = %s", (attempt, run_id))
    return run_id


def _owner(conn: psycopg.AsyncConnection[Any], run_id: str, *, attempt: int = 1,
           row_version: int = 3, generation: int = 1) -> RunOwner:
    return RunOwner(conn, run_id=run_id, generation=generation, attempt=attempt,
                    row_version=row_version, deadline_left_s=3600)


async def _worker(dsn: str) -> psycopg.AsyncConnection[Any]:
    """A connection as the worker's restricted role, scoped to tenant ``t``."""
    conn = await psycopg.AsyncConnection.connect(with_user(dsn, WORKER_ROLE), autocommit=True)
    await conn.execute("SELECT set_config('qimpl.tenant', 't', false)")
    return conn


@pytest.mark.req("R-Q34-2", "R-EXEC-7")
def test_only_the_owner_at_its_token_records_a_call(dsn: str) -> None:
    run_id = _running(dsn, attempt=2)

    async def go() -> None:
        async with await _worker(dsn) as conn:
            for attempt, row_version, generation in ((1, 3, 1), (2, 2, 1), (2, 4, 1), (2, 3, 2)):
                with pytest.raises(LostOwnership):  # superseded, stale, future, other generation
                    await _owner(conn, run_id, attempt=attempt, row_version=row_version,
                                 generation=generation).call_started(1)
            owner = _owner(conn, run_id, attempt=2)
            call = await owner.call_started(1)
            await owner.call_ended(call, status="succeeded", input_tokens=7, output_tokens=3)
            with pytest.raises(LostOwnership):  # settled once
                await owner.call_ended(call, status="failed", code="x")
            with pytest.raises(LostOwnership):  # another attempt cannot settle it
                await _owner(conn, run_id, attempt=1).call_ended(call, status="failed")

    asyncio.run(go())
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT attempt, step, row_version, status, input_tokens, output_tokens,"
                            " tenant_id, ended_at >= started_at, committed_by FROM provider_calls"
                            " WHERE run_id = %s", (run_id,)).fetchall()
    assert rows == [(2, 1, 3, "succeeded", 7, 3, "t", True, WORKER_ROLE)]


@pytest.mark.req("R-Q34-2", "R-EXEC-7")
def test_no_call_is_recorded_for_an_ended_run_and_no_record_changes_after(dsn: str) -> None:
    run_id = _running(dsn)

    async def go() -> int:
        async with await _worker(dsn) as conn:
            call = await _owner(conn, run_id).call_started(1)
            await conn.execute("UPDATE runs SET state = 'cancelled', row_version = 4,"
                               " completed_at = clock_timestamp() WHERE run_id = %s", (run_id,))
            with pytest.raises(LostOwnership):
                await _owner(conn, run_id, row_version=4).call_started(2)
            with pytest.raises(LostOwnership):  # nor a settle: the owner has lost the run
                await _owner(conn, run_id).call_ended(call, status="succeeded")
            return call

    call = asyncio.run(go())
    with psycopg.connect(with_user(dsn, WORKER_ROLE), autocommit=True) as conn:
        conn.execute("SELECT set_config('qimpl.tenant', 't', false)")
        for sql in ("DELETE FROM provider_calls WHERE id = %s",
                    "UPDATE provider_calls SET step = 9, status = 'failed' WHERE id = %s"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(sql, (call,))
            assert refused.value.sqlstate in ("QG012", "42501"), sql
        assert conn.execute("SELECT status FROM provider_calls WHERE id = %s", (call,)).fetchone() == (
            "started",)


@pytest.mark.req("R-Q34-2", "R-EXEC-8")
def test_no_call_is_recorded_after_the_deadline(dsn: str) -> None:
    run_id = _running(dsn, deadline="300 milliseconds")

    def passed() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT deadline_at <= clock_timestamp() FROM runs WHERE run_id = %s",
                               (run_id,)).fetchone()
        return bool(row and row[0])

    assert_eventually(passed, timeout=timedelta(seconds=10), what="the deadline by the database's clock")

    async def go() -> None:
        async with await _worker(dsn) as conn:
            with pytest.raises(DeadlinePassed):
                await _owner(conn, run_id).call_started(1)

    asyncio.run(go())


@pytest.mark.req("R-AUTH-4", "R-Q34-2")
def test_another_tenant_neither_sees_nor_records_calls(dsn: str) -> None:
    run_id = _running(dsn)

    async def go() -> None:
        async with await _worker(dsn) as conn:
            await _owner(conn, run_id).call_started(1)
            await conn.execute("SELECT set_config('qimpl.tenant', 'other', false)")
            cur = await conn.execute("SELECT count(*) FROM provider_calls WHERE run_id = %s", (run_id,))
            assert await cur.fetchone() == (0,)
            with pytest.raises(LostOwnership):  # the run is invisible to the other tenant
                await _owner(conn, run_id).call_started(2)

    asyncio.run(go())


@pytest.mark.req("R-Q34-2", "R-READ-1")
def test_the_read_counts_every_recorded_call_also_those_without_an_outcome(dsn: str) -> None:
    run_id = _running(dsn)

    async def go() -> dict[str, Any]:
        async with await _worker(dsn) as conn:
            owner = _owner(conn, run_id)
            first = await owner.call_started(1)
            await owner.call_ended(first, status="succeeded", input_tokens=10, output_tokens=5)
            failed = await owner.call_started(2)
            await owner.call_ended(failed, status="failed", code="provider_timeout")
            await owner.call_started(2)  # its attempt "dies": no outcome
            observed = await usage_db.observed(conn, run_id)
            assert observed is not None
            return observed

    observed = asyncio.run(go())
    usage = run_usage({"provider_calls": 1, "input_tokens": 10, "output_tokens": 5, "tool_calls": 2},
                      observed, durable=True)
    assert {k: usage[k] for k in ("provider_calls", "provider_calls_no_outcome", "input_tokens",
                                  "output_tokens", "tool_calls")} == {
        "provider_calls": 3, "provider_calls_no_outcome": 1, "input_tokens": 10, "output_tokens": 5,
        "tool_calls": 2}
    assert usage["wall_time_s"] >= usage["wall_s"] >= 0



@pytest.mark.req("R-EXEC-11")
def test_an_owner_stopped_past_its_lease_after_the_record_does_not_call(dsn: str) -> None:
    """The process stops (here the event loop is blocked, as under SIGSTOP: no keeper
    runs) after the call's record committed and before the call; PostgreSQL ends the lease
    session meanwhile. ``before_call`` must refuse the call on resume, although the owner
    saw no error since its record (a random schedule found it: a paused worker's owner
    asked for a step its successor had already checkpointed). Not stopped: no statement."""
    run_id = _running(dsn)
    lease_s = 0.5

    async def go() -> None:
        async with OwnershipLease(with_user(dsn, WORKER_ROLE), run_id, lease_s=lease_s,
                                  application_name=f"stalled:{run_id}", tenant_id="t") as lease:
            owner = RunOwner(lease.conn, run_id=run_id, generation=1, attempt=1, row_version=3,
                             deadline_left_s=3600, live=lease.live, lease_s=lease_s)
            await owner.call_started(1)
            await owner.before_call()  # fresh: returns without a statement
            with psycopg.connect(dsn, autocommit=True) as other:
                last = other.execute("SELECT query FROM pg_stat_activity WHERE application_name = %s",
                                     (f"stalled:{run_id}",)).fetchone()
            assert last is not None and last[0].startswith("INSERT INTO provider_calls"), last
            time.sleep(lease_s * 3)  # stopped: the server ends the idle session
            with pytest.raises((LostOwnership, psycopg.OperationalError)):
                await owner.before_call()

    asyncio.run(go())
