"""The run's event stream (R-EVENT-1..4, R-AUTH-3): read part of it from one API, drop the
connection, resume with Last-Event-ID on another; the run goes on; keys are bound to runs."""

from __future__ import annotations

import json
from typing import Any

import httpx

from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted

PATH = "/v1/agents/agent-1/runs/{run_id}/events"


def read_stream(ctx: ScenarioContext, api: ManagedProcess, run_id: str, key: str, *,
                last_event_id: str | None = None, stop_after: int | None = None) -> list[dict[str, Any]]:
    """Read SSE events (recording each in the history) until the stream ends or
    ``stop_after`` events; returns them as ``{id, event, data}``."""
    headers = {"X-Stream-Key": key, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    got: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", headers=headers,
                      timeout=60) as resp:
        if resp.status_code != 200:
            return [{"status": resp.status_code, "body": resp.read().decode()[:200]}]
        event: dict[str, Any] = {}
        for line in resp.iter_lines():
            if line.startswith(("id:", "event:", "data:")):
                field, _, value = line.partition(":")
                event[field] = value.strip()
            elif not line and event:
                data = json.loads(event.get("data", "{}"))
                ctx.history.record("stream_event", run_id=run_id, event_id=int(event["id"]),
                                   event=event.get("event"), state=data.get("state"), process=api.name)
                got.append(event)
                event = {}
                if stop_after is not None and len(got) >= stop_after:
                    break
    return got


@scenario(
    "event-stream",
    title="Read a run's events from one API, drop the connection, resume with Last-Event-ID on "
          "another: nothing lost or repeated, the run is not cancelled, the stream ends with its "
          "terminal state; a stream key works only for its own run",
    requirements=("R-EVENT-1", "R-EVENT-2", "R-EVENT-3", "R-EVENT-4", "R-AUTH-3"),
)
def event_stream(ctx: ScenarioContext) -> None:
    apis = [ctx.processes.api("api-1"), ctx.processes.api("api-2")]
    ctx.processes.worker()
    resp = ctx.create_run(apis[0], prompt=make_prompt(steps=5, delay_ms=150, answer="streamed"))
    assert resp is not None
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    first = read_stream(ctx, apis[0], run_id, key, stop_after=3)
    ctx.expect("three events read, then the client hung up", len(first) == 3 and "id" in first[-1],
               str([e.get("event") for e in first]), "R-EVENT-2")
    rest = read_stream(ctx, apis[1], run_id, key, last_event_id=first[-1]["id"])
    ctx.expect("the stream resumed on another API instance and ended with a terminal event",
               bool(rest) and rest[-1].get("event") == "terminal", str([e.get("event") for e in rest]),
               "R-EVENT-2", "R-EVENT-3")
    run = ctx.wait_terminal(apis[0], run_id)
    ctx.expect("hanging up did not cancel the run: it completed", run["state"] == "completed",
               run["state"], "R-EVENT-4")
    if rest and "id" in rest[-1]:
        after = read_stream(ctx, apis[0], run_id, key, last_event_id=rest[-1]["id"])
        ctx.expect("reconnecting after the terminal event: 204, nothing more (a client stops)",
                   after == [{"status": 204, "body": ""}], str(after)[:200], "R-EVENT-3")
    kinds = {e.get("event") for e in first + rest}
    ctx.expect("the journal has state changes, checkpoints and the answer's output event",
               {"state", "checkpoint", "output"} <= kinds, str(sorted(k for k in kinds if k)), "R-EVENT-1")
    other = accepted(ctx, apis[0], prompt=make_prompt(steps=1))
    borrowed = read_stream(ctx, apis[0], other, key)
    ctx.expect("this run's stream key is refused for another run (404)",
               bool(borrowed) and borrowed[0].get("status") == 404, str(borrowed)[:120], "R-AUTH-3")
    foreign = httpx.post(f"{apis[0].base_url}/v1/agents/agent-1/runs", timeout=15,
                         json={"prompt": make_prompt(steps=1), "durable_temporal": True},
                         headers={"Authorization": "Bearer other-key", "Idempotency-Key": "foreign"})
    tenant_key = foreign.json().get("stream_key", "")
    crossed = read_stream(ctx, apis[0], run_id, tenant_key)
    ctx.expect("another tenant's stream key is refused (404)",
               bool(crossed) and crossed[0].get("status") == 404, str(crossed)[:120], "R-AUTH-3")
    nokey = httpx.get(f"{apis[0].base_url}{PATH.format(run_id=run_id)}", timeout=10)
    ctx.expect("no stream key: 401 stream_key_required",
               nokey.status_code == 401 and nokey.json().get("code") == "stream_key_required",
               nokey.text[:120], "R-AUTH-3")
