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
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import PoolClosed, PoolTimeout

from qimpl.api.event_hub import EventHub

__all__ = ["FALLBACK_S", "PAGE", "READ_BACKOFF_S", "READ_RETRY_S", "RECORD_FIELDS", "Record", "event_of",
           "stream_events"]

_log = logging.getLogger("qimpl.api")

#: A stream reads the journal at least this often even without a notification.
FALLBACK_S = 5.0
#: Most events one read returns.
PAGE = 500
#: A failed journal read is tried again after this many seconds, doubling with each
#: failure in a row (at most the fallback interval).
READ_BACKOFF_S = 0.1
#: The shortest wait between two failed reads, seconds (a tiny fallback poll included).
MIN_BACKOFF_S = 0.05
#: Seconds of journal reads failing in a row after which a stream ends (no terminal event).
READ_RETRY_S = 30.0
_EVENTS_SQL = ("SELECT seq, kind, data, at FROM run_events WHERE run_id = %s AND seq > %s"
               " ORDER BY seq LIMIT %s")
#: What a terminal event adds from the run record (``RunView`` fields).
RECORD_FIELDS = ("result_json", "error_code", "error_message", "last_failure_code", "usage",
                 "completed_at")
#: ``(conn) -> the run record's RECORD_FIELDS``, JSON-ready; read for a terminal event.
Record = Callable[[Any], Awaitable[Mapping[str, Any]]]
#: One read of the journal: its rows, and the run record when they hold the terminal event.
_Page = tuple[list[dict[str, Any]], Mapping[str, Any] | None]


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
                        record: Record | None = None, reads: asyncio.Semaphore | None = None,
                        retry_s: float = READ_RETRY_S) -> AsyncIterator[dict[str, str]]:
    """Events of ``run_id`` after ``seq`` ``after_seq`` until the terminal one (or
    ``max_s`` seconds). ``tenant()`` opens a tenant-scoped connection, taken only for a
    read, at most ``reads``' permits at once in the process; ``record(conn)`` gives the run
    record a terminal event carries.

    A read the database could not serve (no pooled connection within the pool's timeout,
    the session lost or cut off: ``PoolTimeout``, ``psycopg.OperationalError``) is tried
    again after a backoff (``READ_BACKOFF_S`` doubling, at most ``fallback_s``, at least
    ``MIN_BACKOFF_S``; logged at the first failure of a stretch and at its end): the
    response has started, so raising would abort it mid-stream. After ``retry_s`` seconds
    of reads failing in a row the stream ends without a terminal event, which proves
    nothing (R-EVENT-3): the client reconnects with ``Last-Event-ID`` or reads the run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_s
    last = after_seq
    failing_since: float | None = None
    backoff = READ_BACKOFF_S
    with hub.subscribe(run_id) as woken:
        while loop.time() < deadline:
            woken.clear()  # before the read: a commit during it wakes the next one
            try:
                rows, final = await _finished(_read(tenant, run_id, last, record, reads))
            except PoolClosed:
                return  # the process is shutting down
            except (PoolTimeout, psycopg.OperationalError) as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # raised while the stream was being cancelled: let the cancel through
                now, first = loop.time(), failing_since is None
                failing_since = now if failing_since is None else failing_since
                backoff = min(READ_BACKOFF_S if first else 2 * backoff, fallback_s)
                ending = now - failing_since >= retry_s
                if first or ending:
                    _log.warning("stream of run %s: the journal read failed (%s); %s", run_id,
                                 type(exc).__name__, "stream ended" if ending else "reading again",
                                 extra={"event": "api.stream_read_failed", "run_id": run_id,
                                        "exc_type": type(exc).__name__, "ended": ending})
                if ending:
                    return
                await asyncio.sleep(min(max(backoff, MIN_BACKOFF_S), max(deadline - now, 0)))
                continue
            failing_since = None
            for row in rows:
                event = event_of(row, final)
                last = int(row["seq"])
                yield event
                if event["event"] == "terminal":
                    return
                # Let the loop run between two events of a page: a client that reset its
                # connection is then seen gone (uvicorn drops later sends, sse-starlette
                # ends the stream) before the rest of the page is written to the dead
                # socket, which asyncio logs once per write ("socket.send() raised exception").
                await asyncio.sleep(0)
            if len(rows) == PAGE:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(fallback_s, max(deadline - loop.time(), 0)))


async def _finished(read: Coroutine[Any, Any, _Page]) -> _Page:
    """``read``'s page. A stream cancelled meanwhile (its client went away) lets the read
    finish in the background (bounded by the API's database timeout) and returns its
    connection to the pool whole: a query cancelled mid-flight, its own cancellation
    interrupted in turn, made the pool close the connection and open another, one per
    client that dropped during a read (seen by a tester)."""
    task = asyncio.ensure_future(read)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: never "never retrieved"
        raise


async def _read(tenant: Callable[[], Any], run_id: str, last: int, record: Record | None,
                reads: asyncio.Semaphore | None) -> _Page:
    """One page of the journal after ``last``, and the run record when it holds the terminal event."""
    async with reads or contextlib.nullcontext():
        final: Mapping[str, Any] | None = None
        async with tenant() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_EVENTS_SQL, (run_id, last, PAGE))
            rows = await cur.fetchall()
            if record is not None and any(r["kind"] == "terminal" for r in rows):
                final = await record(conn)
        return rows, final
