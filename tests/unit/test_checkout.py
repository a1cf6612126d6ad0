"""``qimpl.db.checkout``: dead pooled sessions are skipped at once, not after 1 s, 2 s ...
(psycopg_pool's own check loop), and the skipping is bounded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from qimpl.db.checkout import checkout


class _Conn:
    def __init__(self, name: str, *, closed: bool = False, fails: bool = False) -> None:
        self.name, self.closed, self.fails = name, closed, fails


class _Pool:
    """What ``checkout`` uses of an ``AsyncConnectionPool``: getconn, putconn, max_size."""

    def __init__(self, conns: list[_Conn], max_size: int = 8) -> None:
        self.ready, self.max_size, self.returned = list(conns), max_size, list[str]()

    async def getconn(self, timeout: float) -> _Conn:
        if not self.ready:
            raise PoolTimeout(f"none within {timeout}")
        return self.ready.pop(0)

    async def putconn(self, conn: _Conn) -> None:
        self.returned.append(conn.name)


async def _check(conn: Any) -> None:
    if conn.closed or conn.fails:
        raise psycopg.OperationalError("server closed the connection unexpectedly")


def _checkout(pool: _Pool, timeout_s: float = 5.0) -> Any:
    return asyncio.run(checkout(pool, timeout_s, check=_check))  # type: ignore[arg-type]


@pytest.mark.req("R-EXEC-2")
def test_sessions_that_died_while_idle_are_skipped_at_once() -> None:
    """Four sessions ended by a server restart, then a live one: the live one is served
    and the dead ones went back to the pool (which discards them), without a wait
    (psycopg_pool's loop would have waited 1 + 2 + 4 + 8 s)."""
    pool = _Pool([_Conn(f"dead-{i}", closed=True) for i in range(4)] + [_Conn("live")])
    started = time.monotonic()
    assert _checkout(pool).name == "live"
    assert time.monotonic() - started < 0.5
    assert pool.returned == [f"dead-{i}" for i in range(4)]


@pytest.mark.req("R-EXEC-2")
def test_an_open_session_that_fails_its_check_is_an_error_not_skipped() -> None:
    pool = _Pool([_Conn("odd", fails=True), _Conn("live")])
    with pytest.raises(psycopg.OperationalError):
        _checkout(pool)
    assert pool.returned == ["odd"]


@pytest.mark.req("R-EXEC-2")
def test_skipping_is_bounded_by_the_pool_size() -> None:
    """A server that ends every session at once is not retried in a busy loop: after a
    pool's worth of closed sessions the check's error is raised."""
    pool = _Pool([_Conn(f"dead-{i}", closed=True) for i in range(10)], max_size=3)
    with pytest.raises(psycopg.OperationalError):
        _checkout(pool)
    assert len(pool.returned) == 4


@pytest.mark.req("R-EXEC-2")
def test_no_session_ready_is_a_pool_timeout() -> None:
    pool = _Pool([_Conn("dead", closed=True)])
    with pytest.raises(PoolTimeout):
        _checkout(pool, timeout_s=0.1)
    assert pool.returned == ["dead"]
