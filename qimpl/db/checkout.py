"""A checked connection from a psycopg pool, without waiting between dead sessions.

psycopg_pool checks a connection on checkout when given ``check=``, but after each one
that fails it waits before trying the next: 1 s, then 2 s, 4 s ... (psycopg_pool 3.3,
``_getconn_with_check_loop``, to avoid a busy loop). After a PostgreSQL restart every
idle session of a pool is dead, and N of them cost the next checkout 2^N - 1 s: measured
on the embedded stack, a worker's lease-session pool with 2 idle sessions answered its
first checkout after a restart in 2.9 s, with 4 in 6.4 s, with 8 not within 10 s — while
the server accepted connections again at once. A worker then failed every attempt
``no lease session ready`` for those seconds.

``checkout`` checks the connection itself: one that fails its check *closed* (the server
ended it while it sat in the pool) goes back to the pool, which discards it and opens a
new one in the background, and the next connection is taken at once. At most one pool's
worth of them (``max_size``) is skipped this way per checkout, so a server that ends
every new session at once is not retried in a busy loop: the check's error is raised.
When no connection is ready, ``getconn`` waits for the pool's own reconnection (which
backs off while the server refuses connections, as it should).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

__all__ = ["RECONNECT_TIMEOUT_S", "checkout"]

#: A pool's ``reconnect_timeout``, seconds: how long one connection slot keeps retrying a
#: server that refuses it before the pool gives it up. psycopg_pool retries 1 s, 2 s, 4 s
#: ... apart, for 300 s by default: after an outage of 10 s the next try came up to 5.7 s
#: after the server was back, and every request meanwhile was a 503. With 2 s a slot gives
#: up within 2 s, and the next request that waits opens a new one at once (a try or two a
#: second per pool while the server is down). Measured on the embedded stack, 10 s down:
#: the first checkout 0.45 s after the server was back (3.9-5.7 s with the default).
RECONNECT_TIMEOUT_S = 2.0


async def checkout(pool: AsyncConnectionPool[Any], timeout_s: float, *,
                   check: Callable[[Any], Awaitable[None]]) -> Any:
    """A connection of ``pool`` that passed ``check`` (an async callable raising on a
    connection that does not work), within ``timeout_s`` seconds.

    Raises ``PoolTimeout`` when none is ready in time (every connection in use, or the
    server refusing connections), and the check's own error when a connection that is
    still open fails it (or a closed one fails it beyond ``max_size`` times): in both
    cases the connection went back to the pool first. Return it with ``pool.putconn``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    skipped = 0
    while True:
        conn = await pool.getconn(timeout=max(deadline - loop.time(), 0.0))
        try:
            await check(conn)
        except psycopg.Error:
            closed = conn.closed
            await pool.putconn(conn)  # a closed one is discarded and replaced by the pool
            if not closed or skipped >= pool.max_size:
                raise
            skipped += 1
            if loop.time() >= deadline:
                raise PoolTimeout(f"no working connection within {timeout_s:g} s "
                                  f"({skipped} found closed)") from None
            continue
        except BaseException:
            await pool.putconn(conn)
            raise
        return conn
