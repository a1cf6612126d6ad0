"""Waits that wake on a run's own notifications, not on a polling interval (issue 24, item 2).

The product notifies the channel ``qimpl_run_events`` with ``<run_id>:<seq>`` for every
event it journals for a run, each state transition among them, in the transaction that
writes it (``qimpl_record_events``; the API's event streams listen on it, R-EVENT-2). A
scenario that waits for a run's state reads it through the API as any client would, but
only when the run changed: ``RunNotices`` LISTENs on one session of the harness's own and
counts each run's notifications, and ``wait`` sleeps until the count moves.

A notification is a hint, never the verdict: the wait's caller reads the run again after
each wake and decides on what it read. Notifications missed while the session is lost (a
restarted or terminated PostgreSQL, the faults some scenarios strike) are made up for in
two ways: a reconnect counts as a change of every run, and no wait sleeps longer than
``fallback_s`` without a read.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["CHANNEL", "STOP_CHANNEL", "RunNotices"]

#: The product's notification channel (``qimpl.api.event_hub.CHANNEL``).
CHANNEL = "qimpl_run_events"
#: The harness's own channel that wakes the listening thread to stop (``close``).
STOP_CHANNEL = "qualify_run_notices_stop"
#: How often the listening thread looks at ``close`` between notifications (seconds),
#: when nothing wakes it.
_STOP_CHECK_S = 0.5


class RunNotices:
    """One LISTEN session and a thread that counts notifications per run id.

    ``dsn``: the scenario database (any role that may LISTEN). ``fallback_s``: the longest
    ``wait`` sleeps without a notification (seconds). ``start`` returns at once: until the
    session is listening, waits fall back to ``fallback_s``. ``close`` is idempotent and
    joins the thread.
    """

    def __init__(self, dsn: str, *, fallback_s: float = 0.5) -> None:
        self.dsn = dsn
        self.fallback_s = fallback_s
        self._counts: Counter[str] = Counter()
        #: Bumped on every (re)connect: notifications may have been missed in between.
        self._epoch = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._conn: Any = None
        self._thread = threading.Thread(target=self._listen, name="run-notices", daemon=True)

    def start(self) -> RunNotices:
        self._thread.start()
        return self

    def seen(self, run_id: str) -> tuple[int, int]:
        """A mark of what is known of ``run_id`` now: pass it to ``wait`` after a read."""
        with self._cond:
            return self._epoch, self._counts[run_id]

    def wait(self, run_id: str, mark: tuple[int, int], timeout_s: float) -> bool:
        """Sleep until ``run_id`` was notified (or the session reconnected) since ``mark``,
        at most ``min(timeout_s, fallback_s)`` seconds; True when woken by a change."""
        with self._cond:
            return self._cond.wait_for(lambda: (self._epoch, self._counts[run_id]) != mark,
                                       timeout=max(0.0, min(timeout_s, self.fallback_s)))

    def close(self, wake: Callable[[str], object] | None = None) -> None:
        """Stop listening and join the thread. ``wake(sql)`` runs a statement on another
        session of the same database (the scenario's own): a ``NOTIFY`` on
        ``STOP_CHANNEL`` wakes the thread at once instead of within ``_STOP_CHECK_S``
        seconds."""
        self._stop.set()
        if wake is not None and self._conn is not None:
            with contextlib.suppress(Exception):
                wake(f"SELECT pg_notify('{STOP_CHANNEL}', '')")
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _listen(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5,
                                     application_name="qualify-run-notices") as conn:
                    conn.execute(f"LISTEN {CHANNEL}; LISTEN {STOP_CHANNEL}")
                    self._conn = conn
                    with self._cond:
                        self._epoch += 1
                        self._cond.notify_all()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=_STOP_CHECK_S):
                            if note.channel == STOP_CHANNEL:
                                break
                            run_id = note.payload.split(":", 1)[0]
                            with self._cond:
                                self._counts[run_id] += 1
                                self._cond.notify_all()
            except psycopg.Error:
                self._conn = None
                self._stop.wait(0.2)  # the server is restarting or gone: try again
            finally:
                self._conn = None
