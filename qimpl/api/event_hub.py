"""One LISTEN connection per API process, fanned out to its open event streams (R-EVENT-2).

The journal's trigger ``pg_notify``s channel ``qimpl_run_events`` with ``<run_id>:<seq>``
at commit (migration ``20261202_090000_event_journal``). ``EventHub`` holds one autocommit
connection LISTENing on it and wakes the streams that follow that run: one
``asyncio.Event`` per open stream, no pooled connection held while a stream waits.

A notification is only a hint: a stream always reads the journal itself (after its last
``seq``). Whenever the listener (re)subscribes — at start, and after its connection died
(``pg_terminate_backend``, a PostgreSQL restart) and came back with backoff — every open
stream is woken for a catch-up read once LISTEN is in place again, so events committed
while nobody listened are not lost; streams also read on their own every ``fallback_s``
(belt and braces).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import psycopg

__all__ = ["CHANNEL", "EventHub", "parse_payload"]

log = logging.getLogger("qimpl.api.events")

#: The journal's NOTIFY channel (payload ``<run_id>:<seq>``).
CHANNEL = "qimpl_run_events"


def parse_payload(payload: str) -> str | None:
    """The run id of a notification payload ``<run_id>:<seq>`` (pure); None if malformed."""
    run_id, sep, seq = payload.rpartition(":")
    return run_id if sep and run_id and seq.isdigit() else None


class EventHub:
    """Fan-out of the journal's notifications to this process's streams.

    ``subscribe(run_id)`` (a context manager) yields an ``asyncio.Event`` set whenever
    that run may have new events; leaving it frees everything the stream held."""

    def __init__(self, dsn: str, *, application_name: str = "qimpl-api-listen",
                 backoff_s: tuple[float, float] = (0.1, 2.0), liveness_s: float = 5.0,
                 connect_kwargs: dict[str, Any] | None = None) -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._backoff_s = backoff_s
        self._liveness_s = liveness_s
        self._connect_kwargs = connect_kwargs or {}
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        #: How many times the listener has subscribed (1 after the first LISTEN).
        self.subscriptions = 0
        self.listening = asyncio.Event()

    @property
    def open_streams(self) -> int:
        """Streams currently subscribed (for tests and the bench)."""
        return sum(len(s) for s in self._waiters.values())

    def streams_of(self, run_id: str) -> int:
        """Streams of ``run_id`` currently subscribed in this process."""
        return len(self._waiters.get(run_id, ()))

    def start(self) -> None:
        """Start listening in the background (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="qimpl-event-hub")

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    @contextlib.contextmanager
    def subscribe(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set on every notification for ``run_id`` and on every resubscribe."""
        event = asyncio.Event()
        self._waiters[run_id].add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[run_id]

    def wake(self, run_id: str | None = None) -> None:
        """Wake the streams of ``run_id``, or every stream (after a resubscribe)."""
        groups = [self._waiters.get(run_id, set())] if run_id else list(self._waiters.values())
        for waiters in groups:
            for event in waiters:
                event.set()

    async def _listen(self) -> None:
        delay = self._backoff_s[0]
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, application_name=self._application_name,
                        **self._connect_kwargs) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.subscriptions += 1
                    self.listening.set()
                    delay = self._backoff_s[0]
                    self.wake()  # catch up: events committed while nobody listened
                    while True:
                        async for note in conn.notifies(timeout=self._liveness_s):
                            run_id = parse_payload(note.payload)
                            if run_id:
                                self.wake(run_id)
                        await conn.execute("SELECT 1")  # a dead connection raises here
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect: streams fall back meanwhile
                self.listening.clear()
                log.warning("event listener lost (%s); reconnecting in %.1f s", type(exc).__name__,
                            delay, extra={"event": "events.listener_lost"})
                # Streams are woken by the catch-up after the resubscribe (and their
                # fallback read), not here: a read now would miss what commits meanwhile.
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_s[1])
