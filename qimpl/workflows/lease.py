"""The activity owner's lease: a session advisory lock on a dedicated connection (R-EXEC-2).

Why a lease and not just the lock: a session advisory lock is held for as long as its
session lives, and a SIGSTOPped (or partitioned) owner keeps its TCP connection, so it
would keep the lock forever. The lock connection therefore runs with
``idle_session_timeout = lease_s``: the owner touches it (``SELECT 1``) every
``lease_s / 4`` from a background task, alongside the Temporal heartbeat. A process
that stops running stops touching it, and PostgreSQL itself ends the session — and
frees the lock — ``lease_s`` after the last touch, with no help from the holder.

Timing, with ``lease_s`` equal to the activity's heartbeat timeout ``H``: Temporal
times the paused attempt out after ``H`` (plus its timer slack, measured 0.5-2 s) and
schedules a retry; PostgreSQL frees the lock ``H`` after the last touch; the retry takes
the lock on its first or second try (a busy lock is a retryable failure, backoff <= 1 s).
One more delay is Temporal's, not ours: each activity poll the paused worker had in
flight may be handed a retry that it never starts, and that attempt too is lost only
after ``H``. Workers keep two activity polls, so takeover is bounded by about
``3 x (H + 3 s)``; the ``paused-owner`` scenario measures it (about 6-7 s at H = 1 s).

Every owner write is made *on this connection*: once the session is gone, so is the
ability to write, and a resumed zombie's first write fails (the connection is dead) or
is fenced by ``row_version``/``owner_attempt`` (the connection was replaced). Either
way it raises LostOwnership and the zombie stops.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import psycopg

from qimpl.errors import LockNotAcquired, LostOwnership

__all__ = ["OwnershipLease", "lock_key_sql"]

#: The advisory lock key of a run: one bigint derived from its id.
lock_key_sql = "hashtextextended('qimpl-run:' || %s, 0)"


class OwnershipLease:
    """Async context manager: ``async with OwnershipLease(dsn, run_id, lease_s=2.0) as lease``.

    Raises LockNotAcquired when another session holds the run's lock.
    """

    def __init__(self, dsn: str, run_id: str, *, lease_s: float, application_name: str,
                 tenant_id: str) -> None:
        self.dsn = dsn
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.lease_s = lease_s
        self.application_name = application_name
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            raise LostOwnership(f"lease connection of run {self.run_id} is gone")
        return self._conn

    @property
    def touch_interval_s(self) -> float:
        return self.lease_s / 4

    async def __aenter__(self) -> OwnershipLease:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            application_name=self.application_name,
            options=f"-c idle_session_timeout={int(self.lease_s * 1000)}",
        )
        try:
            # The lease session is the run's only writer: scope it to the run's tenant, so
            # row-level security admits its writes and nothing else (R-AUTH-4).
            await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (self.tenant_id,))
            cur = await conn.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (self.run_id,))
            row = await cur.fetchone()
            if not (row and row[0]):
                raise LockNotAcquired(f"run {self.run_id} is owned by another session")
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return self

    async def touch(self) -> None:
        """Renew the lease; raises LostOwnership when the session is gone."""
        try:
            await self.conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            raise LostOwnership(f"lease of run {self.run_id} lost: {exc.sqlstate}") from exc

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            # Closing the session releases the lock; an explicit unlock would need a live
            # session, which a fenced owner may not have.
            await self._conn.close()
            self._conn = None
