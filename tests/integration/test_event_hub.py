"""The API's LISTEN connection against PostgreSQL (R-EVENT-2): a committed event wakes
its run's streams; after the connection is terminated the hub reconnects and wakes every
stream for a catch-up read."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from qimpl.api.event_hub import EventHub
from qualify.stack._embedded import WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return str(stack.create_database())


async def _eventually(event: asyncio.Event, timeout_s: float = 10.0) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


@pytest.mark.req("R-EVENT-2")
def test_a_commit_wakes_its_stream_and_a_terminated_listener_comes_back_and_wakes_all(dsn: str) -> None:
    name = f"hub-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        hub = EventHub(dsn, application_name=name, backoff_s=(0.05, 0.2))
        hub.start()
        try:
            assert await _eventually(hub.listening)
            run_id = str(uuid.uuid4())
            with hub.subscribe(run_id) as mine, hub.subscribe("someone-else") as theirs:
                async with await psycopg.AsyncConnection.connect(with_user(dsn, WORKER_ROLE),
                                                                 autocommit=True) as conn:
                    await conn.execute("SELECT set_config('qimpl.tenant', 't', false)")
                    await conn.execute(
                        "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                        " stream_key, deadline_at) VALUES (%s, 't', 'p', 'a', 'accepted', 'x', 'k',"
                        " now() + interval '1 hour')", (run_id,))
                assert await _eventually(mine) and not theirs.is_set()
                mine.clear()
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
                    cur = await admin.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE application_name = %s", (name,))
                    assert (await cur.fetchone()) == (1,)
                assert await _eventually(mine) and await _eventually(theirs)  # the catch-up
                assert hub.subscriptions == 2
        finally:
            await hub.stop()

    asyncio.run(scenario())
