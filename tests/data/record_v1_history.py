"""Record a version-1 workflow history for the replay test (run once, by hand):

    python tests/data/record_v1_history.py

Boots the embedded stack, runs one legacy run through ``AgentRunWorkflow`` (v1) on a real
worker, and writes its history to ``qualify/data/agent_run_v1_history.json``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from pathlib import Path

import psycopg
from temporalio.client import Client

from qualify.processes import Deployment, Processes
from qualify.stack import EmbeddedStack

OUT = Path(__file__).resolve().parents[2] / "qualify" / "data" / "agent_run_v1_history.json"


async def record(dsn: str, address: str, queue: str, run_id: str) -> str:
    client = await Client.connect(address)
    handle = await client.start_workflow("AgentRunWorkflow", run_id, id=f"agent-run-{run_id}",
                                         task_queue=queue)
    await handle.result()
    history = await handle.fetch_history()
    return history.to_json()


def main() -> None:
    with EmbeddedStack() as stack:
        assert stack.info is not None
        dsn = stack.create_database()
        run_id = str(uuid.uuid4())
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO runs (run_id, tenant_id, principal_id, agent_id, state, prompt, stream_key,"
                " deadline_at, lifecycle_version, durability) VALUES (%s, 't', 'p', 'a', 'accepted',"
                " 'hello', 'k', now() + interval '1 hour', 1, 'legacy')", (run_id,))
        tmp = Path(tempfile.mkdtemp())
        (tmp / "control").mkdir()
        dep = Deployment(dsn=dsn, temporal_address=stack.info.temporal_address, task_queue="v1",
                         control_dir=tmp / "control", logs_dir=tmp / "logs")
        procs = Processes(dep)
        try:
            procs.worker()
            text = asyncio.run(record(dsn, stack.info.temporal_address, "v1", run_id))
        finally:
            procs.stop_all()
    OUT.write_text(json.dumps(json.loads(text), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
