"""The database transition guard against the real trigger (R-STATE-1, R-EXEC-7)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from qimpl.lifecycle import TERMINAL, TRANSITIONS, RunState


@pytest.fixture(scope="module")
def conn(stack: Any) -> psycopg.Connection[Any]:
    with psycopg.connect(stack.create_database(), autocommit=True) as c:
        yield c


def _new_run(conn: psycopg.Connection[Any], state: str = "accepted") -> str:
    run_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
        " deadline_at) VALUES (%s, 't', 'p', 'a', %s, 'x', 'k', now() + interval '1 hour')",
        (run_id, state),
    )
    return run_id


def _move(conn: psycopg.Connection[Any], run_id: str, new: str, bump: int = 1) -> None:
    conn.execute("UPDATE runs SET state = %s, row_version = row_version + %s WHERE run_id = %s",
                 (new, bump, run_id))


@pytest.mark.req("R-STATE-1")
@pytest.mark.parametrize("old", list(RunState))
def test_guard_matches_the_model_for_every_pair(conn: psycopg.Connection[Any], old: RunState) -> None:
    for new in RunState:
        run_id = _new_run(conn, old.value)
        allowed = old not in TERMINAL and (old, new) in TRANSITIONS
        if allowed and new == RunState.EXPIRED:
            # Allowed by the table, refused by the clock: the deadline is an hour away (R-EXEC-12).
            with pytest.raises(psycopg.Error) as err:
                _move(conn, run_id, new.value)
            assert err.value.sqlstate == "QG007"
        elif allowed:
            _move(conn, run_id, new.value)
        else:
            with pytest.raises(psycopg.Error) as err:
                _move(conn, run_id, new.value)
            assert err.value.sqlstate in ("QG001", "QG002")


@pytest.mark.req("R-STATE-1")
@pytest.mark.parametrize("bump", [0, 2, -1])
def test_row_version_must_rise_by_exactly_one(conn: psycopg.Connection[Any], bump: int) -> None:
    run_id = _new_run(conn)
    with pytest.raises(psycopg.Error) as err:
        _move(conn, run_id, "queued", bump)
    assert err.value.sqlstate == "QG003"


@pytest.mark.req("R-EXEC-8")
def test_deadline_is_immutable(conn: psycopg.Connection[Any]) -> None:
    run_id = _new_run(conn)
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE runs SET state = 'queued', row_version = row_version + 1,"
                     " deadline_at = deadline_at + interval '1 hour' WHERE run_id = %s", (run_id,))
    assert err.value.sqlstate == "QG004"


@pytest.mark.req("R-Q-5")
def test_every_write_is_recorded_by_the_database(conn: psycopg.Connection[Any]) -> None:
    run_id = _new_run(conn)
    _move(conn, run_id, "queued")
    _move(conn, run_id, "running")
    rows = conn.execute("SELECT row_version, old_state, new_state FROM run_transitions"
                        " WHERE run_id = %s ORDER BY id", (run_id,)).fetchall()
    assert rows == [(1, None, "accepted"), (2, "accepted", "queued"), (3, "queued", "running")]


def _run_with_deadline(conn: psycopg.Connection[Any], state: str, seconds: float) -> str:
    run_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
        " deadline_at, owner_attempt) VALUES (%s, 't', 'p', 'a', %s, 'x', 'k',"
        " clock_timestamp() + make_interval(secs => %s), 3)",
        (run_id, state, seconds),
    )
    return run_id


@pytest.mark.req("R-EXEC-12")
def test_expired_is_refused_before_the_deadline_by_the_database_clock(conn: psycopg.Connection[Any]) -> None:
    run_id = _run_with_deadline(conn, "running", 60)
    with pytest.raises(psycopg.Error) as err:
        _move(conn, run_id, "expired")
    assert err.value.sqlstate == "QG007"
    _move(conn, run_id, "failed")  # other endings stay possible


@pytest.mark.req("R-EXEC-8")
@pytest.mark.parametrize(("old", "new"), [("running", "running"), ("queued", "running"),
                                          ("awaiting_input", "accepted"), ("accepted", "queued"),
                                          ("running", "completed"), ("awaiting_approval", "queued")])
def test_progress_is_refused_after_the_deadline(conn: psycopg.Connection[Any], old: str, new: str) -> None:
    run_id = _run_with_deadline(conn, old, -0.001)
    with pytest.raises(psycopg.Error) as err:
        _move(conn, run_id, new)
    assert err.value.sqlstate == "QG006"
    _move(conn, run_id, "expired")


@pytest.mark.req("R-EXEC-7")
def test_the_owner_attempt_never_goes_back_within_a_generation(conn: psycopg.Connection[Any]) -> None:
    run_id = _run_with_deadline(conn, "running", 60)
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE runs SET row_version = row_version + 1, owner_attempt = 2"
                     " WHERE run_id = %s", (run_id,))
    assert err.value.sqlstate == "QG008"
    conn.execute("UPDATE runs SET row_version = row_version + 1, owner_attempt = 4 WHERE run_id = %s",
                 (run_id,))


@pytest.mark.req("R-EXEC-7")
def test_a_claim_by_a_superseded_attempt_is_refused(stack: Any) -> None:
    """``RunOwner.claim`` refuses an attempt lower than the stored owner, on the real
    database, before the trigger would (and writes nothing)."""
    import asyncio

    from qimpl.db.owner import RunOwner
    from qimpl.errors import LostOwnership

    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as c:
        run_id = _run_with_deadline(c, "running", 60)

    async def claim(attempt: int) -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await RunOwner.claim(aconn, run_id, generation=1, attempt=attempt)

    with pytest.raises(LostOwnership, match="attempt 2 is lower than its owner's attempt 3"):
        asyncio.run(claim(2))
    taken = asyncio.run(claim(4))
    assert taken.owner is not None and taken.row["owner_attempt"] == 4


@pytest.mark.req("R-EXEC-8")
def test_a_claim_after_the_deadline_expires_the_run(stack: Any) -> None:
    import asyncio

    from qimpl.db.owner import RunOwner

    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as c:
        run_id = _run_with_deadline(c, "queued", -0.001)

    async def claim() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await RunOwner.claim(aconn, run_id, generation=1, attempt=4)

    got = asyncio.run(claim())
    assert got.owner is None and got.row["state"] == "expired"
    assert got.row["error_code"] == "deadline_exceeded"
