"""Migration ``20261007_230000_run_lifecycle`` upgrades a baseline database holding legacy
rows, and its downgrade refuses while a version-2 run is live (R-OPS-1, R-OPS-2)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from qimpl.db.migrate import BASELINE, HEAD, downgrade, upgrade


@pytest.fixture
def empty_db(stack: Any) -> str:
    name = f"m_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(stack.postgres.dsn(name))


def _legacy_rows(dsn: str) -> dict[str, str]:
    rows = {str(uuid.uuid4()): s for s in ("QUEUED", "STREAMING", "COMPLETED", "FAILED")}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for run_id, status in rows.items():
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, status, prompt)"
                         " VALUES (%s, 't', 'p', 'a', %s, 'hello')", (run_id, status))
    return rows


@pytest.mark.req("R-OPS-1")
@pytest.mark.req("R-STATE-2")
def test_upgrade_converts_legacy_rows(empty_db: str) -> None:
    upgrade(empty_db, BASELINE)
    rows = _legacy_rows(empty_db)
    upgrade(empty_db, HEAD)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        got = dict(conn.execute("SELECT run_id::text, state FROM runs").fetchall())
        assert got == {k: v.lower() for k, v in rows.items()}
        meta = conn.execute("SELECT DISTINCT lifecycle_version, durability FROM runs").fetchall()
        assert meta == [(1, "legacy")]
        # backfilled stream keys: two version-4 UUIDs (244 random bits) from the CSPRNG, distinct
        keys = [r[0] for r in conn.execute("SELECT stream_key FROM runs")]
        assert len(set(keys)) == len(keys) and all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
        assert conn.execute("SELECT count(*) FROM pg_type WHERE typname = 'run_status'").fetchone() == (0,)
        col = conn.execute("SELECT data_type FROM information_schema.columns"
                           " WHERE table_name = 'runs' AND column_name = 'state'").fetchone()
        assert col == ("character varying",)
        # a legacy `streaming` run may still end, and the guard records it
        streaming = next(k for k, v in rows.items() if v == "STREAMING")
        conn.execute("UPDATE runs SET state = 'completed', row_version = row_version + 1"
                     " WHERE run_id = %s", (streaming,))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                         " stream_key, deadline_at) VALUES (%s, 't', 'p', 'a', 'streaming', 'x', 'k',"
                         " now())", (str(uuid.uuid4()),))


def _v2_run(dsn: str, state: str) -> str:
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at) VALUES (%s, 't', 'p', 'a', %s, 'x', 'k',"
                     " now() + interval '1 hour')", (run_id, state))
    return run_id


@pytest.mark.req("R-OPS-2")
def test_downgrade_refused_while_a_v2_run_is_live_then_allowed(empty_db: str) -> None:
    upgrade(empty_db, HEAD)
    run_id = _v2_run(empty_db, "queued")
    with pytest.raises(Exception, match="downgrade refused: 1 version-2 runs are not terminal"):
        downgrade(empty_db, BASELINE)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM run_transitions").fetchone() == (1,)  # nothing undone
        conn.execute("UPDATE runs SET state = 'cancelled', row_version = 2 WHERE run_id = %s", (run_id,))
    _v2_run(empty_db, "expired")
    downgrade(empty_db, BASELINE)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        statuses = sorted(r[0] for r in conn.execute("SELECT status::text FROM runs"))
        assert statuses == ["CANCELLED", "FAILED"]
    upgrade(empty_db, HEAD)  # and back up again


@pytest.mark.req("R-OPS-2")
def test_a_run_inserted_during_the_downgrade_guard_cannot_slip_past_it(empty_db: str) -> None:
    """The guard locks ``runs`` before it counts: a version-2 run being inserted while the
    downgrade starts is waited for and then counted, never folded away unseen."""
    import threading
    import time

    lifecycle = "20261007_230000_run_lifecycle"
    upgrade(empty_db, lifecycle)
    outcome: dict[str, BaseException | None] = {}
    with psycopg.connect(empty_db) as inserting:  # one open transaction, not yet committed
        inserting.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                          " stream_key, deadline_at) VALUES (%s, 't', 'p', 'a', 'queued', 'x', 'k',"
                          " now() + interval '1 hour')", (str(uuid.uuid4()),))

        def run_downgrade() -> None:
            try:
                downgrade(empty_db, BASELINE)
                outcome["error"] = None
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        worker = threading.Thread(target=run_downgrade)
        worker.start()
        with psycopg.connect(empty_db, autocommit=True) as watch:
            deadline = time.monotonic() + 30
            while not watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'").fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the downgrade never waited for the insert"
                time.sleep(0.02)
        inserting.commit()
    worker.join(timeout=60)
    assert outcome.get("error") is not None and "downgrade refused" in str(outcome["error"])


@pytest.mark.req("R-OPS-2")
@pytest.mark.req("R-TOOL-3")
def test_downgrade_below_the_tool_journal_refused_under_a_parked_run(empty_db: str) -> None:
    """Issue 22, item 6: a partial downgrade below the journal would drop it, and QG010,
    under a run parked on an unknown outcome; it is refused, naming the run."""
    upgrade(empty_db, HEAD)
    below = "20261130_120000_deadline_fence"  # the revision before the tool journal
    run_id = str(uuid.uuid4())
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at, owner_attempt) VALUES (%s, 't', 'p', 'a', 'running', 'x',"
                     " 'k', now() + interval '1 hour', 1)", (run_id,))
        with conn.transaction():
            conn.execute("UPDATE runs SET row_version = row_version + 1 WHERE run_id = %s", (run_id,))
            conn.execute(
                "INSERT INTO tool_invocations (run_id, call_id, tenant_id, generation, step, position, tool,"
                " kind, arguments, arguments_digest, status, intent_attempt, intent_row_version)"
                " VALUES (%s, 'c-1', 't', 1, 1, 0, 'charge', 'instrumented', '{}', 'd', 'intent', 1, 2)",
                (run_id,))
        conn.execute("UPDATE runs SET state = 'awaiting_input', row_version = row_version + 1"
                     " WHERE run_id = %s", (run_id,))
    with pytest.raises(Exception, match=f"downgrade refused: runs {run_id} are not terminal"):
        downgrade(empty_db, below)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM tool_invocations").fetchone() == (1,)  # kept
        conn.execute("UPDATE runs SET state = 'cancelled', row_version = row_version + 1"
                     " WHERE run_id = %s", (run_id,))
    downgrade(empty_db, below)


@pytest.mark.req("R-OPS-1")
@pytest.mark.req("R-EXEC-3")
def test_downgrade_below_state_deltas_folds_every_chain_back_into_whole_states(empty_db: str) -> None:
    """Issue 22, item 5: a downgrade gives every delta checkpoint its whole state back (the
    same fold as ``qimpl.state_delta.fold``), across tenants under forced row-level
    security, and the upgrade after it accepts them again."""
    import json

    from qimpl.state_delta import diff, fold

    upgrade(empty_db, HEAD)
    states = [{"trail": [1], "text": "a" * 100, "gone": 1},
              {"trail": [1, 2], "text": "a" * 100 + "b", "gone": 1},
              {"trail": [1, 2, 3], "text": "a" * 100 + "bc", "new": {"k": True}},
              {"trail": [1, 2, 3, 4], "text": "a" * 100 + "bcd", "new": {"k": True}}]
    runs = {}
    with psycopg.connect(empty_db, autocommit=True) as conn:
        for tenant in ("t1", "t2"):
            runs[tenant] = str(uuid.uuid4())
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                         " stream_key, deadline_at) VALUES (%s, %s, 'p', 'a', 'accepted', 'x', 'k',"
                         " now() + interval '1 hour')", (runs[tenant], tenant))
        conn.execute("ALTER TABLE run_checkpoints DISABLE TRIGGER run_checkpoints_guard")
        for run_id in runs.values():
            prev = None
            for step, state in enumerate(states, start=1):
                delta = diff(prev, state) if prev is not None else None
                conn.execute("INSERT INTO run_checkpoints (run_id, step, generation, attempt, row_version,"
                             " state_json, state_delta) VALUES (%s, %s, 1, 1, %s, %s, %s)",
                             (run_id, step, step, None if delta else json.dumps(state),
                              json.dumps(delta) if delta else None))
                prev = state
        conn.execute("ALTER TABLE run_checkpoints ENABLE TRIGGER run_checkpoints_guard")
        stored = conn.execute("SELECT run_id::text, step, state_json, state_delta FROM run_checkpoints"
                              " ORDER BY run_id, step").fetchall()
        assert sum(d is not None for *_, d in stored) == 6, "the chain holds deltas"
        assert fold((s, d) for r, _, s, d in stored if r == runs["t1"]) == states[-1]
    downgrade(empty_db, "20261207_120000_audit_deletes")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        whole = conn.execute("SELECT run_id::text, step, state_json FROM run_checkpoints"
                             " ORDER BY run_id, step").fetchall()
        assert [s for r, _, s in whole if r == runs["t1"]] == states
        assert [s for r, _, s in whole if r == runs["t2"]] == states
        forced = conn.execute("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'run_checkpoints'")
        assert forced.fetchone() == (True,)
        with pytest.raises(psycopg.DatabaseError, match="may not be changed"):  # the guard is back
            conn.execute("UPDATE run_checkpoints SET state_json = '{}' WHERE run_id = %s", (runs["t1"],))
    upgrade(empty_db, HEAD)


@pytest.mark.req("R-OPS-1")
def test_head_is_the_newest_migration() -> None:
    """``HEAD`` (what ``migrate`` prints and what the upgrade tests and the schema scenario
    migrate to) is the scripts' own head: a migration added without moving it would go
    untested, its downgrade too (it did, for two migrations, until 2026-12-06)."""
    from alembic.script import ScriptDirectory

    from qimpl.db.migrate import alembic_config

    assert ScriptDirectory.from_config(alembic_config("postgresql://unused/db")).get_current_head() == HEAD


@pytest.mark.req("R-OPS-2")
def test_a_downgrade_that_drops_keys_is_refused_unless_the_operator_says_so(empty_db: str) -> None:
    """An operator's finding: rolling back to the baseline deleted every API key, grant
    and the key audit without a word. Refused while they hold rows (nothing undone),
    unless ``--discard-keys``; below the key audit's revision alone, the audit too."""
    from qimpl.db.migrate import main

    upgrade(empty_db, HEAD)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO api_keys (key_hash, tenant_id, principal_id) VALUES ('h', 't', 'p')")
        conn.execute("INSERT INTO workspace_grants (tenant_id, principal_id, workspace_id, grant_token)"
                     " VALUES ('t', 'p', 'w', 'g')")
    with pytest.raises(Exception, match="downgrade refused: it drops the API key audit"):
        downgrade(empty_db, "20261206_090000_claim_events")
    assert main(["--downgrade", BASELINE, empty_db]) == 2  # the same refusal, one line, exit 2
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM api_keys").fetchone() == (1,)  # nothing undone
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (HEAD,)
    downgrade(empty_db, "20261206_090000_claim_events", discard_keys=True)  # the audit goes
    with pytest.raises(Exception, match="downgrade refused: it drops 1 API keys and 1 workspace grants"):
        downgrade(empty_db, BASELINE)
    with pytest.raises(SystemExit) as usage:
        main(["--discard-keys", empty_db])  # only with --downgrade
    assert usage.value.code == 64
    assert main(["--downgrade", BASELINE, "--discard-keys", empty_db]) == 0
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('api_keys')").fetchone() == (None,)
