"""The activity owner's lease: a session advisory lock on a dedicated connection
(R-EXEC-2), bounded in every case (R-EXEC-11).

Why a lease and not just the lock: a session advisory lock is held for as long as its
session lives, and a SIGSTOPped (or partitioned) owner keeps its TCP connection, so it
would keep the lock forever. The lock session therefore runs with

* ``idle_session_timeout = lease_s``: ends a session idle outside a transaction;
* ``idle_in_transaction_session_timeout = lease_s``: ends a session idle *inside* an
  open transaction. ``idle_session_timeout`` alone does not apply there, so an owner
  paused between two statements of a transaction would keep its advisory lock (and its
  row locks) forever;
* ``lock_timeout = lease_s``: a statement of the owner never waits on a row lock for
  longer than the lease (it fails with ``LockNotAvailable``, an OperationalError, which
  the activity treats as lost ownership and retries).

The owner touches the session (a read of the run's state) every ``lease_s / 4`` from a
background task, alongside the Temporal heartbeat — never inside the owner's open
transaction: there only the owner's own statements keep the session alive, so an owner
stalled inside a transaction (its process stopped, its event loop blocked, or only its
coroutine suspended while the keeper runs) is ended by ``idle_in_transaction_session_timeout``. A process that stops running stops touching it, and PostgreSQL
itself ends the session, and frees the lock, at most ``lease_s`` after the owner's
last statement *ended*, whether the session was left idle or idle in a transaction, with
no help from the holder. Not covered by those timeouts: a backend still *running* a
statement. The owner's statements are short and ``lock_timeout`` bounds their only
unbounded wait (row locks), so such a statement ends within about ``lease_s`` too; we
do not set ``statement_timeout``, which would also cut a live owner's statement that is
merely slow under load. ``client_connection_check_interval`` (at most ``lease_s``)
ends a running statement early when the client's socket is already gone.

A cut-off network peer (no FIN, no RST) is detected on both ends within about the
lease: the session sets ``tcp_user_timeout`` and ``tcp_keepalives_*`` (the server's
side) and the connection passes libpq's ``keepalives*`` and ``tcp_user_timeout`` (the
client's side). These are best effort: on a unix socket the server accepts and ignores
them, and a tighter non-zero value the server already has is kept. Only the three
timeouts above are mandatory.

Why ``SET`` after connecting and not the ``options=-c ...`` startup parameter: a
session-pooling PgBouncer refuses ``options`` (every lease connect fails) or, with
``ignore_startup_parameters = options``, silently drops it, and then a paused owner
keeps the lock forever. ``SET`` on the session works through any session pooler. The
lease then *reads the settings back* and refuses to own the run (``LeaseNotBounded``,
a retryable LockNotAcquired) when any mandatory one is not in effect; the advisory lock
is taken only after that check.

Timing: PostgreSQL frees the lock ``lease_s`` after the owner's last statement; the
takeover watcher (``qimpl.takeover``, R-EXEC-13) sees the free lock within its poll and
fails the dead attempt by its task token, so the retry does not wait for Temporal's
heartbeat timeout; a retry that a paused worker's outstanding poll takes and never runs
is failed the same way once it is seen started and silent. The retry takes the lock on
its first or second try (a busy lock is a retryable failure). The ``paused-owner``,
``takeover-*`` and ``owner-paused-inside-*`` scenarios measure it.

The session comes from the worker's ready sessions (``qimpl.db.lease_sessions``) when it
has them: already connected, with no lock and no lease setting while it waited; the
settings above are applied and read back at every claim all the same, and the session
goes back only after a clean end, unlocked and reset, or is closed. Without them (tests,
tools) each lease connects anew.

Every owner write is made *on this connection*: once the session is gone, so is the
ability to write, and a resumed zombie's first write fails (the connection is dead) or
is fenced by ``row_version``/``owner_attempt`` (the connection was replaced). Either
way it raises LostOwnership and the zombie stops.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import psycopg
from psycopg import pq

from qimpl.db.lease_sessions import LeaseSessions
from qimpl.db.server_settings import at_most_sql, setting_sql
from qimpl.errors import LockNotAcquired, LostOwnership

__all__ = ["LeaseNotBounded", "OwnershipLease", "client_params", "lock_key_sql"]

#: The advisory lock key of a run: one bigint derived from its id.
lock_key_sql = "hashtextextended('qimpl-run:' || %s, 0)"

#: Session settings (in milliseconds) the lease must read back before it takes the lock.
MANDATORY_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout")

#: The errors with which a lease session that PostgreSQL ended reports itself.
_SESSION_ENDED = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)
#: States in which the run has ended: its owner stops at its next touch (R-Q34-1).
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})


class LeaseNotBounded(LockNotAcquired):
    """The lease session does not run with the timeouts that bound the lease (R-EXEC-11);
    the run is not owned. Retryable, like any LockNotAcquired."""

    code = "lease_not_bounded"


def lease_ms(lease_s: float) -> int:
    """The lease in whole milliseconds, at least 1 (0 would disable the timeouts)."""
    return max(1, int(lease_s * 1000))


def keepalive_s(lease_s: float) -> tuple[int, int, int]:
    """TCP keepalive ``(idle, interval, count)`` in whole seconds (at least 1) so that a
    silent peer is declared dead about ``lease_s`` after the last traffic."""
    return max(1, int(lease_s / 2)), max(1, int(lease_s / 4)), 2


def client_params(lease_s: float) -> dict[str, Any]:
    """libpq's client-side keepalive parameters of a lease session (no ``options``: see the
    module doc)."""
    idle, interval, count = keepalive_s(lease_s)
    params: dict[str, Any] = {"keepalives": 1, "keepalives_idle": idle,
                              "keepalives_interval": interval, "keepalives_count": count}
    if pq.version() >= 120000:  # libpq 12 added tcp_user_timeout
        params["tcp_user_timeout"] = lease_ms(lease_s)
    return params


class OwnershipLease:
    """Async context manager: ``async with OwnershipLease(dsn, run_id, lease_s=2.0, ...) as lease``.

    ``lease_s`` (seconds) bounds how long the run's advisory lock outlives the owner's
    last statement (R-EXEC-2, R-EXEC-11). Raises LockNotAcquired when another session
    holds the run's lock, and LeaseNotBounded (a LockNotAcquired) when the session does
    not run with the lease's timeouts.
    """

    def __init__(self, dsn: str, run_id: str, *, lease_s: float, application_name: str,
                 tenant_id: str, sessions: LeaseSessions | None = None) -> None:
        self.dsn = dsn
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.lease_s = lease_s
        self.application_name = application_name
        #: Ready sessions to check one out from (``qimpl.db.lease_sessions``); None, or a
        #: pool made for another lease or database: a new connection.
        self.sessions = sessions if sessions is not None and sessions.serves(dsn, lease_s) else None
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        """The lease session; every owner write goes through it. Raises LostOwnership when gone."""
        if self._conn is None or self._conn.closed:
            raise LostOwnership(f"lease connection of run {self.run_id} is gone")
        return self._conn

    def live(self) -> bool:
        """Whether this lease still holds its session (False once it has ended, whatever
        became of the session: closed, or back among the ready sessions)."""
        return self._conn is not None and not self._conn.closed

    @property
    def touch_interval_s(self) -> float:
        """Seconds between touches: a quarter of the lease."""
        return self.lease_s / 4

    def _mandatory_settings(self) -> dict[str, int]:
        ms = lease_ms(self.lease_s)
        return dict.fromkeys(MANDATORY_SETTINGS, ms)

    def _best_effort_settings(self) -> dict[str, tuple[int, int]]:
        """name -> (value, ``setting_sql`` scale): in milliseconds (scale 1000), seconds
        (1) or a count (1)."""
        ms = lease_ms(self.lease_s)
        idle, interval, count = keepalive_s(self.lease_s)
        return {"tcp_user_timeout": (ms, 1000), "tcp_keepalives_idle": (idle, 1),
                "tcp_keepalives_interval": (interval, 1), "tcp_keepalives_count": (count, 1),
                "client_connection_check_interval": (ms, 1000)}

    async def _apply_settings(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Set the lease's session settings with ``set_config(..., false)``: the mandatory
        ones to the lease exactly, the best-effort ones to at most the lease (a tighter
        non-zero server value is kept). One statement, or, when the server refuses one of
        them, one statement each, ignoring refusals: ``_verify_and_scope`` judges the result.
        The server's values are read with ``current_setting`` (``setting_sql``), not from
        ``pg_settings``, which formats every one of the server's settings at each read."""
        calls: list[tuple[str, list[Any]]] = [
            ("set_config(%s, %s, false)", [name, str(value)])
            for name, value in self._mandatory_settings().items()]
        calls += [
            ("set_config(%s, " + at_most_sql("%s", "%s", scale) + ", false)",
             [name, name, value, name, value])
            for name, (value, scale) in self._best_effort_settings().items()]
        try:
            await conn.execute("SELECT " + ", ".join(sql for sql, _ in calls),
                               [arg for _, args in calls for arg in args])
            return
        except psycopg.Error:
            if conn.broken:
                raise
        for sql, args in calls:
            try:
                await conn.execute("SELECT " + sql, args)
            except psycopg.Error:
                if conn.broken:
                    raise

    async def _verify_and_scope(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read the mandatory settings back, and in the same statement scope the session to
        the run's tenant and name it after the run; raise LeaseNotBounded naming each
        setting that is not in effect (R-EXEC-11). A refused session is closed by the
        caller, its scope with it."""
        wanted = self._mandatory_settings()
        cur = await conn.execute(
            "SELECT " + ", ".join(setting_sql("%s", 1000) for _ in wanted)
            + ", set_config('qimpl.tenant', %s, false), set_config('application_name', %s, false)",
            [*wanted, self.tenant_id, self.application_name])
        row = await cur.fetchone()
        seen = dict(zip(wanted, row or (), strict=False))
        wrong = [f"{name} is {str(seen[name]) + ' ms' if seen.get(name) is not None else 'not supported'}"
                 f" (expected {value} ms)"
                 for name, value in wanted.items() if seen.get(name) != value]
        if wrong:
            raise LeaseNotBounded(
                f"the lease session of run {self.run_id} is not bounded: " + "; ".join(wrong)
                + " (a pooler or server that ignores SET?); not taking the run's lock")

    async def __aenter__(self) -> OwnershipLease:
        if self.sessions is not None:
            conn = await self.sessions.acquire(timeout_s=self.lease_s)
        else:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name=self.application_name,
                **client_params(self.lease_s),
            )
        try:
            await self._apply_settings(conn)
            # The lease session is the run's only writer: scoped to the run's tenant, so
            # row-level security admits its writes and nothing else (R-AUTH-4). A pooled
            # session is named after the run here (a new one is named at connect).
            await self._verify_and_scope(conn)
            cur = await conn.execute(f"SELECT pg_try_advisory_lock({lock_key_sql})", (self.run_id,))
            row = await cur.fetchone()
            if not (row and row[0]):
                raise LockNotAcquired(f"run {self.run_id} is owned by another session")
        except BaseException:
            await self._end(conn, reuse=False)
            raise
        self._conn = conn
        return self

    async def _end(self, conn: psycopg.AsyncConnection[Any], *, reuse: bool) -> None:
        """Close the session, or give it back to ``sessions`` (reset, its locks freed)."""
        if self.sessions is not None:
            await self.sessions.release(conn, reuse=reuse)
        else:
            await conn.close()

    async def touch(self) -> None:
        """Renew the lease (R-EXEC-11); raises LostOwnership when the session is gone or
        the run has ended (cancelled or expired by another writer: R-Q34-1).

        Touches only a session that is idle outside a transaction: inside the owner's
        transaction the owner's own statements are what keeps it alive (so a stalled
        transaction is still ended by ``idle_in_transaction_session_timeout``), and a touch
        there could run inside a transaction that just failed. Any other error of a touch
        that raced the owner's statements says nothing about the session: the next touch
        tries again."""
        conn = self.conn
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return
        try:
            cur = await conn.execute("SELECT state FROM runs WHERE run_id = %s", (self.run_id,))
            found = await cur.fetchone()
        except _SESSION_ENDED as exc:
            raise LostOwnership(f"lease of run {self.run_id} lost: {exc.sqlstate}") from exc
        except psycopg.Error:
            return
        if found is not None and found[0] in _ENDED:
            # Cancelled or expired by another writer (R-Q34-1): stop now, inside a provider
            # or tool call included, rather than at the next fenced write.
            raise LostOwnership(f"run {self.run_id} is {found[0]}")

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            # Closing the session releases the lock; an explicit unlock would need a live
            # session, which a fenced owner may not have. Only a lease that ended cleanly
            # gives a pooled session back for reuse (unlocked and reset first).
            conn, self._conn = self._conn, None
            await self._end(conn, reuse=et is None)
