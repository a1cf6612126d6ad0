"""The audit trail names the writer, from the writing session (R-EXEC-7, R-EXEC-2), and
the checker that reads it is fed histories the real database produced.

The zombie history below is the one the old checker (``no_write_by_a_superseded_attempt``,
which reads the run's *stored* owner after the write) passed: a superseded attempt whose
fence failed open writes under its successor's ``owner_attempt``. With the writer's own
token and lock recorded, ``every_write_by_its_owner`` sees it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from qimpl.db.owner import RunOwner
from qualify import checkers as ck
from qualify.collect import database_events
from tests.integration.owned_runs import lease as owner_lease
from tests.integration.owned_runs import queued_run


@pytest.mark.req("R-EXEC-7")
@pytest.mark.req("R-EXEC-2")
def test_each_owner_write_records_its_token_pid_and_lock(stack: Any) -> None:
    dsn = stack.create_database()
    run_id = queued_run(dsn)

    async def own() -> int:
        async with owner_lease(dsn, run_id) as lease:
            claim = await RunOwner.claim(lease.conn, run_id, generation=1, attempt=1)
            assert claim.owner is not None
            await claim.owner.checkpoint(1, state={}, usage={})
            return int(lease.conn.info.backend_pid)

    pid = asyncio.run(own())
    writes = [e for e in database_events(dsn) if e["type"] == "transition" and e["run_id"] == run_id]
    owned = [e for e in writes if e["writer_token"]]
    assert [(e["old_state"], e["new_state"]) for e in owned] == [("queued", "running"), ("running", "running")]
    assert {(e["writer_token"], e["writer_pid"], e["writer_lock"]) for e in owned} == {
        (f"{run_id}:1:1", pid, True)}
    assert ck.every_write_by_its_owner(writes).ok is True


@pytest.mark.req("R-EXEC-7")
def test_a_zombie_write_is_judged_by_its_writer_not_the_stored_owner(stack: Any) -> None:
    """Attempt 1 holds the lease; attempt 2 takes the run over on a session without the
    lock (a lock that failed); attempt 1 then writes as if its fence had failed open.
    The database accepts both (nothing else refuses them); the old checker passes the
    history, the new one names both faults."""
    dsn = stack.create_database()
    run_id = queued_run(dsn)

    async def split_brain() -> None:
        async with owner_lease(dsn, run_id) as lease:
            first = await RunOwner.claim(lease.conn, run_id, generation=1, attempt=1)
            assert first.owner is not None
            await first.owner.checkpoint(1, state={}, usage={})
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                second = await RunOwner.claim(other, run_id, generation=1, attempt=2)
                assert second.owner is not None
            # The zombie's checkpoint with no fence: only ``run_id`` in its WHERE.
            await lease.conn.execute(
                "UPDATE runs SET row_version = row_version + 1, checkpoint_step = 2"
                " WHERE run_id = %s", (run_id,))

    asyncio.run(split_brain())
    writes = [e for e in database_events(dsn) if e["type"] == "transition" and e["run_id"] == run_id]
    zombie = writes[-1]
    assert zombie["owner_attempt"] == 2 and zombie["writer_token"] == f"{run_id}:1:1"

    assert ck.no_write_by_a_superseded_attempt(writes).ok is True  # the blind spot
    judged = ck.every_write_by_its_owner(writes)
    assert judged.ok is False
    assert f"v{zombie['row_version']}: written by attempt 1 while attempt 2 owns it" in judged.detail
    assert "attempt 2 wrote without the run's advisory lock" in judged.detail


@pytest.mark.req("R-EXEC-7")
def test_the_fence_refuses_the_zombie_and_the_audit_stays_clean(stack: Any) -> None:
    """The same race through ``RunOwner``: the superseded attempt's fenced checkpoint is
    refused by the database (no row matches its token) and leaves no audit row."""
    from qimpl.errors import LostOwnership

    dsn = stack.create_database()
    run_id = queued_run(dsn)

    async def race() -> None:
        async with owner_lease(dsn, run_id) as lease:
            first = await RunOwner.claim(lease.conn, run_id, generation=1, attempt=1)
            assert first.owner is not None
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                await RunOwner.claim(other, run_id, generation=1, attempt=2)
            with pytest.raises(LostOwnership):
                await first.owner.checkpoint(1, state={}, usage={})

    asyncio.run(race())
    writes = [e for e in database_events(dsn) if e["type"] == "transition" and e["run_id"] == run_id]
    assert [(e["new_state"], e["writer_token"]) for e in writes] == [
        ("queued", None), ("running", f"{run_id}:1:1"), ("running", f"{run_id}:1:2")]
