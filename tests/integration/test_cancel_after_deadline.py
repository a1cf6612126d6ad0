"""A cancel that arrives after the deadline records ``expired``, not ``cancelled``
(issue 22, item 5; R-EXEC-8, R-CANCEL-1)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db import runs as repo


def _run(dsn: str, *, deadline: str, lifecycle: int = 2) -> str:
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                  " deadline_at, lifecycle_version) VALUES (%s, 't', 'p', 'a', 'queued', 'x', 'k', "
                  f"now() + interval '{deadline}', %s)", (run_id, lifecycle))
    return run_id


def _cancel(dsn: str, run_id: str) -> tuple[bool, dict[str, Any]]:
    async def go() -> tuple[bool, dict[str, Any]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await repo.cancel(conn, run_id)
    return asyncio.run(go())


@pytest.mark.req("R-EXEC-8")
@pytest.mark.req("R-CANCEL-1")
def test_a_cancel_after_the_deadline_records_expired(stack: Any) -> None:
    dsn = str(stack.create_database())
    late = _run(dsn, deadline="-1 second")
    cancelled, row = _cancel(dsn, late)
    assert (cancelled, row["state"], row["error_code"]) == (False, "expired", "deadline_exceeded")
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT new_state FROM run_transitions WHERE run_id = %s ORDER BY id DESC"
                         " LIMIT 1", (late,)).fetchone() == ("expired",)
    # Before the deadline, and for a legacy run (no deadline), a cancel cancels.
    for run_id in (_run(dsn, deadline="1 hour"), _run(dsn, deadline="-1 second", lifecycle=1)):
        cancelled, row = _cancel(dsn, run_id)
        assert (cancelled, row["state"]) == (True, "cancelled")
