"""Every line the real API process writes is JSON (issue 15, item 5): uvicorn's own
info-level start lines ("Started server process", "Waiting for application startup.")
come before the lifespan, so logging is set up when uvicorn builds the app
(``create_app`` called as a factory); an unreachable database stops the start with one
JSON line naming it, and no traceback."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from qualify.procs import free_port, kill_tree, spawn
from qualify.stack._embedded import with_user
from tests.conftest import assert_eventually


def _api(dsn: str, log: Path, port: int) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QIMPL_", "AGENT_", "DURABLE_"))}
    env.update(QIMPL_DATABASE_URL=dsn, PYTHONUNBUFFERED="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return spawn([sys.executable, "-m", "uvicorn", "--factory", "qimpl.api.app:create_app",
                  "--host", "127.0.0.1", "--port", str(port), "--log-level", "info"],
                 log_path=log, env=env)


def _docs(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]  # raises on plain text


def test_every_line_of_the_api_is_json_uvicorns_start_lines_included(stack: Any) -> None:
    log = Path(tempfile.mkdtemp(prefix="qimpl-api-log-")) / "api.log"
    proc = _api(with_user(stack.create_database(), "qimpl_api"), log, free_port())
    try:
        assert_eventually(lambda: "Uvicorn running on" in log.read_text(),
                          timeout=timedelta(seconds=30), what="uvicorn running")
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it handled once it has shut down gracefully
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        kill_tree(proc)
    messages = [d["msg"] for d in _docs(log)]
    for line in (f"Started server process [{proc.pid}]", "Waiting for application startup.",
                 "Application startup complete.", "Shutting down"):
        assert line in messages, messages


def test_an_unreachable_database_stops_the_api_with_one_json_line() -> None:
    log = Path(tempfile.mkdtemp(prefix="qimpl-api-log-")) / "api.log"
    proc = _api(f"postgresql://qimpl_api@127.0.0.1:{free_port()}/qimpl", log, free_port())
    try:
        assert proc.wait(timeout=60) != 0
    finally:
        kill_tree(proc)
    docs = _docs(log)
    assert any(d.get("event") == "api.database_unreachable" for d in docs), docs
    assert "Traceback" not in log.read_text()


def test_a_refused_login_stops_the_api_naming_the_servers_reason(stack: Any) -> None:
    """A wrong role or password is not "cannot reach the database" (a new user's finding)."""
    log = Path(tempfile.mkdtemp(prefix="qimpl-api-log-")) / "api.log"
    proc = _api(with_user(stack.create_database(), "no_such_role"), log, free_port())
    try:
        assert proc.wait(timeout=60) != 0
    finally:
        kill_tree(proc)
    lines = [d for d in _docs(log) if d.get("event") == "api.database_refused"]
    assert len(lines) == 1 and 'role "no_such_role" does not exist' in lines[0]["msg"], _docs(log)
    assert "Traceback" not in log.read_text()
