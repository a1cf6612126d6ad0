"""The tool invocation journal under faults (R-TOOL-1..5, R-RESUME-3, R-Q34-3): the worker
struck at each gap of one call, a lost reply, an approved tool struck after its side
effect, a cancel while a call is out, and every outcome of a call (developer-hosted
results, finalising tools and one approval per call are in ``qualify.scenarios.tool_kinds``).

The side-effect sink (``qualify.fakes.sink``) is the independent record: a real
subprocess that counts every request and execution by call id.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from qualify import http
from qualify.digests import canonical_sha256
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted, provider_calls
from qualify.scenarios.streams import read_stream
from qualify.scenarios.writers import guard_probe

BEFORE_INTENT = "tool.before_intent_commit"
AFTER_INTENT = "tool.after_intent_commit"
AFTER_REPLY = "tool.after_reply"
AFTER_OUTCOME = "tool.after_outcome_commit"
UNKNOWN = "side_effect_outcome_unknown"
OPERATOR_KEY = "ops-key"
PARKED_OR_ENDED = ("awaiting_input", "awaiting_approval", "completed", "failed", "expired", "cancelled")


def sink_lines(ctx: ScenarioContext, name: str, run_id: str) -> list[dict[str, Any]]:
    """``requests`` or ``executions`` the sink recorded for ``run_id``."""
    path: Path = ctx.control / "sink" / f"{name}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [d for d in map(json.loads, filter(str.strip, lines)) if d.get("run_id") == run_id]


def bearer(key: str = "dev-key") -> dict[str, str]:
    """The ``Authorization`` header of ``key`` (the tenant t-dev client key by default)."""
    return {"Authorization": f"Bearer {key}"}


def resume(ctx: ScenarioContext, api: ManagedProcess, run_id: str,
           body: dict[str, Any] | None = None) -> httpx.Response:
    key = f"resume-{run_id}-{time.monotonic_ns()}"
    ctx.history.record("client", op="resume", phase="invoke", run_id=run_id, key=key)
    resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", json=body or {},
                      headers={**bearer(), "Idempotency-Key": key}, timeout=30)
    ctx.history.record("client", op="resume", phase="ok" if resp.status_code == 202 else "fail",
                       run_id=run_id, status=resp.status_code)
    return resp


def resolve(api: ManagedProcess, run_id: str, call_id: str, outcome: str,
            result: dict[str, Any] | None = None, key: str = OPERATOR_KEY,
            note: str = "checked in the sink by call id") -> httpx.Response:
    body: dict[str, Any] = {"outcome": outcome, "note": note}
    if result is not None:
        body["result"] = result
    return http.post(f"{api.base_url}/v1/operator/runs/{run_id}/tool-invocations/{call_id}/resolution",
                      json=body, headers=bearer(key), timeout=30)


def unsettled(api: ManagedProcess, run_id: str, key: str = OPERATOR_KEY) -> httpx.Response:
    return http.get(f"{api.base_url}/v1/operator/runs/{run_id}/tool-invocations",
                     headers=bearer(key), timeout=30)


def settles(ctx: ScenarioContext, api: ManagedProcess, run_id: str, *,
            timeout_s: float = 60.0) -> dict[str, Any]:
    """The run once it is parked or ended (HarnessError when it is neither in time)."""
    deadline = time.monotonic() + timeout_s
    while (run := ctx.read_run(api, run_id))["state"] not in PARKED_OR_ENDED:
        if time.monotonic() > deadline:
            raise HarnessError(f"run {run_id} still {run['state']} after {timeout_s} s")
        time.sleep(0.05)
    return run


def _parked_unknown(ctx: ScenarioContext, api: ManagedProcess, run_id: str) -> dict[str, Any]:
    """Expect the run parked for an unknown outcome; a run that is not stops the scenario
    after the failed expectation (the verdict is then ``fail``)."""
    run = settles(ctx, api, run_id)
    pending = (run.get("result_json") or {}).get("pending_input") or {}
    parked = (run["state"] == "awaiting_input" and run["error_message"] == UNKNOWN
              and pending.get("kind") == "reconciliation_required")
    if not ctx.expect("parked awaiting_input with error_message side_effect_outcome_unknown", parked,
                      f"{run['state']} {run['error_message']} {pending}", "R-TOOL-3"):
        raise HarnessError(f"run {run_id} is {run['state']}, not parked for reconciliation")
    return run


def _awaiting_reconciliation(api: ManagedProcess) -> list[str]:
    """Run ids the operator's listing shows as awaiting reconciliation (R-READ-5)."""
    resp = http.get(f"{api.base_url}/v1/operator/runs", params={"awaiting_reconciliation": "true"},
                     headers=bearer(OPERATOR_KEY), timeout=30)
    if resp.status_code != 200:
        raise HarnessError(f"GET /v1/operator/runs: {resp.status_code} {resp.text[:200]}")
    return [r["run_id"] for r in resp.json()["runs"] if r["awaiting_reconciliation"]]


def _reconcile_and_finish(ctx: ScenarioContext, api: ManagedProcess, run_id: str, *,
                          answer_has: str, also_parked: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A parked run: a normal resume is 409; an operator records ``succeeded`` with the
    sink's receipt; an empty resume completes the run from the journal. ``also_parked``:
    other runs the scenario parked on an unknown outcome and has not reconciled yet, which
    the listing shows too (no other run may appear in it)."""
    waiting = _awaiting_reconciliation(api)
    ctx.expect("the operator finds the run by listing runs awaiting reconciliation (and only it)",
               waiting.count(run_id) == 1 and set(waiting) <= {run_id, *also_parked}
               and len(waiting) == len(set(waiting)),
               f"listed {waiting}" + (f"; {len(also_parked)} other parked run(s) may be listed"
                                      if also_parked else ""), "R-READ-5", "R-TOOL-3")
    refused = resume(ctx, api, run_id, {"additional_prompt": "go on"})
    ctx.expect("a normal resume answers 409 run_reconciliation_required",
               refused.status_code == 409 and refused.json().get("code") == "run_reconciliation_required",
               refused.text[:160], "R-RESUME-3")
    listed = unsettled(api, run_id)
    calls = listed.json().get("invocations", []) if listed.status_code == 200 else []
    ctx.expect("the operator route lists the one unknown call",
               len(calls) == 1 and calls[0]["status"] == "intent", listed.text[:200], "R-TOOL-3", "R-OPS-7")
    if not calls:
        raise HarnessError(f"no unsettled call listed: {listed.text[:200]}")
    call_id = calls[0]["call_id"]
    client = resolve(api, run_id, call_id, "succeeded", {"receipt": call_id}, key="dev-key")
    ctx.expect("a client key cannot reconcile (403 operator_credential_required)",
               client.status_code == 403 and client.json().get("code") == "operator_credential_required",
               client.text[:160], "R-OPS-7")
    # Nor through the route for developer-hosted results: a call the worker sent is the
    # operator's to record, whatever the client claims (R-TOOL-3, R-TOOL-4).
    posed = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-results/{call_id}",
                      json={"result": {"receipt": call_id}}, headers=bearer(), timeout=30)
    still = unsettled(api, run_id)
    ctx.expect("a client posting a result for the sent call is 409 tool_call_kind_mismatch and settles nothing",
               posed.status_code == 409 and posed.json().get("code") == "tool_call_kind_mismatch"
               and [c["status"] for c in still.json().get("invocations", [])] == ["intent"],
               f"{posed.text[:160]}; {still.text[:160]}", "R-TOOL-3", "R-TOOL-4")
    done = resolve(api, run_id, call_id, "succeeded", {"receipt": call_id})
    ctx.expect("the operator records succeeded with the receipt", done.status_code == 200
               and done.json().get("settled_by") == "operator:p-ops", done.text[:200], "R-TOOL-3")
    same = resolve(api, run_id, call_id, "succeeded", {"receipt": call_id})
    noted = resolve(api, run_id, call_id, "succeeded", {"receipt": call_id}, note="another account")
    ctx.expect("the same record again is 200; one with another note is 409 tool_call_settled",
               same.status_code == 200 and noted.status_code == 409
               and noted.json().get("code") == "tool_call_settled", f"{same.status_code} {noted.text[:160]}",
               "R-TOOL-3")
    left = _awaiting_reconciliation(api)
    ctx.expect("once reconciled it is no longer listed as awaiting reconciliation", run_id not in left,
               f"listed {left}", "R-READ-5")
    again = resume(ctx, api, run_id)
    ctx.expect("after reconciliation an empty resume is accepted", again.status_code == 202,
               again.text[:160], "R-TOOL-3")
    run = ctx.wait_terminal(api, run_id, timeout_s=60)
    ctx.expect("the run completes, fed the journaled result",
               run["state"] == "completed" and answer_has in str((run["result_json"] or {}).get("answer")),
               f"{run['state']} {(run['result_json'] or {}).get('answer')}", "R-TOOL-2")
    return run


def _struck(point: str, *, executions: int, parked: bool) -> None:
    sid = "tool-kill-" + point.removeprefix("tool.").replace("_", "-")

    @scenario(
        sid,
        title=f"SIGKILL the worker at {point} during an instrumented call: the sink executes it "
              f"{executions} time(s); the run {'parks side_effect_outcome_unknown and is reconciled' if parked else 'completes reusing the journal'}",
        requirements=("R-TOOL-1", "R-TOOL-2", "R-TOOL-3", "R-RESUME-3", "R-Q-4", "R-Q-5"),
        faults=(f"sigkill at {point}",),
        crash_points=(point,),
    )
    def body(ctx: ScenarioContext) -> None:
        api = ctx.processes.api()
        created = ctx.create_run(api, prompt=make_prompt(
            steps=3, answer="charged", tools={"1": [{"tool": "charge", "arguments": {"amount": 5}}]}))
        if created is None or created.status_code != 202:
            raise HarnessError(f"create failed: {created and created.text[:200]}")
        run_id, stream_key = created.json()["run_id"], created.json()["stream_key"]
        struck = ctx.strike_worker(point, "worker-1")
        killed = (struck.get("evidence") or {}).get("pid")
        ctx.processes.worker("worker-2")
        if parked:
            _parked_unknown(ctx, api, run_id)
            ctx.expect(f"the sink executed the call {executions} time(s) before reconciliation",
                       len(sink_lines(ctx, "executions", run_id)) == executions,
                       str(sink_lines(ctx, "executions", run_id)), "R-TOOL-3")
            run = _reconcile_and_finish(ctx, api, run_id, answer_has="charge:succeeded")
        else:
            run = ctx.wait_terminal(api, run_id, timeout_s=60)
            ctx.expect("the run completes, fed the journaled result",
                       run["state"] == "completed"
                       and "charge:succeeded" in str((run["result_json"] or {}).get("answer")),
                       f"{run['state']} {run.get('result_json')}", "R-TOOL-2")
            events = read_stream(ctx, api, run_id, stream_key)
            tools = [(e.get("event"), json.loads(e.get("data", "{}")).get("status")) for e in events
                     if e.get("event") in ("tool_call", "tool_result")]
            ctx.expect("the event stream shows the call's intent and its outcome once each",
                       tools == [("tool_call", None), ("tool_result", "succeeded")]
                       and events[-1].get("event") == "terminal", str(tools), "R-TOOL-1", "R-EVENT-1")
        # The kill landed in the gap its crash point names, after step 1's pre-tool checkpoint:
        # the retry restored the call from it, so step 1 was asked of the provider by the
        # killed worker only (the synthetic provider's own record, by pid; a re-ask of the
        # killed worker before its checkpoint, under load, is its own business). A kill
        # before that checkpoint would prove nothing of the restore (R-TOOL-2).
        first = [c for c in provider_calls(ctx, run_id) if int(c["step"]) == 1]
        pids = sorted({c.get("pid") for c in first}, key=str)
        ctx.expect("the provider was asked step 1 by the killed worker only: the retry restored its "
                   "pre-tool checkpoint", bool(first) and killed is not None and pids == [killed],
                   f"step 1 asked {len(first)} time(s), by pids {pids}; the killed worker's pid {killed}",
                   "R-TOOL-2")
        execs = sink_lines(ctx, "executions", run_id)
        reqs = sink_lines(ctx, "requests", run_id)
        ctx.figures["sink_executions"] = len(execs)
        ctx.expect(f"the sink executed the call exactly {executions} time(s), requested as often",
                   len(execs) == executions and len(reqs) == executions,
                   f"executions {len(execs)}, requests {len(reqs)}", "R-TOOL-2", "R-Q-5")
        # What the journal holds as the call's outcome is what really happened: the sink's
        # reply to its one execution, recorded by the worker, or the operator's record of it
        # (R-TOOL-1: an outcome after the effect; R-TOOL-3: what really happened).
        journal = ctx.sql("SELECT call_id, status, result, settled_by FROM tool_invocations"
                          " WHERE run_id = %s", run_id)
        call = str(journal[0][0]) if len(journal) == 1 else ""
        want = ((call, "succeeded", {"receipt": call}, "operator:p-ops") if parked
                else (call, "succeeded", {"receipt": call, "executed": True}, "worker"))
        ctx.expect("the journal holds what really happened as the call's outcome: "
                   + ("the operator's record" if parked else "the sink's reply, recorded by the worker"),
                   len(journal) == 1 and tuple(journal[0]) == want,
                   f"journal {[tuple(r) for r in journal]}", "R-TOOL-1", "R-TOOL-3", judged=len(journal))
        # The intent names what was asked (R-TOOL-1: run, generation, step, tool, arguments
        # digest, call id): the call of step 1 of generation 1, its digest computed here.
        asked = {"tool": "charge", "arguments": {"amount": 5}}
        intent = ctx.sql("SELECT generation, step, position, tool, arguments, arguments_digest,"
                         " intent_at IS NOT NULL FROM tool_invocations WHERE run_id = %s", run_id)
        ctx.expect("the intent records the run, generation, step, tool, arguments and their digest asked",
                   [tuple(r) for r in intent] == [(1, 1, 0, asked["tool"], asked["arguments"],
                                                   canonical_sha256(asked), True)],
                   f"journal {[tuple(r) for r in intent]}", "R-TOOL-1", judged=len(intent))
        # Counted once, when its intent was committed: neither per attempt nor per request
        # (the run record's journal says which calls were sent, R-Q34-3).
        sent = [c for c in run.get("tool_invocations") or [] if c.get("sent")]
        ctx.expect("usage counts the tool calls sent",
                   len(sent) == 1 and run["usage"].get("tool_calls") == len(sent),
                   f"usage {run['usage']}; {len(sent)} sent in the journal", "R-Q34-2",
                   judged=executions)  # none reached the sink: covers nothing


_struck(BEFORE_INTENT, executions=1, parked=False)
_struck(AFTER_INTENT, executions=0, parked=True)
_struck(AFTER_REPLY, executions=1, parked=True)
_struck(AFTER_OUTCOME, executions=1, parked=False)


@scenario(
    "tool-reply-lost",
    title="The sink performs the effect and withholds its reply past the tool's timeout: the "
          "run parks side_effect_outcome_unknown, a normal resume is 409, the operator "
          "records succeeded, a resume completes; the sink executed it once",
    requirements=("R-TOOL-1", "R-TOOL-2", "R-TOOL-3", "R-RESUME-3", "R-OPS-7", "R-Q-5"),
)
def tool_reply_lost(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    run_id = accepted(ctx, api, prompt=make_prompt(
        steps=3, answer="charged", tools={"1": [{"tool": "charge",
                                                 "arguments": {"amount": 7, "sink_hold_s": 3}}]}))
    run = _parked_unknown(ctx, api, run_id)
    journal = run.get("tool_invocations") or []
    ctx.expect("the run record shows the call sent, outcome unknown",
               len(journal) == 1 and journal[0]["sent"] and journal[0]["outcome"] == "unknown",
               str(journal), "R-Q34-3")
    # QG010 alone: the API's own 409 comes first on the route; the database refuses the
    # write itself (a new generation while a call's outcome is unknown) whoever sends it.
    answer = guard_probe(ctx.deployment.app_dsn("qimpl_api"), run_id, "t-dev",
                         "state = 'accepted', generation = generation + 1, row_version = row_version + 1, owner_attempt = NULL")
    ctx.history.record("probe", mechanism="guard", case="resume past an unknown outcome", run_id=run_id,
                       answer=answer)
    ctx.expect("the guard refuses a new generation while a tool outcome is unknown (QG010)",
               answer == "QG010", answer, "R-RESUME-3", "R-TOOL-3")
    _reconcile_and_finish(ctx, api, run_id, answer_has="charge:succeeded")
    execs, asked = sink_lines(ctx, "executions", run_id), sink_lines(ctx, "requests", run_id)
    ctx.figures["sink_executions"] = len(execs)
    ctx.expect("the sink was asked once and executed the call once (the operator's record is "
               "what the resume fed, nothing was sent again)", len(execs) == 1 and len(asked) == 1,
               f"{len(asked)} requests, {len(execs)} executions", "R-TOOL-2")


@scenario(
    "approved-tool-killed-after-effect",
    title="An approved tool runs through the journal; the worker is SIGKILLed right after "
          "its side effect, before the outcome commit: the run parks, is reconciled and "
          "completes; the sink executed the tool once",
    requirements=("R-APPROVAL-1", "R-TOOL-1", "R-TOOL-3", "R-Q-4"),
    faults=(f"sigkill at {AFTER_REPLY}",),
    crash_points=(AFTER_REPLY,),
)
def approved_tool_killed_after_effect(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    doomed = ctx.processes.worker("worker-1", QIMPL_CRASH_POINTS=f"{AFTER_REPLY}:kill")
    run_id = accepted(ctx, api, prompt=make_prompt(steps=4, answer="sent",
                                                   park={"step": 1, "kind": "approval"}))
    run = ctx.wait_state(api, run_id, "awaiting_approval")
    pending = (run["result_json"] or {}).get("pending_approval") or {}
    yes = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-approval/{pending.get('approval_id')}",
                     json={"approved": True, "action_version": pending.get("action_version")},
                     headers=bearer(), timeout=30)
    ctx.expect("the approval is accepted", yes.status_code == 200, yes.text[:160], "R-APPROVAL-1")
    evidence = ctx.wait_crash_point(AFTER_REPLY, doomed)
    assert doomed.proc is not None
    ctx.nemesis.crash_point(doomed, evidence, exit_code=doomed.proc.wait(timeout=10))
    ctx.processes.worker("worker-2")
    _parked_unknown(ctx, api, run_id)
    _reconcile_and_finish(ctx, api, run_id, answer_has="tool ran: send_email")
    execs = sink_lines(ctx, "executions", run_id)
    asked = sink_lines(ctx, "requests", run_id)
    ctx.figures["sink_executions"] = len(execs)
    # The arguments the sink was sent are the ones the approval was decided on (R-APPROVAL-1).
    ctx.expect("the approved tool executed exactly once, with the approved arguments",
               len(execs) == 1 and execs[0].get("tool") == "send_email" and len(asked) == 1
               and asked[0].get("tool") == pending.get("tool")
               and asked[0].get("arguments") == pending.get("arguments"),
               f"executions {execs}; sent {[(r.get('tool'), r.get('arguments')) for r in asked]}; approved"
               f" {pending.get('tool')} {pending.get('arguments')}", "R-APPROVAL-1")


@scenario(
    "cancel-during-tool-call",
    title="Cancel while an instrumented call is out: the run is cancelled, nothing is undone, "
          "the run record lists the call as sent with an unknown outcome; an operator may "
          "still record what happened",
    requirements=("R-Q34-3", "R-CANCEL-1", "R-TOOL-3"),
)
def cancel_during_tool_call(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    run_id = accepted(ctx, api, prompt=make_prompt(
        steps=3, tools={"1": [{"tool": "charge", "arguments": {"amount": 9, "sink_hold_s": 3}}]}))
    deadline = time.monotonic() + 30
    while not sink_lines(ctx, "requests", run_id):
        if time.monotonic() > deadline:
            raise HarnessError("the call never reached the sink")
        time.sleep(0.01)
    ctx.cancel_run(api, run_id)
    run = ctx.wait_terminal(api, run_id)
    journal = run.get("tool_invocations") or []
    ctx.expect("cancelled; the run record lists the call as sent, outcome unknown",
               run["state"] == "cancelled" and len(journal) == 1 and journal[0]["sent"]
               and journal[0]["outcome"] == "unknown", f"{run['state']} {journal}", "R-Q34-3")
    call_id = journal[0]["call_id"] if journal else ""
    # The client can no longer settle it: the operator's listing must still show it.
    waiting = _awaiting_reconciliation(api)
    ctx.expect("the cancelled run with an unknown outcome is listed as awaiting reconciliation",
               waiting == [run_id], f"listed {waiting}", "R-READ-5", "R-TOOL-3")
    done = resolve(api, run_id, call_id, "succeeded", {"receipt": call_id})
    ctx.expect("an operator may record what happened after the cancel", done.status_code == 200,
               done.text[:160], "R-Q34-3")
    left = _awaiting_reconciliation(api)
    ctx.expect("once recorded, the cancelled run is no longer listed", run_id not in left,
               f"listed {left}", "R-READ-5")
    ctx.expect("the sink executed the call once (nothing undone, nothing repeated)",
               len(sink_lines(ctx, "executions", run_id)) == 1, "", "R-Q34-3")


@scenario(
    "tool-call-outcomes",
    title="One step asks for five calls: a refused charge is journaled failed, an unknown tool "
          "and arguments off schema rejected (nothing sent), a refused uninstrumented action "
          "is an unknown outcome that parks the run; the operator records compensated and "
          "the run completes fed every outcome",
    requirements=("R-TOOL-1", "R-TOOL-2", "R-TOOL-3", "R-Q34-2"),
)
def tool_call_outcomes(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    calls = [{"tool": "charge", "arguments": {"amount": 3, "sink_refuse": True}},
             {"tool": "no_such_tool", "arguments": {}},
             {"tool": "charge", "arguments": {"amount": 0}},
             {"tool": "shell", "arguments": {"sink_refuse": True}},
             {"tool": "charge", "arguments": {"amount": 4}}]
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="mixed", tools={"1": calls}))
    run = _parked_unknown(ctx, api, run_id)
    view = [(c["tool"], c["outcome"], c["sent"]) for c in run.get("tool_invocations") or []]
    ctx.expect("journal: charge failed (sent), two rejected (not sent), shell unknown; the call "
               "after the unknown one not run",
               view == [("charge", "failed", True), ("no_such_tool", "rejected", False),
                        ("charge", "rejected", False), ("shell", "unknown", True)],
               str(view), "R-TOOL-1", "R-TOOL-3")
    listed = unsettled(api, run_id).json().get("invocations", [])
    shell = [c["call_id"] for c in listed if c["tool"] == "shell"]
    ctx.expect("the operator sees only the shell action unsettled", len(listed) == 1 and len(shell) == 1,
               str(listed)[:200], "R-TOOL-3")
    if not shell:
        raise HarnessError("no unsettled shell action")
    done = resolve(api, run_id, shell[0], "compensated")
    ctx.expect("the operator records compensated, with no result to feed the provider",
               done.status_code == 200 and done.json().get("status") == "compensated"
               and done.json().get("result") is None, done.text[:160], "R-TOOL-3")
    again = resolve(api, run_id, shell[0], "compensated")
    ctx.expect("the same resolution again is idempotent (200, the record unchanged)",
               again.status_code == 200 and again.json() == done.json(), again.text[:160], "R-TOOL-3")
    go = resume(ctx, api, run_id)
    ctx.expect("then a resume is accepted", go.status_code == 202, go.text[:160], "R-TOOL-3")
    run = ctx.wait_terminal(api, run_id)
    answer = str((run["result_json"] or {}).get("answer"))
    ctx.expect("the run completes fed every outcome, the last call run after the resume",
               run["state"] == "completed" and answer.endswith(
                   "[charge:failed no_such_tool:rejected charge:rejected shell:compensated charge:succeeded]"),
               answer, "R-TOOL-2")
    sent = sink_lines(ctx, "requests", run_id)
    ctx.expect("the sink saw three requests (refused charge, refused action, last charge), once each",
               sorted(r["tool"] for r in sent) == ["charge", "charge", "shell"], str(sent), "R-TOOL-2")
    ctx.expect("usage counts the three calls sent", run["usage"].get("tool_calls") == 3,
               str(run["usage"]), "R-Q34-2")
