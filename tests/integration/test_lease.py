"""The ownership lease is bounded in every case (R-EXEC-11): its session runs with
``idle_session_timeout`` and ``idle_in_transaction_session_timeout`` equal to the lease,
set with SQL and read back; an owner paused inside an open transaction loses the run's
lock within the lease; a session whose settings do not take effect is refused."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from qimpl.db.lease import (
    LeaseNotBounded,
    OwnershipLease,
    keepalive_s,
    lease_ms,
    lock_key_sql,
)
from qimpl.errors import LockNotAcquired
from qualify.stack._embedded import WORKER_ROLE, with_user
from tests.conftest import assert_eventually

REPO = Path(__file__).resolve().parents[2]
TIMEOUTS = ("idle_session_timeout", "idle_in_transaction_session_timeout")

#: An owner that takes the lease, opens a transaction on the lease session, runs one
#: statement in it, says "ready" and stops itself: the paused-owner fault inside a
#: transaction. argv: dsn run_id lease_s.
PAUSED_OWNER = """
import asyncio, os, signal, sys
from qimpl.db.lease import OwnershipLease

async def main() -> None:
    async with OwnershipLease(sys.argv[1], sys.argv[2], lease_s=float(sys.argv[3]),
                              application_name="paused-owner", tenant_id="t") as lease:
        async with lease.conn.transaction():
            await lease.conn.execute("SELECT 1")
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            await lease.conn.execute("SELECT 1")

asyncio.run(main())
"""


def try_lock(conn: psycopg.Connection[Any], run_id: str) -> bool:
    """Take the run's lock from ``conn`` if it is free (then keep it: the caller closes)."""
    row = conn.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (run_id,)).fetchone()
    return bool(row and row[0])


def paused_owner_takeover_s(owner_dsn: str, direct_dsn: str, lease_s: float) -> float:
    """Seconds from a paused owner's last statement (inside an open transaction) until
    another session, connected to PostgreSQL directly, takes the run's lock. The owner
    connects through ``owner_dsn`` (PostgreSQL, or a pooler in front of it)."""
    run_id = str(uuid.uuid4())
    owner = subprocess.Popen([sys.executable, "-c", PAUSED_OWNER, owner_dsn, run_id, str(lease_s)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert owner.stdout is not None
        readable, _, _ = select.select([owner.stdout], [], [], 30)
        line = owner.stdout.readline() if readable else b""
        ready = time.monotonic()
        if line.strip() != b"ready":
            owner.kill()
            rest = owner.stdout.read().decode(errors="replace")
            pytest.fail(f"the owner did not get ready: {(line.decode(errors='replace') + rest)[-2000:]}")
        assert_eventually(lambda: psutil.Process(owner.pid).status() == psutil.STATUS_STOPPED,
                          timeout=timedelta(seconds=10), what="the owner stopped")
        with psycopg.connect(direct_dsn, autocommit=True) as other:
            assert not try_lock(other, run_id), "the lock was free while the owner held the lease"
            assert_eventually(lambda: try_lock(other, run_id), timeout=timedelta(seconds=lease_s + 10),
                              what="the paused owner's lock taken over")
            return time.monotonic() - ready
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return str(stack.create_database())


def _lease(dsn: str, run_id: str, lease_s: float, cls: type[OwnershipLease] = OwnershipLease,
           ) -> OwnershipLease:
    return cls(dsn, run_id, lease_s=lease_s, application_name=f"lease-test:{run_id}", tenant_id="t")


@pytest.mark.req("R-EXEC-11")
def test_lease_session_runs_with_the_lease_timeouts(dsn: str) -> None:
    run_id = str(uuid.uuid4())

    async def hold(other: psycopg.Connection[Any]) -> None:
        # As the worker's own (unprivileged) role: the settings need no privilege.
        async with _lease(with_user(dsn, WORKER_ROLE), run_id, 1.5) as lease:
            for name in (*TIMEOUTS, "lock_timeout"):
                cur = await lease.conn.execute(f"SHOW {name}")
                assert await cur.fetchone() == ("1500ms",), name
                cur = await lease.conn.execute(
                    "SELECT setting, unit, source FROM pg_settings WHERE name = %s", (name,))
                # source 'session': set with SQL on the session, not as a startup option.
                assert await cur.fetchone() == ("1500", "ms", "session"), name
            assert not try_lock(other, run_id), "another session took the lock of a held lease"
            with pytest.raises(LockNotAcquired) as busy:
                async with _lease(dsn, run_id, 1.5):
                    pass
            assert not isinstance(busy.value, LeaseNotBounded)

    with psycopg.connect(dsn, autocommit=True) as other:
        asyncio.run(hold(other))
        assert_eventually(lambda: try_lock(other, run_id), timeout=timedelta(seconds=5),
                          what="the lock free after the lease ended")


@pytest.mark.req("R-EXEC-11")
def test_owner_paused_inside_a_transaction_loses_the_lock(dsn: str) -> None:
    lease_s = 1.0
    took = paused_owner_takeover_s(dsn, dsn, lease_s)
    print(f"takeover from a paused owner (direct): {took:.2f} s")
    assert took <= lease_s + 1.5, f"the paused owner kept the lock for {took:.2f} s"


class _IgnoredSettings(OwnershipLease):
    """A lease whose SETs do not take effect (as through a pooler that drops them)."""

    async def _apply_settings(self, conn: psycopg.AsyncConnection[Any]) -> None:
        return None


@pytest.mark.req("R-EXEC-11")
def test_lease_without_its_timeouts_is_refused(dsn: str) -> None:
    run_id = str(uuid.uuid4())

    async def enter() -> None:
        async with _lease(dsn, run_id, 1.0, _IgnoredSettings):
            pytest.fail("a lease without its timeouts was granted")

    with pytest.raises(LeaseNotBounded) as refused:
        asyncio.run(enter())
    assert isinstance(refused.value, LockNotAcquired)  # retryable, like a busy lock
    assert "idle_session_timeout is 0 ms (expected 1000 ms)" in str(refused.value)
    assert "idle_in_transaction_session_timeout is 0 ms" in str(refused.value)
    with psycopg.connect(dsn, autocommit=True) as other:
        assert try_lock(other, run_id), "a refused lease took the run's lock"

        def gone() -> bool:
            row = other.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                (f"lease-test:{run_id}",)).fetchone()
            return row == (0,)

        assert_eventually(gone, timeout=timedelta(seconds=5), what="the refused session closed")


def test_lease_ms_is_at_least_one() -> None:
    assert lease_ms(0.0) == 1 and lease_ms(0.0004) == 1 and lease_ms(1.5) == 1500
    assert keepalive_s(0.1) == (1, 1, 2) and keepalive_s(8.0) == (4, 2, 2)
