"""The run's event stream (R-EVENT-2/3/4, R-AUTH-3): the database's own transition journal
served as Server-Sent Events to the holder of the run's stream key.

Event ids are journal ids, so ``Last-Event-ID`` resumes exactly after the last event a
client saw, on any API instance. Events: ``state`` (a state change), ``checkpoint`` (a
committed step) and, last, ``terminal`` carrying the run record's final state. Closing
the connection changes nothing about the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from psycopg.rows import dict_row

__all__ = ["POLL_S", "event_of", "stream_events"]

POLL_S = 0.2
TERMINAL = ("completed", "failed", "expired", "cancelled")


def event_of(row: dict[str, Any]) -> dict[str, str]:
    """One journal row as an SSE event (pure)."""
    checkpoint = row["old_state"] == row["new_state"] == "running"
    kind = "terminal" if row["new_state"] in TERMINAL else ("checkpoint" if checkpoint else "state")
    data = {"run_id": str(row["run_id"]), "row_version": row["row_version"], "state": row["new_state"],
            "previous": row["old_state"], "generation": row["generation"],
            "checkpoint_step": row["checkpoint_step"]}
    return {"id": str(row["id"]), "event": kind, "data": json.dumps(data)}


async def stream_events(tenant: Any, run_id: str, after_id: int, *,
                        max_s: float = 3600.0) -> AsyncIterator[dict[str, str]]:
    """Events of ``run_id`` after journal id ``after_id`` until the terminal one.
    ``tenant()`` opens a tenant-scoped connection (one per poll: none is held idle)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_s
    last = after_id
    while loop.time() < deadline:
        async with tenant() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM run_transitions WHERE run_id = %s AND id > %s ORDER BY id",
                              (run_id, last))
            rows = await cur.fetchall()
        for row in rows:
            event = event_of(row)
            last = int(row["id"])
            yield event
            if event["event"] == "terminal":
                return
        await asyncio.sleep(POLL_S)
