"""``qualify.run_notices``: a scenario's waits wake on the product's run notifications
(issue 24, item 2), and a lost LISTEN session wakes them too (it may have missed some)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from qualify import run_notices
from qualify.procs import wait_until
from qualify.run_notices import CHANNEL, RunNotices


@pytest.fixture
def notices(stack: Any) -> Any:
    dsn = str(stack.create_database())
    watch = RunNotices(dsn, fallback_s=30.0).start()
    try:
        wait_until(lambda: watch.seen("x")[0] >= 1, timeout_s=10, what="the LISTEN session")
        yield dsn, watch
    finally:
        watch.close()


@pytest.mark.req("R-Q-2")
def test_a_wait_wakes_on_its_runs_notification_only(notices: Any) -> None:
    dsn, watch = notices
    mark = watch.seen("run-a")
    assert watch.wait("run-a", mark, timeout_s=0.2) is False        # nothing happened
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, 'run-b:1')", (CHANNEL,))
        assert watch.wait("run-a", mark, timeout_s=0.5) is False    # another run's
        conn.execute("SELECT pg_notify(%s, 'run-a:7')", (CHANNEL,))
    started = time.monotonic()
    assert watch.wait("run-a", mark, timeout_s=20) is True
    assert time.monotonic() - started < 10, "woken by the fallback, not the notification"


@pytest.mark.req("R-Q-2")
def test_a_lost_session_wakes_every_wait(notices: Any) -> None:
    dsn, watch = notices
    mark = watch.seen("run-a")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE application_name = 'qualify-run-notices' AND datname = current_database()")
    started = time.monotonic()
    assert watch.wait("run-a", mark, timeout_s=20) is True
    assert time.monotonic() - started < 10
    assert watch.seen("run-a")[0] == mark[0] + 1


@pytest.mark.req("R-Q-2")
def test_close_wakes_the_listener(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no other wake for 30 s, ``close`` ends the thread within its 5 s join only
    through the stop notification."""
    monkeypatch.setattr(run_notices, "_STOP_CHECK_S", 30.0)
    dsn = str(stack.create_database())
    watch = RunNotices(dsn).start()
    wait_until(lambda: watch.seen("x")[0] >= 1, timeout_s=10, what="the LISTEN session")
    with psycopg.connect(dsn, autocommit=True) as conn:
        watch.close(wake=lambda sql: conn.execute(sql))
    assert not watch._thread.is_alive(), "the stop notification did not wake the listener"
