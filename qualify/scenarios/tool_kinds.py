"""Tools beyond the worker's own (R-TOOL-3..5): a developer-hosted tool whose result the
client submits, a finalising tool that waits for an approval, and one approval serving
exactly one call among identical ones."""

from __future__ import annotations

import time
from typing import Any

import httpx

from qualify import http
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.tools import bearer, resume, settles, sink_lines


def _submit(api: ManagedProcess, run_id: str, call_id: str, result: Any) -> httpx.Response:
    return http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-results/{call_id}",
                      json={"result": result}, headers=bearer(), timeout=30)


@scenario(
    "developer-hosted-tool",
    title="Two developer-hosted calls park tool_result_required; results come out of order, "
          "one invalid (422), an unknown call id 409; resume is refused until both are "
          "settled, then the run completes with both results",
    requirements=("R-TOOL-4", "R-READ-2"),
)
def developer_hosted_tool(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    calls = [{"tool": "lookup_customer", "arguments": {"customer": c}} for c in ("c-1", "c-2")]
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="looked up", tools={"1": calls}))
    run = ctx.wait_state(api, run_id, "awaiting_input")
    pending = (run["result_json"] or {}).get("pending_input") or {}
    asked = pending.get("calls") or []
    ctx.expect("pending_input.kind is tool_result_required with both call ids and schemas",
               pending.get("kind") == "tool_result_required" and len(asked) == 2
               and all({"call_id", "arguments_schema", "result_schema"} <= set(c) for c in asked),
               str(pending)[:300], "R-TOOL-4")
    if len(asked) != 2:
        raise HarnessError(f"expected two pending calls: {pending}")
    first, second = asked[0]["call_id"], asked[1]["call_id"]
    early = resume(ctx, api, run_id)
    ctx.expect("resume before any result is 409 tool_results_pending",
               early.status_code == 409 and early.json().get("code") == "tool_results_pending",
               early.text[:160], "R-TOOL-4")
    ok2 = _submit(api, run_id, second, {"name": "Bo", "tier": "pro"})
    ctx.expect("the second call's result, first: 200 with the first still pending",
               ok2.status_code == 200 and ok2.json().get("pending") == [first], ok2.text[:160], "R-TOOL-4")
    bad = _submit(api, run_id, first, {"name": 1, "tier": "gold"})
    listed = (bad.json().get("errors") or []) if bad.status_code == 422 else []
    fields = {tuple(e.get("loc", []))[-1:] for e in listed}
    # Each problem has its line, as every validation error's; none repeats the value sent.
    said = all(e.get("msg") and "gold" not in e["msg"] for e in listed)
    ctx.expect("an invalid result is 422 tool_result_invalid naming each field",
               bad.status_code == 422 and bad.json().get("code") == "tool_result_invalid"
               and {("name",), ("tier",)} <= fields and said, bad.text[:200], "R-TOOL-4")
    unknown = _submit(api, run_id, "tc-00000000-0000-0000-0000-000000000000", {"name": "x", "tier": "free"})
    ctx.expect("an unknown call id is 409 tool_call_not_found",
               unknown.status_code == 409 and unknown.json().get("code") == "tool_call_not_found",
               unknown.text[:160], "R-TOOL-4")
    still = resume(ctx, api, run_id)
    ctx.expect("resume with one call unsettled is still 409 tool_results_pending",
               still.status_code == 409 and still.json().get("code") == "tool_results_pending",
               still.text[:160], "R-TOOL-4")
    ok1 = _submit(api, run_id, first, {"name": "Al", "tier": "free"})
    same = _submit(api, run_id, first, {"name": "Al", "tier": "free"})
    other = _submit(api, run_id, first, {"name": "Cy", "tier": "free"})
    ctx.expect("both settled; the same result again is 200, another one 409 tool_call_settled",
               ok1.status_code == 200 and ok1.json().get("pending") == [] and same.status_code == 200
               and other.status_code == 409 and other.json().get("code") == "tool_call_settled",
               f"{ok1.status_code} {same.status_code} {other.status_code}", "R-TOOL-4")
    go = resume(ctx, api, run_id)
    ctx.expect("then an explicit resume is accepted", go.status_code == 202, go.text[:160], "R-TOOL-4")
    run = ctx.wait_terminal(api, run_id)
    answer = str((run["result_json"] or {}).get("answer"))
    ctx.expect("the run completes fed both results", run["state"] == "completed"
               and answer.count("lookup_customer:succeeded") == 2, answer, "R-TOOL-4")
    ctx.expect("a developer-hosted call never reaches the sink", not sink_lines(ctx, "requests", run_id),
               "", "R-TOOL-4")


@scenario(
    "finalising-tool-needs-approval",
    title="A finalising tool (merge a pull request) never runs without a matching approval: "
          "the run parks awaiting_approval; denied, nothing runs and the run completes; "
          "approved on a second run, it runs once",
    requirements=("R-TOOL-5", "R-APPROVAL-1"),
)
def finalising_tool_needs_approval(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    tools = {"1": [{"tool": "merge_pull_request", "arguments": {"pr": 42}}]}
    shown: list[str] = []
    for approved in (False, True):
        run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="merged", tools=tools))
        run = settles(ctx, api, run_id)
        pending = (run["result_json"] or {}).get("pending_approval") or {}
        if not ctx.expect("the finalising call waits for an approval and has not run",
                          run["state"] == "awaiting_approval" and pending.get("tool") == "merge_pull_request"
                          and not sink_lines(ctx, "requests", run_id),
                          f"{run['state']} {pending}", "R-TOOL-5"):
            raise HarnessError(f"run {run_id} is {run['state']}, not waiting for an approval")
        decided = http.post(
            f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-approval/{pending.get('approval_id')}",
            json={"approved": approved, "action_version": pending.get("action_version")},
            headers=bearer(), timeout=30)
        ctx.expect("the decision is accepted", decided.status_code == 200, decided.text[:160], "R-APPROVAL-1")
        run = ctx.wait_terminal(api, run_id)
        status = "succeeded" if approved else "denied"
        execs = sink_lines(ctx, "executions", run_id)
        # The approver is shown the call that would run, and what runs is what was shown.
        sent = [(r.get("tool"), r.get("arguments")) for r in sink_lines(ctx, "requests", run_id)]
        if (pending.get("tool"), pending.get("arguments")) != ("merge_pull_request", {"pr": 42}) or (
                approved and sent != [(pending.get("tool"), pending.get("arguments"))]):
            shown.append(f"{'approved' if approved else 'denied'} run: shown {pending.get('tool')}"
                         f" {pending.get('arguments')}, sent {sent}")
        ctx.expect(f"{'approved' if approved else 'denied'}: the run completes fed {status}, "
                   f"the sink executed it {int(approved)} time(s)",
                   run["state"] == "completed"
                   and f"merge_pull_request:{status}" in str((run["result_json"] or {}).get("answer"))
                   and len(execs) == int(approved),
                   f"{run['state']} {(run['result_json'] or {}).get('answer')} executions {len(execs)}",
                   "R-TOOL-5")
    ctx.expect("each approval request showed the call's tool and arguments; the approved call ran with those",
               not shown, "; ".join(shown) or "merge_pull_request {'pr': 42} shown twice, run once as shown",
               "R-TOOL-5", "R-APPROVAL-1", judged=2)


@scenario(
    "one-approval-one-call",
    title="One run asks for the same finalising call (merge pull request 42) at two steps: each "
          "call waits for an approval of its own, the first approval never serves the second, "
          "and each runs exactly once",
    requirements=("R-TOOL-5", "R-APPROVAL-1"),
)
def one_approval_one_call(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    call = {"tool": "merge_pull_request", "arguments": {"pr": 42}}
    run_id = accepted(ctx, api, prompt=make_prompt(steps=4, answer="merged twice",
                                                   tools={"1": [call], "2": [call]}))
    approvals: list[str | None] = []
    for n in (1, 2):
        run = settles(ctx, api, run_id)
        pending = (run["result_json"] or {}).get("pending_approval") or {}
        ran = len(sink_lines(ctx, "executions", run_id))
        if not ctx.expect(f"identical call {n} waited for an approval of its own, {n - 1} run so far",
                          run["state"] == "awaiting_approval" and pending.get("tool") == call["tool"]
                          and pending.get("approval_id") not in approvals and ran == n - 1,
                          f"{run['state']} {pending} after {ran} executions; earlier approvals {approvals}",
                          "R-TOOL-5", "R-APPROVAL-1"):
            break
        approvals.append(pending.get("approval_id"))
        decided = http.post(
            f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-approval/{pending.get('approval_id')}",
            json={"approved": True, "action_version": pending.get("action_version")},
            headers=bearer(), timeout=30)
        ctx.expect(f"approval {n} accepted", decided.status_code == 200, decided.text[:160], "R-APPROVAL-1")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the decided approval is no longer the pending one
            now = ctx.read_run(api, run_id)
            if ((now["result_json"] or {}).get("pending_approval") or {}).get("approval_id") != approvals[-1]:
                break
            time.sleep(0.05)
    run = ctx.wait_terminal(api, run_id)
    used = ctx.sql("SELECT call_id, approval_id FROM tool_invocations WHERE run_id = %s ORDER BY step", run_id)
    ctx.expect("both calls ran once each, each under its own approval",
               run["state"] == "completed" and len(sink_lines(ctx, "executions", run_id)) == 2
               and len(used) == 2 and len({a for _, a in used}) == 2 and {a for _, a in used} == set(approvals),
               f"{run['state']}; journal {used}; approvals {approvals}", "R-TOOL-5", "R-APPROVAL-1")
