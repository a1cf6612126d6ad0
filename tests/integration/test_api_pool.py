"""The API's connection pool (``qimpl.api.deps.Services.pool``): each checkout is checked
in one round trip that also clears any tenant scope left on the session, so a
connection never carries one request's tenant into the next (R-AUTH-4), and one that
PostgreSQL ended while it waited is replaced, not handed to a request."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from qimpl.api.deps import Services
from qimpl.settings import ApiSettings
from qualify.stack._embedded import API_ROLE, with_user


def _services(dsn: str) -> Services:
    return Services(ApiSettings(database_url=with_user(dsn, API_ROLE), api_pool_size=1))


@pytest.mark.req("R-AUTH-4")
def test_a_tenant_left_on_a_session_does_not_reach_the_next_checkout(stack: Any) -> None:
    dsn = str(stack.create_database())

    async def go() -> tuple[Any, Any]:
        svc = _services(dsn)
        await svc.pool.open(wait=True, timeout=10)
        try:
            async with svc.connection() as conn:
                # A session-level scope (no route sets one; a bug could).
                await conn.execute("SELECT set_config('qimpl.tenant', 't-a', false)")
                pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone() or (0,))[0]
            async with svc.connection() as conn:
                cur = await conn.execute("SELECT pg_backend_pid(), current_setting('qimpl.tenant', true)")
                return pid, await cur.fetchone()
        finally:
            await svc.pool.close()

    pid, (again, tenant) = asyncio.run(go())
    assert again == pid, "the pool of one did not hand the same session out again"
    assert tenant == "", f"the next checkout saw tenant {tenant!r}"


@pytest.mark.req("R-AUTH-4")
def test_a_session_the_server_ended_is_replaced_at_checkout(stack: Any) -> None:
    dsn = str(stack.create_database())

    async def go() -> tuple[int, int]:
        svc = _services(dsn)
        await svc.pool.open(wait=True, timeout=10)
        try:
            async with svc.connection() as conn:
                first = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone() or (0,))[0]
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (first,))
            async with svc.connection() as conn:
                second = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone() or (0,))[0]
            return first, second
        finally:
            await svc.pool.close()

    first, second = asyncio.run(go())
    assert second != first, "a terminated session was handed to a request"
