"""Ready sessions for ownership leases: a worker's pool of connected PostgreSQL sessions
that hold no lock and no lease setting while they wait (issue 21, R-EXEC-2).

Why: a lease session used to be a new connection per activity attempt. On the 2-core
benchmark machine each one cost PostgreSQL about 25 ms of CPU (a backend forked,
authenticated, its catalog caches filled, every statement planned afresh, the backend
torn down): more than the worker's own CPU per run, and the largest single cost of a run
at concurrency 10 (``bench/RESULTS.md``). A pooled session is already connected and
keeps its prepared statements.

What a pooled session carries between leases, and why that is safe:

* **Nothing the fence relies on.** An attempt checks a session out for its whole lease
  (one dedicated connection across all its commits, R-EXEC-2), and every lease setting
  is applied and read back at every claim (``OwnershipLease``), exactly as on a new
  connection. While it waits in the pool a session runs with the server's defaults but
  for ``idle_session_timeout``, at most ``WAITING_BOUND_S`` (300 s), not the lease
  (PostgreSQL would otherwise end it after a lease of waiting): a paused or cut-off
  worker's waiting sessions give their connection slots back within that bound.
* **Back in the pool only after a clean end.** ``release(reuse=True)`` first unlocks every
  session advisory lock and resets every setting (``pg_advisory_unlock_all(); RESET
  ALL``, then the waiting bound, in one round trip), all before the activity returns, so
  the run's lock is free when Temporal hears of the result. Any doubt (an error, an open transaction, a statement still running, a
  failed reset) closes the session instead, which frees its locks as before. An attempt
  that ended with an exception (lost ownership, a step failure, a cancel) never reuses
  its session.
* **Checked on the way out.** Each checkout checks the session with an empty query (one
  round trip); one that PostgreSQL ended while it waited (a server restart, a
  terminated backend) is replaced before any lease statement runs on it, and the next
  is tried at once (``qimpl.db.checkout``: after a restart every waiting session is dead).

A paused worker's pooled sessions hold no lock, so they delay no takeover; its leased
sessions are ended by their timeouts as before. The pool holds at most one session per
activity slot (``max_concurrent_activities`` plus the takeover slots), the number of lease
connections a worker could hold before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from qimpl.db.checkout import RECONNECT_TIMEOUT_S, checkout
from qimpl.db.server_settings import at_most_sql
from qimpl.errors import LeaseSessionUnavailable

__all__ = ["IDLE_APPLICATION_NAME", "WAITING_BOUND_S", "LeaseSessions"]

#: ``application_name`` of a pooled session between leases; a leased one is named after
#: its run (``qimpl-owner:<run id>``) from the lease's read-back, its second statement.
IDLE_APPLICATION_NAME = "qimpl-owner-ready"

#: Longest a session waits in the pool, seconds, by the server's own clock: a paused or
#: cut-off worker's waiting sessions hold no lock, but without a bound they would hold
#: their connection slots until TCP gives up (hours for a paused worker, whose kernel still
#: answers keepalives). The pool replaces a session the server ended at its next checkout.
WAITING_BOUND_S = 300

#: The waiting bound, as a statement: ``idle_session_timeout`` at most WAITING_BOUND_S (a
#: tighter non-zero server value is kept).
BOUND_SQL = ("SELECT set_config('idle_session_timeout', "
             + at_most_sql("'idle_session_timeout'", str(WAITING_BOUND_S * 1000), 1000) + ", false)")

#: Run on a session going back to the pool: no lock and no setting of the lease it served
#: survives (application_name returns to IDLE_APPLICATION_NAME, its connect-time value),
#: and it waits under the waiting bound. One round trip.
RESET_SQL = f"SELECT pg_advisory_unlock_all(); RESET ALL; {BOUND_SQL}"


async def _bound(conn: psycopg.AsyncConnection[Any]) -> None:
    """Pool ``configure``: a new session waits under the waiting bound too."""
    await conn.execute(BOUND_SQL)


class LeaseSessions:
    """``max_size`` ready sessions to ``dsn`` for leases of ``lease_s`` seconds.

    ``connect_params``: libpq connection parameters of every session (the lease's
    client-side keepalives, ``qimpl.db.lease.client_params``). Open it with ``open()``
    inside the event loop that uses it and ``close()`` it at shutdown."""

    def __init__(self, dsn: str, *, lease_s: float, max_size: int, min_size: int = 2,
                 connect_params: dict[str, Any] | None = None) -> None:
        self.dsn = dsn
        self.lease_s = lease_s
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            dsn, min_size=min(min_size, max_size), max_size=max_size, open=False,
            # Checked on checkout by ``checkout`` (not the pool's ``check=``, which waits
            # 1 s, 2 s, 4 s ... between sessions that died with a server restart).
            name="qimpl-lease-sessions",
            configure=_bound,
            # The pool closes its extra idle sessions itself before the server's bound does.
            max_idle=WAITING_BOUND_S * 0.8,
            # After an outage, a new session as soon as the server is back (not up to
            # half a minute later, psycopg_pool's backoff).
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            kwargs={"autocommit": True, "application_name": IDLE_APPLICATION_NAME,
                    **(connect_params or {})})

    def serves(self, dsn: str, lease_s: float) -> bool:
        """Whether a lease of ``lease_s`` seconds on ``dsn`` may use these sessions (their
        client-side keepalives were set for this pool's lease)."""
        return dsn == self.dsn and lease_s == self.lease_s

    async def open(self) -> None:
        """Start filling the pool (returns at once; connections are made in the background)."""
        await self._pool.open(wait=False)

    async def close(self) -> None:
        """Close every session, leased ones included once they come back."""
        await self._pool.close()

    async def acquire(self, timeout_s: float) -> psycopg.AsyncConnection[Any]:
        """A checked, ready session. Raises ``LeaseSessionUnavailable`` when none is ready
        within ``timeout_s`` seconds (the database refuses connections, or every session
        is in use)."""
        try:
            return await checkout(self._pool, timeout_s, check=AsyncConnectionPool.check_connection)
        except (PoolTimeout, psycopg.Error):
            raise LeaseSessionUnavailable(
                f"no lease session ready within {timeout_s:g} s (at most {self._pool.max_size}:"
                " the database refuses connections, or every session is in use)") from None

    async def release(self, conn: psycopg.AsyncConnection[Any], *, reuse: bool) -> None:
        """Give ``conn`` back: reset for the next lease when ``reuse`` and it is idle and
        whole, otherwise closed (which frees its locks). Its locks are free when this
        returns. Never raises for the session's state. The reset is bounded by the lease
        (a server that stops answering); a reset that fails, times out or is cancelled
        (the activity cancelled, the worker shutting down) closes the session, and the
        session always goes back to the pool, so the pool never loses a slot."""
        try:
            if reuse and not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                try:
                    async with asyncio.timeout(self.lease_s):
                        await conn.execute(RESET_SQL)
                except (psycopg.Error, TimeoutError):
                    reuse = False
            else:
                reuse = False
        except BaseException:
            reuse = False
            raise
        finally:
            try:
                if not reuse:
                    await conn.close()
            finally:
                await self._pool.putconn(conn)
