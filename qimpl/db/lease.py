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

A worker's leases share a few sessions (``qimpl.db.lease_carriers``, issue 55): each
carries the locks of many of its runs, with the settings above applied and read back
once per session, before any lock is taken on it; every block of a lease's statements
holds the session alone, scoped to its run's tenant and owner. Without them (tests,
tools) each lease connects anew.

Every owner write is made *on this connection*: once the session is gone, so is the
ability to write, and a resumed zombie's first write fails (the connection is dead) or
is fenced by ``row_version``/``owner_attempt`` (the connection was replaced). Either
way it raises LostOwnership and the zombie stops.
"""

from __future__ import annotations

import math
from types import TracebackType
from typing import Any, cast

import psycopg
from psycopg import pq

from qimpl.db.lease_carriers import (
    APPLICATION_NAME,
    ENDED_STATES,
    CarriedConnection,
    LeaseCarriers,
    lock_key_sql,
)
from qimpl.db.server_settings import at_most_sql, setting_sql
from qimpl.errors import LockNotAcquired, LostOwnership

__all__ = ["LeaseNotBounded", "OwnershipLease", "client_params", "lease_carriers", "lock_key_sql"]


#: Session settings (in milliseconds) the lease must read back before it takes the lock.
MANDATORY_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout")

#: The errors with which a lease session that PostgreSQL ended reports itself.
_SESSION_ENDED = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


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


def _mandatory_settings(lease_s: float) -> dict[str, int]:
    return dict.fromkeys(MANDATORY_SETTINGS, lease_ms(lease_s))


def _best_effort_settings(lease_s: float) -> dict[str, tuple[int, int]]:
    """name -> (value, ``setting_sql`` scale): in milliseconds (scale 1000), seconds (1)
    or a count (1)."""
    ms = lease_ms(lease_s)
    idle, interval, count = keepalive_s(lease_s)
    return {"tcp_user_timeout": (ms, 1000), "tcp_keepalives_idle": (idle, 1),
            "tcp_keepalives_interval": (interval, 1), "tcp_keepalives_count": (count, 1),
            "client_connection_check_interval": (ms, 1000)}


async def apply_settings(conn: psycopg.AsyncConnection[Any], lease_s: float) -> None:
    """Set the lease's session settings with ``set_config(..., false)``: the mandatory ones
    to the lease exactly, the best-effort ones to at most the lease (a tighter non-zero
    server value is kept). One statement, or, when the server refuses one of them, one
    statement each, ignoring refusals: ``verify_settings`` judges the result. The server's
    values are read with ``current_setting`` (``setting_sql``), not from ``pg_settings``,
    which formats every one of the server's settings at each read."""
    calls: list[tuple[str, list[Any]]] = [
        ("set_config(%s, %s, false)", [name, str(value)])
        for name, value in _mandatory_settings(lease_s).items()]
    calls += [
        ("set_config(%s, " + at_most_sql("%s", "%s", scale) + ", false)",
         [name, name, value, name, value])
        for name, (value, scale) in _best_effort_settings(lease_s).items()]
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


async def verify_settings(conn: psycopg.AsyncConnection[Any], lease_s: float, *, tenant_id: str,
                          application_name: str, what: str) -> None:
    """Read the mandatory settings back, and in the same statement scope the session to
    ``tenant_id`` and name it; raise LeaseNotBounded naming each setting that is not in
    effect (R-EXEC-11). A refused session is closed by the caller, its scope with it."""
    wanted = _mandatory_settings(lease_s)
    cur = await conn.execute(
        "SELECT " + ", ".join(setting_sql("%s", 1000) for _ in wanted)
        + ", set_config('qimpl.tenant', %s, false), set_config('application_name', %s, false)",
        [*wanted, tenant_id, application_name])
    row = await cur.fetchone()
    seen = dict(zip(wanted, row or (), strict=False))
    wrong = [f"{name} is {str(seen[name]) + ' ms' if seen.get(name) is not None else 'not supported'}"
             f" (expected {value} ms)"
             for name, value in wanted.items() if seen.get(name) != value]
    if wrong:
        raise LeaseNotBounded(
            f"the lease session of {what} is not bounded: " + "; ".join(wrong)
            + " (a pooler or server that ignores SET?); not taking the run's lock")


def lease_carriers(dsn: str, *, lease_s: float, runs_per_session: int, max_runs: int) -> LeaseCarriers:
    """A worker's lease sessions (``qimpl.db.lease_carriers``) for leases of ``lease_s``
    seconds: ``runs_per_session`` runs on each, enough sessions for ``max_runs`` runs at
    once. Each new session runs with the lease's settings, read back before any run's lock
    is taken on it (``LeaseNotBounded`` otherwise)."""

    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name=APPLICATION_NAME, **client_params(lease_s))

    async def bound(conn: psycopg.AsyncConnection[Any]) -> None:
        await apply_settings(conn, lease_s)
        await verify_settings(conn, lease_s, tenant_id="", application_name=APPLICATION_NAME,
                              what="a carrier")

    return LeaseCarriers(dsn, lease_s=lease_s, runs_per_session=runs_per_session,
                         max_sessions=max(1, math.ceil(max_runs / runs_per_session)),
                         connect=connect, bound=bound)


class OwnershipLease:
    """Async context manager: ``async with OwnershipLease(dsn, run_id, lease_s=2.0, ...) as lease``.

    ``lease_s`` (seconds) bounds how long the run's advisory lock outlives the owner's
    last statement (R-EXEC-2, R-EXEC-11). Raises LockNotAcquired when another session
    holds the run's lock (``AlreadyOwned`` when an attempt on this worker does), and
    LeaseNotBounded (a LockNotAcquired) when the session does not run with the lease's
    timeouts. ``carriers``: the worker's lease sessions, each carrying many runs' locks
    (``qimpl.db.lease_carriers``); None, or ones made for another lease or database: a
    session of its own. ``writer``: the owner's identity the audit records
    (``run:generation:attempt``), set on a shared session at each of its blocks.
    """

    def __init__(self, dsn: str, run_id: str, *, lease_s: float, application_name: str,
                 tenant_id: str, carriers: LeaseCarriers | None = None, writer: str = "") -> None:
        self.dsn = dsn
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.lease_s = lease_s
        self.application_name = application_name
        self.writer = writer
        self.carriers = carriers if carriers is not None and carriers.serves(dsn, lease_s) else None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._carried: CarriedConnection | None = None

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        """The lease session; every owner write goes through it. Raises LostOwnership when gone.
        On a carrier, the lease's view of the shared session (``CarriedConnection``: the
        subset of a connection the owner uses)."""
        if self._carried is not None:
            if self._carried.closed:
                raise LostOwnership(f"lease of run {self.run_id} is gone")
            return cast("psycopg.AsyncConnection[Any]", self._carried)
        if self._conn is None or self._conn.closed:
            raise LostOwnership(f"lease connection of run {self.run_id} is gone")
        return self._conn

    def live(self) -> bool:
        """Whether this lease still holds its session (False once it has ended, whatever
        became of the session)."""
        if self._carried is not None:
            return not self._carried.closed
        return self._conn is not None and not self._conn.closed

    @property
    def touch_interval_s(self) -> float:
        """Seconds between touches: a quarter of the lease."""
        return self.lease_s / 4

    async def _apply_settings(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The lease's session settings on a session of its own (``apply_settings``)."""
        await apply_settings(conn, self.lease_s)

    async def __aenter__(self) -> OwnershipLease:
        if self.carriers is not None:
            self._carried = await self.carriers.carry(self.run_id, scope=(self.tenant_id, self.writer))
            return self
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name=self.application_name,
            **client_params(self.lease_s),
        )
        try:
            await self._apply_settings(conn)
            # The lease session is the run's only writer: scoped to the run's tenant, so
            # row-level security admits its writes and nothing else (R-AUTH-4).
            await verify_settings(conn, self.lease_s, tenant_id=self.tenant_id,
                                  application_name=self.application_name, what=f"run {self.run_id}")
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
        """Renew the lease (R-EXEC-11); raises LostOwnership when the session is gone or
        the run has ended (cancelled or expired by another writer: R-Q34-1).

        Touches only a session that is idle outside a transaction: inside the owner's
        transaction the owner's own statements are what keeps it alive (so a stalled
        transaction is still ended by ``idle_in_transaction_session_timeout``), and a touch
        there could run inside a transaction that just failed. Any other error of a touch
        that raced the owner's statements says nothing about the session: the next touch
        tries again."""
        if self._carried is not None:
            self._carried.touch()  # its carrier's keeper touched the session (qimpl.db.lease_carriers)
            return
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
        if found is not None and found[0] in ENDED_STATES:
            # Cancelled or expired by another writer (R-Q34-1): stop now, inside a provider
            # or tool call included, rather than at the next fenced write.
            raise LostOwnership(f"run {self.run_id} is {found[0]}")

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._carried is not None and self.carriers is not None:
            # The run's lock is given back on the shared session (unlocked, or the session
            # broken when it is not idle) before the activity returns.
            carried, self._carried = self._carried, None
            await self.carriers.release(carried, clean=et is None)
            self._carried = carried  # ended: ``live`` is False, ``conn`` raises LostOwnership
        elif self._conn is not None:
            # Closing the session releases the lock; an explicit unlock would need a live
            # session, which a fenced owner may not have.
            conn, self._conn = self._conn, None
            await conn.close()
