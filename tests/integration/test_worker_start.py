"""The worker's start against a database that refuses its login: exit 2 and one JSON line
quoting the server's reason, not "cannot reach the database" (a new user's finding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from qualify.procs import free_port
from qualify.stack._embedded import with_user


@pytest.mark.req("R-OPS-4")
def test_a_refused_login_stops_the_worker_naming_the_servers_reason(stack: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QIMPL_", "AGENT_", "DURABLE_"))}
    env.update(QIMPL_DATABASE_URL=with_user(stack.create_database(), "no_such_role"),
               QIMPL_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}")
    done = subprocess.run([sys.executable, "-m", "qimpl.workflows.worker"], env=env, timeout=60,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    docs = [json.loads(line) for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    refused = [d for d in docs if d.get("event") == "worker.database_refused"]
    assert len(refused) == 1, docs
    assert refused[0]["msg"] == 'worker: the database refused the connection: role "no_such_role" does not exist'
    assert "Traceback" not in done.stdout + done.stderr
