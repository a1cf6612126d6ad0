"""The one-shot operator sweep (R-OPS-4): prints what it did and exits 0; a clear message
and a non-zero exit when the database or Temporal cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest

from qualify.procs import free_port
from qualify.stack._embedded import WORKER_ROLE, with_user


def _sweep(env: dict[str, str], *tenants: str) -> subprocess.CompletedProcess[str]:
    args = [a for t in tenants for a in ("--tenant", t)]
    return subprocess.run([sys.executable, "-m", "qimpl.scripts.agent_runs", *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.req("R-OPS-4")
def test_sweep_expires_overdue_runs_and_reports(stack: Any) -> None:
    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for tenant in ("t1", "t1", "t2"):
            conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                         " stream_key, deadline_at) VALUES (%s, %s, 'p', 'a', 'queued', 'x', 'k',"
                         " now() - interval '1 second')", (str(uuid.uuid4()), tenant))
    done = _sweep({"QIMPL_DATABASE_URL": with_user(dsn, WORKER_ROLE),
                   "QIMPL_TEMPORAL_ADDRESS": stack.info.temporal_address}, "t1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tenant"] == "t1" and report["expired"] == 2 and report["errors"] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        states = dict(conn.execute("SELECT tenant_id, string_agg(state, ',') FROM runs GROUP BY 1"))
    assert states == {"t1": "expired,expired", "t2": "queued"}  # only the named tenant
    assert "no runs" not in done.stderr


@pytest.mark.req("R-OPS-4")
def test_sweep_warns_about_a_tenant_with_no_runs(stack: Any) -> None:
    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at) VALUES (%s, 'acme', 'p', 'a', 'completed', 'x', 'k',"
                     " now())", (str(uuid.uuid4()),))
    done = _sweep({"QIMPL_DATABASE_URL": with_user(dsn, WORKER_ROLE),
                   "QIMPL_TEMPORAL_ADDRESS": stack.info.temporal_address}, "Acme", "acme", "Acme")
    assert done.returncode == 0, done.stderr
    # A tenant named twice is swept once (a tester's --tenant acme --tenant acme swept twice).
    assert [json.loads(line)["tenant"] for line in done.stdout.splitlines()] == ["Acme", "acme"]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "'Acme' has no runs" in warnings[0]


@pytest.mark.req("R-OPS-4")
@pytest.mark.req("R-AUTH-4")
def test_sweep_refuses_a_role_that_escapes_row_level_security(stack: Any) -> None:
    """As the API and the worker do: a superuser (the harness's owner DSN) is refused with
    one line and exit 64, and nothing is swept (a tester's finding: it swept)."""
    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt,"
                     " stream_key, deadline_at) VALUES (%s, 't1', 'p', 'a', 'queued', 'x', 'k',"
                     " now() - interval '1 second')", (str(uuid.uuid4()),))
    done = _sweep({"QIMPL_DATABASE_URL": dsn, "QIMPL_TEMPORAL_ADDRESS": stack.info.temporal_address}, "t1")
    assert done.returncode == 64, (done.returncode, done.stderr)
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "a superuser" in done.stderr and "database_role_unsafe" in done.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT state FROM runs").fetchall() == [("queued",)]


@pytest.mark.req("R-OPS-4")
def test_sweep_says_when_the_database_is_unreachable() -> None:
    done = _sweep({"QIMPL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/x"}, "t1")
    assert done.returncode == 2 and "cannot reach the database" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.req("R-OPS-4")
def test_sweep_says_when_the_database_refuses_the_login(stack: Any) -> None:
    """A server that answers and refuses (here an unknown role; a wrong password alike) is
    not "cannot reach": the server's own reason is quoted (a new user's finding)."""
    done = _sweep({"QIMPL_DATABASE_URL": with_user(stack.create_database(), "no_such_role")}, "t1")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr == ('agent_runs: the database refused the connection: role "no_such_role" '
                           "does not exist\n"), done.stderr


@pytest.mark.req("R-OPS-4")
def test_sweep_says_when_temporal_is_unreachable(stack: Any) -> None:
    done = _sweep({"QIMPL_DATABASE_URL": with_user(stack.create_database(), WORKER_ROLE),
                   "QIMPL_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "QIMPL_DISPATCH_TIMEOUT_S": "2"},
                  "t1")
    assert done.returncode == 3 and "cannot reach Temporal" in done.stderr


@pytest.mark.req("R-OPS-3")
def test_a_sweep_prunes_its_tenants_old_sweep_records(stack: Any) -> None:
    """An operator's finding: every sweep of every tenant leaves a ``reconciler_sweeps``
    row and nothing deleted them. A sweep deletes its own tenant's rows older than
    ``QIMPL_SWEEP_RETENTION_S`` (as the worker's restricted role), and only those."""
    dsn = stack.create_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for tenant, age in (("t1", "8 days"), ("t1", "8 days"), ("t1", "8 days"), ("t1", "1 hour"),
                            ("t2", "8 days")):
            conn.execute("INSERT INTO reconciler_sweeps (reconciler, tenant_id, started_at, finished_at,"
                         " candidates, expired, dispatched, errors) VALUES ('old', %s,"
                         " now() - %s::interval, now() - %s::interval, 0, 0, 0, 0)", (tenant, age, age))
    done = _sweep({"QIMPL_DATABASE_URL": with_user(dsn, WORKER_ROLE),
                   "QIMPL_TEMPORAL_ADDRESS": stack.info.temporal_address}, "t1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["pruned_sweeps"] == 3
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT tenant_id, count(*) FROM reconciler_sweeps GROUP BY 1 ORDER BY 1").fetchall()
    assert left == [("t1", 2), ("t2", 1)]  # the recent one and this sweep's own; t2 untouched
