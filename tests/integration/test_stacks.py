"""The other stacks (R-Q-1): an existing deployment given by DSN and address, and a clear
refusal of testcontainers when no Docker daemon is reachable."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from qualify.errors import UsageError
from qualify.stack import make_stack


@pytest.mark.req("R-Q-1")
def test_existing_stack_clones_and_drops_its_databases(stack: Any) -> None:
    existing = make_stack("existing", pg_dsn=stack.postgres.dsn(),
                          temporal_address=stack.info.temporal_address)
    info = existing.start()
    assert info.kind == "existing" and not existing.controls_platform
    dsn = existing.create_database("ex_probe")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM run_allowed_transitions").fetchone()[0] > 0
    existing.stop()
    with psycopg.connect(stack.postgres.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = 'ex_probe'").fetchone() is None


def test_existing_stack_needs_both_addresses() -> None:
    with pytest.raises(UsageError, match="--pg-dsn and --temporal-address"):
        make_stack("existing", pg_dsn="", temporal_address="")


@pytest.mark.req("R-Q-1")
def test_testcontainers_without_docker_says_so(tmp_path: Any) -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    done = subprocess.run([sys.executable, "-m", "qualify.cli", "run", "--stack", "testcontainers",
                           "--reports-dir", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "Docker" in out or "containers" in out, out[-500:]
    assert "Traceback" not in out
