"""Tool approvals (R-APPROVAL-1): exact action versions, idempotent and conflicting
decisions, a re-plan that makes old versions stale, races, and cancel."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from qualify import http
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted


def _decide(api: ManagedProcess, run_id: str, approval_id: str, approved: bool, version: str,
            key: str = "dev-key") -> httpx.Response:
    return http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/tool-approval/{approval_id}",
                      json={"approved": approved, "action_version": version}, timeout=30,
                      headers={"Authorization": f"Bearer {key}"})


def _side_effects(ctx: ScenarioContext, run_id: str) -> list[dict[str, Any]]:
    """What the side-effect sink executed for ``run_id``, each with the journal's record of
    the call (``approval_id``, ``arguments``) joined by call id."""
    path = ctx.control / "sink" / "executions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    out = []
    for d in map(json.loads, filter(str.strip, lines)):
        if d.get("run_id") != run_id:
            continue
        found = ctx.sql("SELECT approval_id, arguments FROM tool_invocations WHERE call_id = %s",
                        d["call_id"])
        out.append({**d, "approval_id": found[0][0] if found else None,
                    "arguments": found[0][1] if found else None})
    return out


def _pending(ctx: ScenarioContext, api: ManagedProcess, run_id: str) -> dict[str, Any]:
    run = ctx.wait_state(api, run_id, "awaiting_approval")
    pending: dict[str, Any] = (run["result_json"] or {}).get("pending_approval", {})
    return pending


@scenario(
    "approval-flow",
    title="A stale action version runs nothing; the same decision twice is idempotent, the "
          "opposite one 409; a denial re-plans with a new action version; the approved tool "
          "runs exactly once",
    requirements=("R-APPROVAL-1", "R-READ-2", "R-AUTH-1", "R-EXEC-9", "R-Q34-2"),
)
def approval_flow(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    run_id = accepted(ctx, api, prompt=make_prompt(steps=4, answer="sent",
                                                   park={"step": 2, "kind": "approval"}))
    first = _pending(ctx, api, run_id)
    ctx.expect("pending_approval has approval_id, action_version, tool, arguments",
               {"approval_id", "action_version", "tool", "arguments"} <= set(first), str(first), "R-READ-2")
    stale = _decide(api, run_id, first["approval_id"], True, "0" * 16)
    ctx.expect("an unknown action_version is 409 action_version_mismatch and runs nothing",
               stale.status_code == 409 and stale.json().get("code") == "action_version_mismatch"
               and not _side_effects(ctx, run_id)
               and ctx.read_run(api, run_id)["state"] == "awaiting_approval", stale.text[:120], "R-APPROVAL-1")
    foreign = _decide(api, run_id, first["approval_id"], True, first["action_version"], key="peer-key")
    ctx.expect("a decision from another principal is 404", foreign.status_code == 404,
               foreign.text[:120], "R-APPROVAL-1", "R-AUTH-1")
    deny = _decide(api, run_id, first["approval_id"], False, first["action_version"])
    again = _decide(api, run_id, first["approval_id"], False, first["action_version"])
    flip = _decide(api, run_id, first["approval_id"], True, first["action_version"])
    ctx.expect("deny, deny again (idempotent), then approve the same approval (409)",
               deny.status_code == 200 and again.status_code == 200
               and flip.status_code == 409 and flip.json().get("code") == "approval_conflict",
               f"{deny.status_code} {again.status_code} {flip.status_code}", "R-APPROVAL-1")
    second = _pending(ctx, api, run_id)
    ctx.expect("the re-plan asks again with a new approval_id and action_version",
               second["approval_id"] != first["approval_id"]
               and second["action_version"] != first["action_version"], str(second), "R-APPROVAL-1")
    old = _decide(api, run_id, second["approval_id"], True, first["action_version"])
    ctx.expect("the old action_version on the new approval is 409 action_version_mismatch",
               old.status_code == 409 and old.json().get("code") == "action_version_mismatch",
               old.text[:120], "R-APPROVAL-1")
    yes = _decide(api, run_id, second["approval_id"], True, second["action_version"])
    ctx.expect("the current version is approved", yes.status_code == 200, yes.text[:120], "R-APPROVAL-1")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("run completed", run["state"] == "completed", run["state"])
    effects = _side_effects(ctx, run_id)
    ctx.expect("usage counts the one tool call", run["usage"].get("tool_calls") == 1, str(run["usage"]),
               "R-Q34-2")
    ctx.expect("the approved tool ran exactly once, with the approved arguments",
               len(effects) == 1 and effects[0]["approval_id"] == second["approval_id"]
               and effects[0]["arguments"] == second["arguments"], str(effects), "R-APPROVAL-1")


DECISION_LOCKED = "api.approval.after_lock"


@scenario(
    "approval-races",
    title="Two races, one won by an approval and one by a denial: the first decision is held "
          "with the run's row locked while nine opposite ones wait on the lock; the held one "
          "wins, the nine are 409, one decision and one new generation are recorded; the "
          "approved tool runs exactly once, a denied call the model asks for anyway is "
          "journaled denied and never runs; a decision after cancel is 409 and writes nothing",
    requirements=("R-APPROVAL-1", "R-CANCEL-1", "R-TOOL-5"),
)
def approval_races(ctx: ScenarioContext) -> None:
    # The hold is not a nemesis fault (the API lives on); its evidence is a struck crash point.
    api = ctx.processes.api(QIMPL_CRASH_POINTS=f"{DECISION_LOCKED}:hold?armed")
    ctx.processes.worker()
    waiters_seen = 0
    for held_vote in (True, False):
        side = "approval" if held_vote else "denial"
        run_id = accepted(ctx, api, prompt=make_prompt(
            steps=3, park={"step": 1, "kind": "approval", "stubborn": True}))
        pending = _pending(ctx, api, run_id)
        approval, version = pending["approval_id"], pending["action_version"]
        ctx.arm_crash_point(DECISION_LOCKED, {"run_id": run_id})
        with ThreadPoolExecutor(max_workers=10) as pool:
            first = pool.submit(_decide, api, run_id, approval, held_vote, version)
            evidence = ctx.wait_crash_point_for(DECISION_LOCKED, api, run_id=run_id)
            rivals = [pool.submit(_decide, api, run_id, approval, not held_vote, version) for _ in range(9)]
            # Each decision request holds one API session, waiting on the run's row.
            waiting = ctx.lock_waiters(want=9, query_like="SELECT * FROM runs WHERE run_id = %FOR UPDATE")
            Path(evidence["release"]).touch()  # this arming's own release (qimpl.crashpoints)
            held, lost = first.result(timeout=60), [f.result(timeout=60) for f in rivals]
        waiters_seen += waiting
        codes = Counter(r.json().get("code", r.status_code) if r.status_code != 200 else 200 for r in lost)
        ctx.history.record("client", op="decide x10", phase="ok", run_id=run_id, held=held_vote,
                           held_status=held.status_code, rivals={str(k): n for k, n in codes.items()},
                           lock_waiters=waiting)
        ctx.expect("the held decision wins; every opposite decision that waited on its lock is "
                   "409 approval_conflict",
                   held.status_code == 200 and codes == Counter({"approval_conflict": 9}),
                   f"{side}: held {held.status_code}, rivals {dict(codes)}, {waiting} waited on the lock",
                   "R-APPROVAL-1", judged=1 if waiting else 0)  # no rival seen waiting: no race
        again = _decide(api, run_id, approval, held_vote, version)
        ctx.expect("the winning decision sent again is 200: idempotent",
                   again.status_code == 200, f"{side}: {again.status_code} {again.text[:120]}", "R-APPROVAL-1")
        run = ctx.wait_terminal(api, run_id)
        decisions = ctx.sql("SELECT approved FROM approval_decisions WHERE run_id = %s", run_id)
        ctx.expect("one decision recorded, the held one, and one new generation",
                   decisions == [(held_vote,)] and run["generation"] == 2,
                   f"{side}: decisions {decisions}, g{run['generation']} {run['state']}", "R-APPROVAL-1")
        effects = _side_effects(ctx, run_id)
        journal = ctx.sql("SELECT status, approval_id FROM tool_invocations WHERE run_id = %s", run_id)
        if held_vote:
            ctx.expect("approved: the tool ran exactly once, under the approval",
                       run["state"] == "completed" and len(effects) == 1 and effects[0]["approval_id"] == approval,
                       f"{run['state']} {effects}", "R-APPROVAL-1", "R-TOOL-5")
        else:
            # The model asks for the denied call anyway: the runtime journals it denied, runs
            # nothing, and feeds the denial back (the answer says so).
            ctx.expect("denied: the call the model asked for anyway is journaled denied and never runs",
                       run["state"] == "completed" and not effects and journal == [("denied", approval)]
                       and "(tool denied: send_email)" in str((run["result_json"] or {}).get("answer")),
                       f"{run['state']} effects {effects} journal {journal} {run['result_json']}",
                       "R-APPROVAL-1", "R-TOOL-5")
    ctx.figures["approval_lock_waiters_seen"] = waiters_seen
    parked = accepted(ctx, api, prompt=make_prompt(steps=3, park={"step": 1, "kind": "approval"}))
    late = _pending(ctx, api, parked)
    ctx.cancel_run(api, parked)
    after = _decide(api, parked, late["approval_id"], True, late["action_version"])
    written = ctx.sql("SELECT (SELECT count(*) FROM approval_decisions WHERE run_id = %s),"
                      " (SELECT generation FROM runs WHERE run_id = %s)", parked, parked)[0]
    ctx.expect("a decision after cancel is 409 run_terminal and writes nothing",
               after.status_code == 409 and after.json().get("code") == "run_terminal" and written == (0, 1)
               and not _side_effects(ctx, parked), f"{after.text[:120]} decisions, generation {written}",
               "R-CANCEL-1")

