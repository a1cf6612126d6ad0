"""The guard on every write of a run and on its checkpoints, as the application roles
(issue 22, items 2-3; R-STATE-1, R-EXEC-3, R-EXEC-4, R-EXEC-7, R-AUTH-4).

Each refusal here was accepted before ``20261205_090000_guard_all_writes``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from qualify.stack._embedded import API_ROLE, WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    return str(stack.create_database())


def _as(dsn: str, role: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(with_user(dsn, role), autocommit=True)
    conn.execute("SELECT set_config('qimpl.tenant', 't', false)")
    return conn


@pytest.fixture
def worker(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with _as(dsn, WORKER_ROLE) as conn:
        yield conn


def _seed(dsn: str, *, state: str = "running", owner_attempt: int | None = 5) -> str:
    """A run seeded by the superuser (the guard's only exemption on INSERT)."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                  " deadline_at, owner_attempt) VALUES (%s, 't', 'p', 'a', %s, 'x', 'k',"
                  " now() + interval '1 hour', %s)", (run_id, state, owner_attempt))
    return run_id


def _refused(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> str | None:
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


_INSERT = ("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
           " deadline_at, row_version, generation, owner_attempt) VALUES (%s, 't', 'p', 'a', %s, 'x',"
           " 'k', now() + interval '1 hour', %s, %s, %s)")


@pytest.mark.req("R-STATE-1")
@pytest.mark.parametrize("role", [API_ROLE, WORKER_ROLE])
@pytest.mark.parametrize(("state", "version", "generation", "attempt"), [
    ("completed", 7, 1, None), ("running", 1, 1, 1), ("accepted", 2, 1, None),
    ("accepted", 1, 3, None), ("accepted", 1, 1, 4),
])
def test_an_insert_is_a_new_accepted_run_or_refused(dsn: str, role: str, state: str, version: int,
                                                   generation: int, attempt: int | None) -> None:
    with _as(dsn, role) as conn:
        assert _refused(conn, _INSERT, (str(uuid.uuid4()), state, version, generation, attempt)) == "QG014"


@pytest.mark.req("R-STATE-1")
def test_a_new_accepted_run_is_inserted(dsn: str) -> None:
    with _as(dsn, API_ROLE) as conn:
        assert _refused(conn, _INSERT, (str(uuid.uuid4()), "accepted", 1, 1, None)) is None


@pytest.mark.req("R-EXEC-7")
def test_owner_attempt_cannot_go_back_through_null(dsn: str, worker: psycopg.Connection[Any]) -> None:
    run_id = _seed(dsn)
    assert _refused(worker, "UPDATE runs SET owner_attempt = NULL, row_version = row_version + 1"
                            " WHERE run_id = %s", (run_id,)) == "QG008"
    assert _refused(worker, "UPDATE runs SET owner_attempt = 6, row_version = row_version + 1"
                            " WHERE run_id = %s", (run_id,)) is None


@pytest.mark.req("R-STATE-1")
def test_generation_steps_by_exactly_one(dsn: str, worker: psycopg.Connection[Any]) -> None:
    run_id = _seed(dsn, state="awaiting_input", owner_attempt=None)
    step = ("UPDATE runs SET state = 'accepted', generation = generation + %s,"
            " row_version = row_version + 1 WHERE run_id = %s")
    assert _refused(worker, step, (40, run_id)) == "QG004"
    assert _refused(worker, step, (-1, run_id)) == "QG004"
    assert _refused(worker, step, (1, run_id)) is None


@pytest.mark.req("R-STATE-1")
@pytest.mark.parametrize(("column", "value"), [
    ("stream_key", "other"), ("prompt", "another prompt"), ("agent_id", "b"),
    ("workspace_id", "w2"), ("durability", "legacy"), ("principal_id", "q"),
])
def test_identity_columns_are_immutable(dsn: str, worker: psycopg.Connection[Any], column: str,
                                        value: str) -> None:
    run_id = _seed(dsn)
    assert _refused(worker, f"UPDATE runs SET {column} = %s, row_version = row_version + 1"
                            " WHERE run_id = %s", (value, run_id)) == "QG004"


_CKPT = ("INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version, state_json,"
         " committed_by) VALUES (%s, %s, 1, %s, %s, %s, %s)")


def _version(conn: psycopg.Connection[Any], run_id: str) -> int:
    row = conn.execute("SELECT row_version FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.req("R-EXEC-4")
@pytest.mark.req("R-EXEC-7")
def test_a_stray_checkpoint_is_refused(dsn: str, worker: psycopg.Connection[Any]) -> None:
    run_id = _seed(dsn)
    version = _version(worker, run_id)
    # From a session that made no fenced write: at the run's version, or one ahead.
    for v in (version, version + 1):
        assert _refused(worker, _CKPT, (run_id, 99, 5, v, Jsonb({}), "worker")) == "QG015"
    # The owner's fenced write, then a checkpoint of another attempt, step or version.
    with worker.transaction():
        worker.execute("UPDATE runs SET row_version = row_version + 1, checkpoint_step = 1"
                       " WHERE run_id = %s AND owner_attempt = 5", (run_id,))
        for attempt, step, v in ((4, 1, version + 1), (5, 2, version + 1), (5, 1, version)):
            with pytest.raises(psycopg.Error) as err, worker.transaction():
                worker.execute(_CKPT, (run_id, step, attempt, v, Jsonb({}), "x"))
            assert err.value.sqlstate == "QG015"
    # That write committed; a checkpoint for it in a later transaction is refused.
    assert _refused(worker, _CKPT, (run_id, 1, 5, version + 1, Jsonb({}), "x")) == "QG015"
    assert worker.execute("SELECT count(*) FROM run_checkpoints WHERE run_id = %s",
                          (run_id,)).fetchone() == (0,)


@pytest.mark.req("R-EXEC-3")
@pytest.mark.req("R-AUTH-4")
def test_the_owners_checkpoint_is_accepted_and_named_by_its_session(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    run_id = _seed(dsn)
    with worker.transaction():
        version = worker.execute("UPDATE runs SET row_version = row_version + 1, checkpoint_step = 1"
                                 " WHERE run_id = %s RETURNING row_version", (run_id,)).fetchone()
        assert version is not None
        worker.execute(_CKPT, (run_id, 1, 5, version[0], Jsonb({}), "operator:forged"))
    assert worker.execute("SELECT committed_by FROM run_checkpoints WHERE run_id = %s",
                          (run_id,)).fetchone() == (WORKER_ROLE,)
    for sql in ("UPDATE run_checkpoints SET step = 2 WHERE run_id = %s",
                "DELETE FROM run_checkpoints WHERE run_id = %s"):
        assert _refused(worker, sql, (run_id,)) in ("QG015", "42501")


@pytest.mark.req("R-EXEC-8")
@pytest.mark.req("R-EXEC-12")
def test_a_transition_is_recorded_at_the_instant_its_guard_judged(
        dsn: str, worker: psycopg.Connection[Any]) -> None:
    """``20261210_090000_judged_at``: the guard compares the deadline with one instant and
    stamps the row with it, whatever the writer sent; the audit record carries that same
    instant (an ``AFTER`` trigger's own clock reads later, past a deadline the guard met)."""
    run_id = _seed(dsn)
    worker.execute("UPDATE runs SET row_version = row_version + 1,"
                   " updated_at = now() - interval '1 day' WHERE run_id = %s", (run_id,))
    with psycopg.connect(dsn, autocommit=True) as c:
        stamped, recorded, forged = c.execute(
            "SELECT r.updated_at, t.at, r.updated_at < now() - interval '1 hour' FROM runs r"
            " JOIN run_transitions t ON t.run_id = r.run_id AND t.row_version = r.row_version"
            " WHERE r.run_id = %s", (run_id,)).fetchone()
    assert not forged, "the writer's updated_at was kept"
    assert recorded == stamped


@pytest.mark.req("R-EXEC-6")
def test_only_a_failed_call_keeps_a_retry_after(dsn: str) -> None:
    """``20261210_100000_retry_after``: the seconds a provider asked for, on a failed
    call's record only, never negative."""
    run_id = _seed(dsn, owner_attempt=1)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET session_replication_role = replica")  # the record alone, without its guard
        calls = [c.execute("INSERT INTO provider_calls (run_id, tenant_id, generation, attempt, step,"
                           " row_version) VALUES (%s, 't', 1, 1, %s, 1) RETURNING id",
                           (run_id, step)).fetchone()[0] for step in (1, 2, 3)]
        c.execute("SET session_replication_role = origin")
        settle = "UPDATE provider_calls SET status = %s, retry_after_s = %s WHERE id = %s"
        assert _refused(c, settle, ("succeeded", 1.0, calls[0])) == "23514"
        assert _refused(c, settle, ("failed", -1.0, calls[1])) == "23514"
        assert _refused(c, settle, ("failed", 8.0, calls[2])) is None
