"""Legacy inline runs are bounded (issue 22, item 9; R-CREATE-6): each runs outside the
API pool, at most ``legacy_runs_per_tenant`` at once per tenant, and ends ``expired`` at
its deadline instead of holding a pooled connection for as long as the provider takes."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from qimpl.api.deps import Services
from qimpl.settings import ApiSettings
from qualify.fakes.synthetic import make_prompt
from qualify.stack._embedded import API_ROLE, with_user


def _legacy_run(dsn: str, tenant: str, *, deadline_s: int) -> str:
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                  " deadline_at, lifecycle_version, durability) VALUES (%s, %s, 'p', 'a', 'accepted', %s,"
                  " 'k', now() + make_interval(secs => %s), 1, 'legacy')",
                  (run_id, tenant, make_prompt(steps=100, delay_ms=100), deadline_s))
    return run_id


@pytest.mark.req("R-CREATE-6")
def test_legacy_runs_leave_the_pool_alone_and_end_at_their_deadline(stack: Any, tmp_path: Path) -> None:
    dsn = str(stack.create_database())
    settings = ApiSettings(database_url=with_user(dsn, API_ROLE), api_pool_size=1,
                           provider="qualify.fakes.synthetic:SyntheticProvider",
                           provider_config={"control_dir": str(tmp_path)}, legacy_runs_per_tenant=2)
    slow = [_legacy_run(dsn, "t-a", deadline_s=2) for _ in range(3)]

    async def scenario() -> tuple[float, list[str]]:
        svc = Services(settings)
        await svc.pool.open(wait=True, timeout=10)
        try:
            start = time.monotonic()
            tasks = [asyncio.create_task(svc.run_legacy(r, "t-a")) for r in slow]
            await asyncio.sleep(0.5)
            # Another tenant's durable route needs the one pooled connection: free at once.
            async with asyncio.timeout(2):
                async with svc.tenant("t-b") as conn:
                    await conn.execute("SELECT 1")
            with psycopg.connect(dsn) as c:
                running = c.execute("SELECT count(*) FROM runs WHERE state = 'running'").fetchone()
            assert running == (2,), f"{running} legacy runs running at once (cap 2)"
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)
            took = time.monotonic() - start
        finally:
            await svc.pool.close()
        with psycopg.connect(dsn) as c:
            states = [r[0] for r in c.execute("SELECT state FROM runs ORDER BY accepted_at")]
        return took, states

    took, states = asyncio.run(scenario())
    assert states == ["expired"] * 3, states
    assert took < 10, f"{took:.1f} s"
