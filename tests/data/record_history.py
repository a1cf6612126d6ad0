"""Record a workflow history for the replay tests (run once, by hand, on the code to be
replayed against later):

    python tests/data/record_history.py qualify/data/agent_run_v3_history.json

Boots the embedded stack, runs one durable run of two steps on a real API and worker (the
workflow type the dispatch starts on the code it runs on) and writes its history to the
given path. ``qualify/data/agent_run_v2_history.json`` was recorded this way before
workflows set search attributes (issue 25, item 14; ``tests/integration/test_replay_v2.py``),
``agent_run_v3_history.json`` on the code that introduced ``AgentRunWorkflowV3``
(``tests/integration/test_replay_v3.py``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
from temporalio.client import Client

from qualify.fakes.synthetic import make_prompt
from qualify.processes import Deployment, Processes
from qualify.procs import wait_until
from qualify.scenarios.base import API_KEY
from qualify.stack import EmbeddedStack


async def fetch(address: str, workflow_id: str) -> str:
    client = await Client.connect(address)
    handle = client.get_workflow_handle(workflow_id)
    await handle.result()
    return (await handle.fetch_history()).to_json()


def main(out: Path) -> None:
    with EmbeddedStack() as stack:
        assert stack.info is not None
        dsn = stack.create_database()
        tmp = Path(tempfile.mkdtemp())
        (tmp / "control").mkdir()
        dep = Deployment(dsn=dsn, temporal_address=stack.info.temporal_address, task_queue="recorded",
                         control_dir=tmp / "control", logs_dir=tmp / "logs")
        procs = Processes(dep)
        try:
            api = procs.api()
            procs.worker()
            resp = httpx.post(f"{api.base_url}/v1/agents/agent-1/runs",
                              json={"prompt": make_prompt(steps=2, answer="recorded"),
                                    "durable_temporal": True},
                              headers={"Authorization": f"Bearer {API_KEY}",
                                       "Idempotency-Key": str(uuid.uuid4())}, timeout=15)
            resp.raise_for_status()
            run_id = resp.json()["run_id"]
            wait_until(lambda: httpx.get(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}",
                                         headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
                       .json()["state"] == "completed", timeout_s=30, what="the run to complete")
            text = asyncio.run(fetch(stack.info.temporal_address, f"agent-run-{run_id}-g1"))
        finally:
            procs.stop_all()
    out.write_text(json.dumps(json.loads(text), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
