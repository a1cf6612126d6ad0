"""The run's event stream (R-EVENT-1..4, R-AUTH-3): the run's event journal
(``run_events``) served as Server-Sent Events to the holder of the run's stream key.

Event ids are the journal's per-run ``seq`` (1, 2, …), so ``Last-Event-ID`` resumes
exactly after the last event a client saw, on any API instance. Events: ``state`` (a state
change), ``checkpoint`` (a committed step), ``tool_call`` and ``tool_result`` (the tool
journal's intents and outcomes), ``output`` (a step's answer text) and, last,
``terminal`` carrying the run record's final ``state``, ``row_version`` and
``generation``. A stream waits on the process's ``EventHub`` (no database connection held
while it waits) and reads the journal when woken, or every ``fallback_s``. Closing the
connection frees the stream's subscription and changes nothing about the run (R-EVENT-4).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from psycopg.rows import dict_row

from qimpl.api.event_hub import EventHub

__all__ = ["FALLBACK_S", "PAGE", "event_of", "stream_events"]

#: A stream reads the journal at least this often even without a notification.
FALLBACK_S = 5.0
#: Most events one read returns.
PAGE = 500
_EVENTS_SQL = ("SELECT seq, kind, data FROM run_events WHERE run_id = %s AND seq > %s"
               " ORDER BY seq LIMIT %s")


def event_of(row: dict[str, Any]) -> dict[str, str]:
    """One journal row (``seq``, ``kind``, ``data``) as an SSE event ``{id, event, data}``
    (pure): ``id`` is the run's ``seq``, ``data`` the event's JSON."""
    return {"id": str(row["seq"]), "event": str(row["kind"]),
            "data": json.dumps(row["data"], separators=(",", ":"))}


async def stream_events(tenant: Callable[[], Any], hub: EventHub, run_id: str, after_seq: int, *,
                        fallback_s: float = FALLBACK_S,
                        max_s: float = 3600.0) -> AsyncIterator[dict[str, str]]:
    """Events of ``run_id`` after ``seq`` ``after_seq`` until the terminal one (or
    ``max_s`` seconds). ``tenant()`` opens a tenant-scoped connection, taken only for a read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_s
    last = after_seq
    with hub.subscribe(run_id) as woken:
        while loop.time() < deadline:
            woken.clear()  # before the read: a commit during it wakes the next one
            async with tenant() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(_EVENTS_SQL, (run_id, last, PAGE))
                rows = await cur.fetchall()
            for row in rows:
                event = event_of(row)
                last = int(row["seq"])
                yield event
                if event["event"] == "terminal":
                    return
            if len(rows) == PAGE:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(fallback_s, max(deadline - loop.time(), 0)))
