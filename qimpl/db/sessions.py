"""Bounds on the sessions that are not a run's lease: the API's pool, the reconciler, the
give-up activity (R-EXEC-8, R-EXEC-11).

A run's row can be locked by any of them (a cancel, a resume, an approval, a sweep). A
process that is paused or cut off inside such a transaction must not keep the lock —
and so keep the owner from writing, and the run from ending at its deadline — for
longer than a known bound: every such session runs with ``lock_timeout`` (it never waits
longer than that for a row) and ``idle_in_transaction_session_timeout`` (PostgreSQL ends
it if it sits inside a transaction that long), both ``lock_timeout_s`` seconds, plus TCP
keepalives so that a silent peer is noticed.

None of those notices a server that *stops answering* while the TCP connection stays up
(a hung server or pooler, a stalled middlebox, a proxy that holds the bytes): the client
just waits for a reply. ``cut_after`` bounds that wait on the client's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["bound_session", "cut_after", "keepalive_params"]


@contextlib.asynccontextmanager
async def cut_after(conn: Any, seconds: float) -> AsyncIterator[Any]:
    """Bound everything done on ``conn`` (a psycopg ``AsyncConnection``) inside the block
    by ``seconds``, on the client's side: at expiry the connection's socket is shut down
    (``shutdown(SHUT_RDWR)``, the descriptor left to psycopg), so the statement or commit
    in flight fails at once with ``psycopg.OperationalError`` and the pool discards the
    connection. Not a cancel: PostgreSQL may or may not have received what was sent (a
    commit may have landed), which is why callers answer "retry with the same
    idempotency key". Issue 23, item 3; R-CREATE-1."""
    fd = conn.pgconn.socket

    def cut() -> None:
        with contextlib.suppress(OSError):
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    handle = asyncio.get_running_loop().call_later(seconds, cut)
    try:
        yield conn
    finally:
        handle.cancel()


def keepalive_params(within_s: float) -> dict[str, Any]:
    """libpq connection parameters declaring a silent server dead after about ``within_s``
    seconds (``tcp_user_timeout`` in ms, keepalive times in whole seconds)."""
    seconds = max(1, int(within_s))
    return {"keepalives": 1, "keepalives_idle": seconds, "keepalives_interval": max(1, seconds // 2),
            "keepalives_count": 2, "tcp_user_timeout": seconds * 1000}


async def bound_session(conn: Any, *, lock_timeout_s: float) -> None:
    """Set the session's ``lock_timeout`` and ``idle_in_transaction_session_timeout`` to
    ``lock_timeout_s`` seconds (``conn`` in autocommit, outside a transaction)."""
    ms = f"{max(1, int(lock_timeout_s * 1000))}ms"
    await conn.execute("SELECT set_config('lock_timeout', %s, false),"
                       " set_config('idle_in_transaction_session_timeout', %s, false)", (ms, ms))
