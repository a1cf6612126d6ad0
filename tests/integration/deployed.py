"""A deployment of the real API and worker processes on the session's embedded stack,
with its own database, task queue and control directory (the synthetic provider's), for
integration tests that drive a run end to end."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from qualify.processes import Deployment, Processes

__all__ = ["Deployed", "create", "deployed"]


@dataclass
class Deployed:
    processes: Processes
    #: The synthetic provider's control directory (barriers, provider_calls.jsonl).
    control: Path
    #: The database's superuser DSN.
    dsn: str
    temporal_address: str


@contextmanager
def deployed(stack: Any, prefix: str) -> Iterator[Deployed]:
    """A fresh database and task queue; every process started is stopped at the end."""
    work = Path(tempfile.mkdtemp(prefix=f"qualify-{prefix}-"))
    (work / "control").mkdir()
    dsn = stack.create_database()
    processes = Processes(Deployment(
        dsn=dsn, temporal_address=stack.info.temporal_address,
        task_queue=f"{prefix}-{uuid.uuid4().hex[:8]}", control_dir=work / "control",
        logs_dir=work / "logs"))
    try:
        yield Deployed(processes=processes, control=work / "control", dsn=dsn,
                       temporal_address=stack.info.temporal_address)
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def create(http: httpx.Client, script: dict[str, Any], *, deadline_s: int) -> str:
    """A durable run of ``dev-key``'s principal with the synthetic ``script``; its id."""
    created = http.post("/v1/agents/a1/runs", headers={"Idempotency-Key": str(uuid.uuid4())},
                        json={"prompt": json.dumps(script), "durable_temporal": True,
                              "deadline_seconds": deadline_s})
    assert created.status_code == 202, created.text
    return str(created.json()["run_id"])
