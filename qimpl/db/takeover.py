"""The takeover watcher's SQL (R-EXEC-13): which ``running`` runs have lost their lease,
and which worker watches.

``lease_orphans`` calls ``qimpl_lease_orphans`` (migration ``20261213_100000_watcher_scale``):
a run is an orphan when its row says ``running``, no session holds its advisory lock and
no counted failure's backoff is still running (``retry_not_before``, the database's
clock: that owner let the run go on purpose). The owner takes that lock before it claims
and holds it on the session that makes all of its writes, so an orphan's owner can never
write again. The call reads across tenants (``SECURITY DEFINER``), reads the lock table
once (a hash anti join: linear in running runs, R-EXEC-14), returns a page from ``after``
on in ``run_id`` order, and returns only ids, the generation, the owner's attempt and its
task token.

``hold_watch`` elects one watcher per task queue at a time with a session advisory lock on
the watcher's own connection, whose session is bounded like a lease: a paused or cut-off
watcher loses the election within ``lease_s`` and another worker of its deployment takes
over. One election per queue, not per database: a watcher fails every deployment's dead
attempts but moves only its own queue's runs (``qimpl.takeover.should_move``), so with
two deployments on one database a database-wide election let the other deployment's
watcher win, and a retry moved by a watcher that then died was never moved again (issue
55). With one per queue each deployment's watcher moves its own runs, and the runs of a
queue whose every worker is gone are still failed by the others (``takeover-of-a-swallowed-retry``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from qimpl.db.sessions import bound_session

__all__ = ["WATCH_LOCK_SQL", "Orphan", "bound_watch_session", "hold_watch", "lease_orphans", "release_watch"]

#: The watcher election's advisory lock of the task queue given as the statement's
#: parameter (one per queue: ``hold_watch``).
WATCH_LOCK_SQL = "hashtextextended('qimpl-takeover-watcher:' || %(queue)s, 0)"


@dataclass(frozen=True)
class Orphan:
    """A ``running`` run whose lease is gone. ``owner_task_token`` is None for a run
    claimed before the token was stored."""

    run_id: str
    tenant_id: str
    generation: int
    owner_attempt: int | None
    owner_task_token: bytes | None


async def bound_watch_session(conn: psycopg.AsyncConnection[Any], *, lease_s: float) -> None:
    """Bound the watcher's session like a lease (``idle_session_timeout``,
    ``idle_in_transaction_session_timeout`` and ``lock_timeout``, ``lease_s`` seconds):
    PostgreSQL ends a watcher that stops running, and with it its election."""
    await bound_session(conn, lock_timeout_s=lease_s)
    await conn.execute("SELECT set_config('idle_session_timeout', %s, false)",
                       (f"{max(1, int(lease_s * 1000))}ms",))


async def hold_watch(conn: psycopg.AsyncConnection[Any], task_queue: str = "") -> bool:
    """True when this session is (or now becomes) the watcher of ``task_queue`` (``""``:
    a watcher of no deployment's queue, as the tests' plain watchers). Session-level:
    call it before every look; it never waits. The lock is taken once: a session
    advisory lock is re-entrant, so the check reads this session's own locks first
    (the watcher's session holds no other lock, so that read stays small)."""
    cur = await conn.execute(
        f"SELECT pg_try_advisory_lock({WATCH_LOCK_SQL})"
        " WHERE NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND pid = pg_backend_pid() AND objsubid = 1"
        f" AND ((classid::bigint << 32) | objid::bigint) = {WATCH_LOCK_SQL})", {"queue": task_queue})
    row = await cur.fetchone()
    # No row: this session holds it already (not taken twice: one unlock releases it).
    return row is None or bool(row[0])


async def release_watch(conn: psycopg.AsyncConnection[Any]) -> None:
    """Give the election up (a watcher that cannot reach Temporal lets another watch)."""
    await conn.execute("SELECT pg_advisory_unlock_all()")


async def lease_orphans(conn: psycopg.AsyncConnection[Any], *, limit: int = 100,
                        after: str | None = None) -> list[Orphan]:
    """The ``running`` runs whose lease no session holds and whose backoff has passed, at
    most ``limit`` (1..1000), in ``run_id`` order from ``after`` (exclusive; None: the first)."""
    cur = await conn.execute(
        "SELECT run_id, tenant_id, generation, owner_attempt, owner_task_token"
        " FROM qimpl_lease_orphans(%s, %s::uuid)", (limit, after))
    return [Orphan(run_id=str(r[0]), tenant_id=str(r[1]), generation=int(r[2]),
                   owner_attempt=None if r[3] is None else int(r[3]),
                   owner_task_token=None if r[4] is None else bytes(r[4]))
            for r in await cur.fetchall()]
