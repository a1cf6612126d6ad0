"""The run's event stream (R-EVENT-2/3/4, R-AUTH-3): the database's own transition journal
served as Server-Sent Events to the holder of the run's stream key.

Event ids are journal ids, so ``Last-Event-ID`` resumes exactly after the last event a
client saw, on any API instance. Events: ``state`` (a state change), ``checkpoint`` (a
committed step), ``tool_call`` and ``tool_result`` (the tool journal's intents and
outcomes) and, last, ``terminal`` carrying the run record's final state. Closing
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
#: The run's transitions after an id, each with the tool invocation written at its row
#: version, if any (row versions are unique within a run).
_EVENTS_SQL = """
SELECT t.*, ti.call_id AS tool_call_id, ti.tool AS tool_name, ti.status AS tool_status,
       ti.outcome_row_version AS tool_outcome_row_version
FROM run_transitions t
LEFT JOIN tool_invocations ti ON ti.run_id = t.run_id
     AND (ti.intent_row_version = t.row_version OR ti.outcome_row_version = t.row_version)
WHERE t.run_id = %s AND t.id > %s ORDER BY t.id
"""
TERMINAL = ("completed", "failed", "expired", "cancelled")


def event_of(row: dict[str, Any]) -> dict[str, str]:
    """One journal row as an SSE event (pure). A ``running -> running`` write is a
    ``checkpoint``, or — when the tool journal recorded it at that row version — a
    ``tool_call`` (an intent or a developer-hosted request) or ``tool_result`` (an
    outcome), carrying ``call_id``, ``tool`` and, for a result, its ``status`` (R-TOOL-1)."""
    checkpoint = row["old_state"] == row["new_state"] == "running"
    kind = "terminal" if row["new_state"] in TERMINAL else ("checkpoint" if checkpoint else "state")
    data: dict[str, Any] = {
        "run_id": str(row["run_id"]), "row_version": row["row_version"], "state": row["new_state"],
        "previous": row["old_state"], "generation": row["generation"],
        "checkpoint_step": row["checkpoint_step"]}
    if checkpoint and row.get("tool_call_id"):
        outcome = row["tool_outcome_row_version"] == row["row_version"]
        kind = "tool_result" if outcome else "tool_call"
        data.update(call_id=row["tool_call_id"], tool=row["tool_name"])
        if outcome:
            data["status"] = row["tool_status"]
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
            await cur.execute(_EVENTS_SQL, (run_id, last))
            rows = await cur.fetchall()
        for row in rows:
            event = event_of(row)
            last = int(row["id"])
            yield event
            if event["event"] == "terminal":
                return
        await asyncio.sleep(POLL_S)
