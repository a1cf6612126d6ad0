"""Legacy paths stay as they were: inline runs (lifecycle 1) and ``/v1/answer``."""

from __future__ import annotations

import json

from qualify import http
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import API_KEY, ScenarioContext, scenario


@scenario(
    "legacy-paths",
    title="A request without durable_temporal runs inline as lifecycle 1 and reads as "
          "legacy; /v1/answer answers as JSON and as SSE",
    requirements=("R-CREATE-6", "R-CREATE-7", "R-READ-4"),
)
def legacy_paths(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    auth = {"Authorization": f"Bearer {API_KEY}"}
    ctx.history.record("client", op="create-legacy", phase="invoke")
    resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs", headers=auth, timeout=10,
                      json={"prompt": make_prompt(steps=2, answer="inline")})
    if resp.status_code != 202:
        raise HarnessError(f"legacy create answered {resp.status_code}: {resp.text[:200]}")
    receipt = resp.json()
    ctx.history.record("client", op="create-legacy", phase="ok", run_id=receipt["run_id"])
    ctx.expect("legacy receipt: durability legacy, lifecycle 1",
               (receipt["durability"], receipt["lifecycle_version"]) == ("legacy", 1),
               f"{receipt['durability']} {receipt['lifecycle_version']}", "R-CREATE-6")
    run = ctx.wait_terminal(api, receipt["run_id"])
    ctx.expect("legacy run completed inline and reads as legacy",
               run["state"] == "completed" and run["durability"] == "legacy"
               and run["result_json"] == {"answer": "inline"}, json.dumps(run)[:300], "R-READ-4")
    wf = ctx.sql("SELECT workflow_id FROM runs WHERE run_id = %s", receipt["run_id"])[0][0]
    ctx.expect("no workflow for a legacy run", wf is None, str(wf), "R-CREATE-6")
    prompt = make_prompt(steps=3, answer="synchronous")
    plain = http.post(f"{api.base_url}/v1/answer", headers=auth, json={"prompt": prompt}, timeout=10)
    ctx.expect("/v1/answer JSON", plain.status_code == 200 and plain.json().get("answer") == "synchronous",
               plain.text[:200], "R-CREATE-7")
    sse = http.post(f"{api.base_url}/v1/answer", json={"prompt": prompt}, timeout=10,
                     headers={**auth, "Accept": "text/event-stream"})
    events = [line.removeprefix("event: ").strip() for line in sse.text.splitlines()
              if line.startswith("event:")]
    ctx.expect("/v1/answer SSE: answer then done", sse.status_code == 200 and events == ["answer", "done"]
               and "synchronous" in sse.text, f"{sse.status_code} {events}", "R-CREATE-7")
