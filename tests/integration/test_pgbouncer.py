"""The worker refuses a transaction-pooling PgBouncer and accepts a session-pooling one
(R-OPS-5), and the ownership lease stays bounded behind session pooling (R-EXEC-11),
against a real PgBouncer (Debian's package; ``.ci/run`` installs it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest

from qualify.procs import free_port, kill_tree, spawn, wait_until
from qualify.stack._embedded import WORKER_ROLE, with_user
from qualify.stack.postgres import SHM
from tests.integration.test_lease import paused_owner_takeover_s

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class Bouncer(NamedTuple):
    dsn: str  #: the database through PgBouncer
    direct_dsn: str  #: the same database on PostgreSQL directly


@pytest.fixture
def pgbouncer(stack: Any, request: pytest.FixtureRequest) -> Iterator[Bouncer]:
    if not os.path.exists(PGBOUNCER):
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is missing: .ci/run should have installed it")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    mode: str = request.param
    work = Path(tempfile.mkdtemp(dir=SHM, prefix="qualify-pgbouncer-"))
    work.chmod(0o755)
    port = free_port()
    (work / "userlist.txt").write_text(f'"postgres" ""\n"{WORKER_ROLE}" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={stack.postgres.port}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n"
        f"auth_file = {work}/userlist.txt\npool_mode = {mode}\nunix_socket_dir =\n"
        "ignore_startup_parameters = options\n"
    )
    user = "postgres" if os.geteuid() == 0 else None
    if user:
        subprocess.run(["chown", "-R", user, str(work)], check=True)
    proc = spawn([PGBOUNCER, str(work / "pgbouncer.ini")], log_path=work / "pgbouncer.log", user=user)
    db = stack.create_database()
    dsn = f"postgresql://postgres@127.0.0.1:{port}/{db.rsplit('/', 1)[1]}"
    try:
        def connects() -> bool:
            psycopg.connect(dsn, connect_timeout=1).close()
            return True

        wait_until(connects, timeout_s=15, what="pgbouncer", proc=proc)
        yield Bouncer(dsn=dsn, direct_dsn=db)
    finally:
        kill_tree(proc, first=signal.SIGTERM, grace_s=3)
        shutil.rmtree(work, ignore_errors=True)


def _worker(stack: Any, dsn: str, timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    # As the worker's restricted role: it refuses to start as a superuser (R-AUTH-4).
    env = {**os.environ, "QIMPL_DATABASE_URL": with_user(dsn, WORKER_ROLE), "QIMPL_TEMPORAL_ADDRESS": stack.info.temporal_address,
           "QIMPL_TASK_QUEUE": "pgbouncer-check"}
    proc = subprocess.Popen([sys.executable, "-m", "qimpl.workflows.worker"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    except subprocess.TimeoutExpired:
        return None  # still running: it accepted the connection
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)


@pytest.mark.req("R-OPS-5")
@pytest.mark.parametrize("pgbouncer", ["transaction"], indirect=True)
def test_transaction_pooling_is_refused(stack: Any, pgbouncer: Bouncer) -> None:
    done = _worker(stack, pgbouncer.dsn, timeout_s=30)
    assert done is not None, "the worker kept running behind a transaction-pooling PgBouncer"
    assert done.returncode != 0
    assert "transaction-pooling PgBouncer" in done.stdout


@pytest.mark.req("R-OPS-5")
@pytest.mark.parametrize("pgbouncer", ["session"], indirect=True)
def test_session_pooling_is_accepted(stack: Any, pgbouncer: Bouncer) -> None:
    assert _worker(stack, pgbouncer.dsn, timeout_s=8) is None, "the worker exited behind session pooling"


@pytest.mark.req("R-EXEC-11")
@pytest.mark.req("R-OPS-5")
@pytest.mark.parametrize("pgbouncer", ["session"], indirect=True)
def test_paused_owner_loses_lease_behind_session_pooling(pgbouncer: Bouncer) -> None:
    """An owner connected through PgBouncer (which drops the ``options`` startup
    parameter here) and paused inside an open transaction loses the run's lock within
    the lease: the lease's timeouts are SET on the server session, not passed at startup."""
    lease_s = 1.0
    took = paused_owner_takeover_s(pgbouncer.dsn, pgbouncer.direct_dsn, lease_s)
    print(f"takeover behind session-pooling PgBouncer: {took:.2f} s")
    assert took <= lease_s + 1.5, f"the paused owner kept the lock for {took:.2f} s behind PgBouncer"
