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
        if allowed:
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
