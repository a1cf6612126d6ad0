"""The event journal in PostgreSQL itself (R-EVENT-1, R-EVENT-3, R-EVENT-5): each change's
event is written in the change's own transaction, numbered per run, announced by NOTIFY
at commit, readable only by its tenant, never writable by the application, and pruned at
most 100 streams per call, by several reconcilers at once without overlap."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from qualify.stack._embedded import API_ROLE, WORKER_ROLE, with_user


@pytest.fixture(scope="module")
def dsn(stack: Any) -> str:
    """A database whose owner lowered the retention floor to 0 (60 s by default,
    tests/integration/test_worker_functions.py): these tests prune runs that just ended."""
    db = str(stack.create_database())
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE event_retention_floor SET seconds = 0")
    return db


def _as(dsn: str, role: str, tenant: str | None, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    conn = psycopg.connect(with_user(dsn, role), autocommit=autocommit)
    if tenant is not None:
        conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant,))
        if not autocommit:
            conn.commit()
    return conn


def _new_run(conn: psycopg.Connection[Any], tenant: str, state: str = "queued") -> str:
    """A run seeded in ``state`` by the superuser of ``conn``'s database (an application
    role may only insert a new ``accepted`` run, QG014)."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(conn.info.dsn, user="postgres", autocommit=True) as admin:
        admin.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                      " stream_key, deadline_at) VALUES (%s, %s, 'p', 'a', %s, 'x', 'k',"
                      " now() + interval '1 hour')", (run_id, tenant, state))
    return run_id


def _events(conn: psycopg.Connection[Any], run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    return [(int(s), k, d) for s, k, d in conn.execute(
        "SELECT seq, kind, data FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,))]


def _to_running(conn: psycopg.Connection[Any], run_id: str) -> None:
    conn.execute("UPDATE runs SET state = 'running', row_version = row_version + 1,"
                 " owner_attempt = 1 WHERE run_id = %s", (run_id,))


def _checkpoint(conn: psycopg.Connection[Any], run_id: str, step: int, answer: str | None) -> None:
    """The owner's order: the fenced UPDATE first, then the checkpoint row, one transaction."""
    with conn.transaction():
        version = conn.execute(
            "UPDATE runs SET row_version = row_version + 1, checkpoint_step = %s WHERE run_id = %s"
            " RETURNING row_version", (step, run_id)).fetchone()[0]
        conn.execute("INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version,"
                     " state_json, answer) VALUES (%s, %s, 1, 1, %s, '{}', %s)",
                     (run_id, step, version, answer))


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-EVENT-3")
def test_each_change_has_its_event_in_its_transaction_numbered_per_run(dsn: str) -> None:
    with _as(dsn, WORKER_ROLE, "t-a") as conn, _as(dsn, API_ROLE, "t-a") as reader:
        run_id = _new_run(conn, "t-a")
        _to_running(conn, run_id)
        _checkpoint(conn, run_id, 1, None)
        _checkpoint(conn, run_id, 2, "the answer")
        with conn.transaction():
            _checkpoint(conn, run_id, 3, None)
            # not committed: another session sees neither the change nor its event
            assert [s for s, _, _ in _events(reader, run_id)] == [1, 2, 3, 4, 5]
        assert [s for s, _, _ in _events(reader, run_id)] == [1, 2, 3, 4, 5, 6]
        conn.execute("UPDATE runs SET state = 'completed', row_version = row_version + 1,"
                     " completed_at = clock_timestamp() WHERE run_id = %s", (run_id,))
        got = _events(reader, run_id)
        record = conn.execute("SELECT state, row_version, generation FROM runs WHERE run_id = %s",
                              (run_id,)).fetchone()
    assert [k for _, k, _ in got] == ["state", "state", "checkpoint", "checkpoint", "output",
                                      "checkpoint", "terminal"]
    assert [s for s, _, _ in got] == list(range(1, 8))
    assert got[4][2]["text"] == "the answer" and got[4][2]["step"] == 2
    terminal = got[-1][2]
    assert (terminal["state"], terminal["row_version"], terminal["generation"]) == record


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-TOOL-1")
def test_tool_journal_writes_are_tool_events_written_after_the_runs_update(dsn: str) -> None:
    """The owner updates the run, then writes the invocation: the event, appended at
    commit, is the tool call (and later its result), not a bare checkpoint."""
    with _as(dsn, WORKER_ROLE, "t-a") as conn:
        run_id = _new_run(conn, "t-a")
        _to_running(conn, run_id)
        for status in ("intent", "succeeded"):
            with conn.transaction():
                version = conn.execute("UPDATE runs SET row_version = row_version + 1 WHERE run_id = %s"
                                       " RETURNING row_version", (run_id,)).fetchone()[0]
                if status == "intent":
                    conn.execute(
                        "INSERT INTO tool_invocations (run_id, call_id, tenant_id, generation, step,"
                        " position, tool, kind, arguments, arguments_digest, status, intent_attempt,"
                        " intent_row_version) VALUES (%s, 'c1', 't-a', 1, 1, 0, 'mail', 'instrumented',"
                        " '{}', 'd', 'intent', 1, %s)", (run_id, version))
                else:
                    conn.execute("UPDATE tool_invocations SET status = 'succeeded', result = '{}',"
                                 " outcome_row_version = %s, settled_by = 'worker' WHERE run_id = %s",
                                 (version, run_id))
        got = _events(conn, run_id)
    assert [k for _, k, _ in got] == ["state", "state", "tool_call", "tool_result"]
    assert got[2][2]["call_id"] == "c1" and "status" not in got[2][2]
    assert got[3][2]["status"] == "succeeded" and got[3][2]["tool"] == "mail"


@pytest.mark.req("R-EVENT-1")
def test_a_rolled_back_change_leaves_no_event_and_no_notification(dsn: str) -> None:
    with _as(dsn, WORKER_ROLE, "t-a") as conn, psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN qimpl_run_events")
        run_id = _new_run(conn, "t-a")
        _to_running(conn, run_id)
        committed = [n.payload for n in listener.notifies(timeout=2.0, stop_after=2)]
        assert committed == [f"{run_id}:1", f"{run_id}:2"]
        with pytest.raises(psycopg.errors.UniqueViolation):  # the checkpoint fails: all undone
            with conn.transaction():
                conn.execute("UPDATE runs SET row_version = row_version + 1, checkpoint_step = 1"
                             " WHERE run_id = %s", (run_id,))
                for _ in range(2):
                    conn.execute("INSERT INTO run_checkpoints (run_id, step, generation, attempt,"
                                 " row_version, state_json) VALUES (%s, 1, 1, 1, 3, '{}')", (run_id,))
        assert [n.payload for n in listener.notifies(timeout=0.5)] == []
        assert [s for s, _, _ in _events(conn, run_id)] == [1, 2]


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-AUTH-4")
def test_the_journal_is_the_tenants_own_and_the_application_cannot_write_it(dsn: str) -> None:
    with _as(dsn, WORKER_ROLE, "t-a") as conn:
        run_id = _new_run(conn, "t-a")
    with _as(dsn, API_ROLE, "t-b") as other:
        assert _events(other, run_id) == []
    for role in (API_ROLE, WORKER_ROLE):
        with _as(dsn, role, "t-a") as conn:
            for sql in ("INSERT INTO run_events (run_id, tenant_id, kind, data)"
                        " VALUES (%s, 't-a', 'state', '{}')",
                        "DELETE FROM run_events WHERE run_id = %s",
                        "UPDATE run_events SET data = '{}' WHERE run_id = %s"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql, (run_id,))


def _ended_runs(dsn: str, tenant: str, n: int) -> list[str]:
    with _as(dsn, WORKER_ROLE, tenant) as conn:
        runs = [_new_run(conn, tenant) for _ in range(n)]
        conn.execute("UPDATE runs SET state = 'cancelled', row_version = row_version + 1,"
                     " completed_at = clock_timestamp() WHERE run_id = ANY(%s::uuid[])", (runs,))
    return runs


@pytest.mark.req("R-EVENT-5")
@pytest.mark.req("R-OPS-3")
def test_pruning_takes_at_most_100_streams_per_call_disjoint_across_reconcilers(dsn: str) -> None:
    runs = set(_ended_runs(dsn, "t-prune", 250))
    live = _ended_runs(dsn, "t-other", 3)  # another tenant's: never touched
    counts: list[int] = []
    start = threading.Barrier(3)

    def reconciler(name: str) -> None:
        with _as(dsn, WORKER_ROLE, "t-prune", autocommit=False) as conn:
            start.wait(timeout=10)
            n = conn.execute("SELECT qimpl_prune_event_streams(0, %s, 1000)", (name,)).fetchone()[0]
            start.wait(timeout=10)  # all three hold their claims before any commits
            conn.commit()
            counts.append(int(n))

    threads = [threading.Thread(target=reconciler, args=(f"r{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # Truly concurrent claims split the 250 in any way (100/100/50 or 73/77/100: a claim
    # that skips its rivals' locked rows may reach the end first); each stays within 100.
    assert len(counts) == 3 and all(c <= 100 for c in counts) and sum(counts) == 250, counts
    with psycopg.connect(dsn, autocommit=True) as admin:
        tombs = admin.execute("SELECT run_id::text, pruned_by FROM run_event_prunes"
                              " WHERE tenant_id = 't-prune'").fetchall()
    assert sorted(Counter(by for _, by in tombs).values()) == sorted(counts)
    with psycopg.connect(dsn, autocommit=True) as admin:
        left = admin.execute("SELECT count(*) FROM run_events WHERE run_id = ANY(%s::uuid[])",
                             (list(runs),)).fetchone()[0]
        others = admin.execute("SELECT count(*) FROM run_events WHERE run_id = ANY(%s::uuid[])",
                               (live,)).fetchone()[0]
    assert {r for r, _ in tombs} == runs and len(tombs) == 250
    assert left == 0 and others == 6
    with _as(dsn, WORKER_ROLE, "t-prune") as conn:
        assert conn.execute("SELECT qimpl_prune_event_streams(0, 'r', 100)").fetchone() == (0,)


@pytest.mark.req("R-EVENT-5")
@pytest.mark.req("R-OPS-3")
def test_one_sweep_prunes_exactly_100_when_more_are_due(dsn: str) -> None:
    _ended_runs(dsn, "t-bound", 150)
    with _as(dsn, WORKER_ROLE, "t-bound") as conn:
        first = conn.execute("SELECT qimpl_prune_event_streams(0, 'r', 1000)").fetchone()
        second = conn.execute("SELECT qimpl_prune_event_streams(0, 'r', 1000)").fetchone()
    assert (first, second) == ((100,), (50,))


@pytest.mark.req("R-EVENT-5")
def test_a_stream_within_its_retention_is_kept(dsn: str) -> None:
    runs = _ended_runs(dsn, "t-keep", 2)
    with _as(dsn, WORKER_ROLE, "t-keep") as conn:
        assert conn.execute("SELECT qimpl_prune_event_streams(3600, 'r', 100)").fetchone() == (0,)
        assert len(_events(conn, runs[0])) == 2
