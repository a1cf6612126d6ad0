"""The run's event stream (R-EVENT-1..4, R-AUTH-3): the run's event journal
(``run_events``) served as Server-Sent Events to the holder of the run's stream key.

Event ids are the journal's per-run ``seq`` (1, 2, …), so ``Last-Event-ID`` resumes
exactly after the last event a client saw, on any API instance. Events: ``state`` (a state
change), ``checkpoint`` (a committed step), ``tool_call`` and ``tool_result`` (the tool
journal's intents and outcomes), ``output`` (a step's answer text) and, last,
``terminal`` carrying the run record (``state``, ``row_version``, ``generation``, and as
the read route answers them ``result_json``, ``error_code``, ``error_message``,
``last_failure_code``, ``usage`` and ``completed_at``, read in the transaction that read
the event). Every event's data carries ``at``: the database's time (ISO 8601) of the write
that journaled it, taken inside that write's transaction, so at most that transaction's
length before its commit. A stream waits on the process's ``EventHub`` (no database connection held
while it waits) and reads the journal when woken, or every ``fallback_s``. Closing the
connection frees the stream's subscription and changes nothing about the run (R-EVENT-4).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from psycopg.rows import dict_row

from qimpl.api.event_hub import EventHub

__all__ = ["FALLBACK_S", "PAGE", "RECORD_FIELDS", "Record", "event_of", "stream_events"]

#: A stream reads the journal at least this often even without a notification.
FALLBACK_S = 5.0
#: Most events one read returns.
PAGE = 500
_EVENTS_SQL = ("SELECT seq, kind, data, at FROM run_events WHERE run_id = %s AND seq > %s"
               " ORDER BY seq LIMIT %s")
#: What a terminal event adds from the run record (``RunView`` fields).
RECORD_FIELDS = ("result_json", "error_code", "error_message", "last_failure_code", "usage",
                 "completed_at")
#: ``(conn) -> the run record's RECORD_FIELDS``, JSON-ready; read for a terminal event.
Record = Callable[[Any], Awaitable[Mapping[str, Any]]]


def event_of(row: dict[str, Any], record: Mapping[str, Any] | None = None) -> dict[str, str]:
    """One journal row (``seq``, ``kind``, ``data``, ``at``) as an SSE event ``{id, event,
    data}`` (pure): ``id`` is the run's ``seq``, ``data`` the event's JSON with ``at`` (ISO
    8601) and, for a terminal event, the run ``record``'s fields."""
    data = dict(row["data"])
    if row.get("at") is not None:
        data["at"] = row["at"].isoformat().replace("+00:00", "Z")  # as the run record's times
    if record is not None and row["kind"] == "terminal":
        data.update({k: record[k] for k in RECORD_FIELDS if k in record})
    return {"id": str(row["seq"]), "event": str(row["kind"]),
            "data": json.dumps(data, separators=(",", ":"), default=str)}


async def stream_events(tenant: Callable[[], Any], hub: EventHub, run_id: str, after_seq: int, *,
                        fallback_s: float = FALLBACK_S, max_s: float = 3600.0,
                        record: Record | None = None) -> AsyncIterator[dict[str, str]]:
    """Events of ``run_id`` after ``seq`` ``after_seq`` until the terminal one (or
    ``max_s`` seconds). ``tenant()`` opens a tenant-scoped connection, taken only for a
    read; ``record(conn)`` gives the run record a terminal event carries."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_s
    last = after_seq
    with hub.subscribe(run_id) as woken:
        while loop.time() < deadline:
            woken.clear()  # before the read: a commit during it wakes the next one
            final: Mapping[str, Any] | None = None
            async with tenant() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(_EVENTS_SQL, (run_id, last, PAGE))
                rows = await cur.fetchall()
                if record is not None and any(r["kind"] == "terminal" for r in rows):
                    final = await record(conn)
            for row in rows:
                event = event_of(row, final)
                last = int(row["seq"])
                yield event
                if event["event"] == "terminal":
                    return
            if len(rows) == PAGE:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(fallback_s, max(deadline - loop.time(), 0)))
