"""The tool journal's own trigger and the guard's journal refusal, against the real
database (R-TOOL-1, R-TOOL-3, R-RESUME-3, R-EXEC-7): what the database *refuses*."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest


@pytest.fixture(scope="module")
def conn(stack: Any) -> psycopg.Connection[Any]:
    with psycopg.connect(stack.create_database(), autocommit=True) as c:
        yield c


def _running(conn: psycopg.Connection[Any], attempt: int = 1) -> str:
    """A run owned by ``attempt`` in generation 1, at row_version 3."""
    run_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
        " deadline_at) VALUES (%s, 't', 'p', 'a', 'accepted', 'x', 'k', now() + interval '1 hour')",
        (run_id,))
    conn.execute("UPDATE runs SET state = 'queued', row_version = 2 WHERE run_id = %s", (run_id,))
    conn.execute("UPDATE runs SET state = 'running', row_version = 3, owner_attempt = %s"
                 " WHERE run_id = %s", (attempt, run_id))
    return run_id


def _intent(cur: Any, run_id: str, call_id: str, *, attempt: int, row_version: int,
            generation: int = 1, status: str = "intent", settled_by: str | None = None) -> None:
    cur.execute(
        "INSERT INTO tool_invocations (run_id, call_id, tenant_id, generation, step, position, tool,"
        " kind, arguments, arguments_digest, status, intent_attempt, intent_row_version,"
        " settled_by) VALUES (%s, %s, 't', %s, 1, 0, 'charge', 'instrumented', '{}', 'd', %s, %s,"
        " %s, %s)", (run_id, call_id, generation, status, attempt, row_version, settled_by))


def _owner_intent(conn: psycopg.Connection[Any], run_id: str, call_id: str, attempt: int = 1) -> int:
    """The owner's write: bump the run and insert the intent in one transaction."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("UPDATE runs SET row_version = row_version + 1 WHERE run_id = %s"
                    " RETURNING row_version", (run_id,))
        got = cur.fetchone()
        assert got is not None
        _intent(cur, run_id, call_id, attempt=attempt, row_version=int(got[0]))
        return int(got[0])


@pytest.mark.req("R-TOOL-1", "R-EXEC-7")
def test_only_the_owner_at_its_row_version_writes_an_intent(conn: psycopg.Connection[Any]) -> None:
    run_id = _running(conn, attempt=2)
    with conn.cursor() as cur:
        for attempt, row_version in ((1, 3), (2, 2), (2, 4)):  # superseded, stale, future
            with pytest.raises(psycopg.Error) as err:
                _intent(cur, run_id, f"c-{attempt}-{row_version}", attempt=attempt, row_version=row_version)
            assert err.value.sqlstate == "QG009"
    _owner_intent(conn, run_id, "c-ok", attempt=2)
    assert conn.execute("SELECT status FROM tool_invocations WHERE call_id = 'c-ok'").fetchone() == ("intent",)


@pytest.mark.req("R-TOOL-1")
def test_a_settled_invocation_never_changes(conn: psycopg.Connection[Any]) -> None:
    run_id = _running(conn)
    _owner_intent(conn, run_id, "c-settle")
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("UPDATE runs SET row_version = row_version + 1 WHERE run_id = %s RETURNING row_version",
                    (run_id,))
        got = cur.fetchone()
        assert got is not None
        cur.execute("UPDATE tool_invocations SET status = 'succeeded', result = '{}', outcome_row_version = %s,"
                    " settled_by = 'worker' WHERE run_id = %s AND call_id = 'c-settle'", (got[0], run_id))
    for sql in ("UPDATE tool_invocations SET status = 'failed' WHERE call_id = 'c-settle'",
                "UPDATE tool_invocations SET result = '{\"x\": 1}' WHERE call_id = 'c-settle'",
                "DELETE FROM tool_invocations WHERE call_id = 'c-settle'"):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert err.value.sqlstate == "QG011", sql


@pytest.mark.req("R-TOOL-3")
def test_no_one_but_the_owner_settles_a_live_run(conn: psycopg.Connection[Any]) -> None:
    run_id = _running(conn)
    _owner_intent(conn, run_id, "c-live")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("UPDATE tool_invocations SET status = 'succeeded', settled_by = 'operator:o'"
                     " WHERE call_id = 'c-live'")
    assert err.value.sqlstate == "QG009"


@pytest.mark.req("R-RESUME-3", "R-TOOL-3")
def test_a_run_with_an_unknown_outcome_is_not_resumed(conn: psycopg.Connection[Any]) -> None:
    run_id = _running(conn)
    version = _owner_intent(conn, run_id, "c-park")
    conn.execute("UPDATE runs SET state = 'awaiting_input', row_version = %s WHERE run_id = %s",
                 (version + 1, run_id))
    resume = ("UPDATE runs SET state = 'accepted', row_version = row_version + 1,"
              " generation = generation + 1, owner_attempt = NULL WHERE run_id = %s")
    with pytest.raises(psycopg.Error) as err:
        conn.execute(resume, (run_id,))
    assert err.value.sqlstate == "QG010"
    conn.execute("UPDATE tool_invocations SET status = 'not_executed', settled_by = 'operator:o'"
                 " WHERE call_id = 'c-park'")
    conn.execute(resume, (run_id,))
    assert conn.execute("SELECT state, generation FROM runs WHERE run_id = %s",
                        (run_id,)).fetchone() == ("accepted", 2)
