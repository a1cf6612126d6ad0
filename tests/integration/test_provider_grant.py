"""The provider gets what it needs (issue 15, item 4): the run's workspace and the
principal's authorisation grant for it reach the provider (the synthetic provider records
the grant's digest), and the grant appears in no projection or record: not in the run's
row, its checkpoints, transitions or journal, not in an API answer, the event stream or a
log (R-READ-3)."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from qimpl.db import admin
from qualify.fakes.synthetic import grant_digest
from qualify.processes import Deployment, Processes
from tests.conftest import assert_eventually

WORKSPACE = "ws-grant-test"


@dataclass
class Done:
    grant: str
    run_id: str
    dsn: str
    answers: list[str]
    work: Path
    provider_calls: list[dict[str, Any]]


@pytest.fixture(scope="module")
def done(stack: Any) -> Iterator[Done]:
    """One durable run of p-dev in a workspace whose grant is a unique canary, to its end."""
    work = Path(tempfile.mkdtemp(prefix="qualify-grant-"))
    (work / "control").mkdir()
    dsn = stack.create_database()
    grant = f"grant-canary-{uuid.uuid4().hex}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        admin.grant_workspace(conn, tenant_id="t-dev", principal_id="p-dev", workspace_id=WORKSPACE,
                              grant_token=grant)
    processes = Processes(Deployment(
        dsn=dsn, temporal_address=stack.info.temporal_address, task_queue=f"grant-{uuid.uuid4().hex[:8]}",
        control_dir=work / "control", logs_dir=work / "logs"))
    try:
        api = processes.api()
        processes.worker()
        headers = {"Authorization": "Bearer dev-key"}
        with httpx.Client(base_url=api.base_url, headers=headers, timeout=10) as http:
            created = http.post("/v1/agents/a1/runs", headers={"Idempotency-Key": str(uuid.uuid4())},
                                json={"prompt": json.dumps({"steps": 2}), "durable_temporal": True,
                                      "workspace_id": WORKSPACE})
            assert created.status_code == 202, created.text
            run_id = created.json()["run_id"]
            answers = [created.text]

            def completed() -> bool:
                read = http.get(f"/v1/agents/a1/runs/{run_id}")
                answers.append(read.text)
                return bool(read.json()["state"] == "completed")

            assert_eventually(completed, timeout=timedelta(seconds=60), what="the run completed")
            events = http.get(f"/v1/agents/a1/runs/{run_id}/events",
                              headers={"X-Stream-Key": created.json()["stream_key"]})
            answers.append(events.text)
        calls = [json.loads(line) for line in
                 (work / "control" / "provider_calls.jsonl").read_text().splitlines()]
        yield Done(grant=grant, run_id=run_id, dsn=dsn, answers=answers, work=work,
                   provider_calls=[c for c in calls if c["run_id"] == run_id])
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.req("R-AUTH-2")
def test_the_grant_and_the_workspace_reach_the_provider(done: Done) -> None:
    assert [c["step"] for c in done.provider_calls] == [1, 2]
    for call in done.provider_calls:
        assert call["workspace_id"] == WORKSPACE
        assert call["grant_sha256"] == grant_digest(done.grant)


@pytest.mark.req("R-READ-3")
def test_the_grant_is_in_no_record_answer_or_log(done: Done) -> None:
    assert all(done.answers) and not [a for a in done.answers if done.grant in a]
    with psycopg.connect(done.dsn, autocommit=True) as conn:
        for table in ("runs", "run_checkpoints", "run_transitions", "tool_invocations",
                      "idempotency_records"):
            rows = conn.execute(f"SELECT t::text FROM {table} t").fetchall()
            assert not [r for r in rows if done.grant in r[0]], f"the grant is in {table}"
        assert conn.execute("SELECT count(*) FROM runs WHERE run_id = %s", (done.run_id,)).fetchone() == (1,)
    logs = list((done.work / "logs").glob("*.log")) + list((done.work / "control").glob("*.jsonl"))
    assert logs and not [p.name for p in logs if done.grant in p.read_text(errors="replace")]
