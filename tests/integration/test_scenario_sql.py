"""``ScenarioContext.sql`` keeps one session per scenario and reopens it when the server
closed it (issue 24: a connection per call cost a backend start and a SCRAM exchange)."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any

import psycopg

from qualify.scenarios.base import ScenarioContext


def _context(dsn: str) -> ScenarioContext:
    return ScenarioContext(deployment=SimpleNamespace(dsn=dsn), processes=None, history=None,  # type: ignore[arg-type]
                           nemesis=None, rng=random.Random(0))  # type: ignore[arg-type]


def test_one_session_reopened_after_the_server_ends_it(stack: Any) -> None:
    dsn = str(stack.create_database())
    ctx = _context(dsn)
    try:
        pid = ctx.sql("SELECT pg_backend_pid()")[0][0]
        assert ctx.sql("SELECT pg_backend_pid()")[0][0] == pid, "a second call opened a second session"
        with psycopg.connect(dsn, autocommit=True) as other:
            assert other.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            deadline = time.monotonic() + 10
            while other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (0,):
                assert time.monotonic() < deadline, "the terminated session did not end"
                time.sleep(0.02)
        # The terminated session's socket is readable (the server's FATAL, then EOF): the
        # next call reopens instead of failing.
        again = ctx.sql("SELECT pg_backend_pid()")[0][0]
        assert again != pid
    finally:
        ctx.close()
    # A backend ends a moment after its client hangs up, and an autovacuum worker may be in
    # the same database: wait, with a deadline, for this session's own pid to be gone.
    with psycopg.connect(dsn, autocommit=True) as other:
        deadline = time.monotonic() + 10
        while other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (again,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "close() left the session open"
            time.sleep(0.02)
