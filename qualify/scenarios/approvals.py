"""Tool approvals (R-APPROVAL-1): exact action versions, idempotent and conflicting
decisions, a re-plan that makes old versions stale, races, and cancel."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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


@scenario(
    "approval-races",
    title="Ten concurrent decisions on one approval, mixed approve and deny: one wins, the "
          "same decision is idempotent, the other 409; one new generation; the tool runs at "
          "most once; a decision after cancel is 409",
    requirements=("R-APPROVAL-1", "R-CANCEL-1"),
)
def approval_races(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, park={"step": 1, "kind": "approval"}))
    pending = _pending(ctx, api, run_id)
    votes = [i % 2 == 0 for i in range(10)]
    with ThreadPoolExecutor(max_workers=10) as pool:
        answers = list(pool.map(lambda v: _decide(api, run_id, pending["approval_id"], v,
                                                  pending["action_version"]), votes))
    codes = Counter((v, r.status_code) for v, r in zip(votes, answers, strict=True))
    ctx.history.record("client", op="decide x10", phase="ok", outcomes={str(k): n for k, n in codes.items()})
    winners = {v for v, r in zip(votes, answers, strict=True) if r.status_code == 200}
    ctx.expect("one decision wins: all of its votes 200, all the others 409",
               len(winners) == 1 and all((r.status_code == 200) == (v in winners)
                                         for v, r in zip(votes, answers, strict=True)),
               str(dict(codes)), "R-APPROVAL-1")
    generations = ctx.sql("SELECT count(*) FROM run_transitions WHERE run_id = %s"
                          " AND old_state = 'awaiting_approval'", run_id)[0][0]
    ctx.expect("exactly one transition out of awaiting_approval", generations == 1, str(generations),
               "R-APPROVAL-1")
    if winners == {True}:
        ctx.wait_terminal(api, run_id)
        ctx.expect("approved: the tool ran exactly once", len(_side_effects(ctx, run_id)) == 1,
                   str(len(_side_effects(ctx, run_id))), "R-APPROVAL-1")
    else:
        ctx.wait_state(api, run_id, "awaiting_approval")  # re-planned, asking again
        ctx.expect("denied: nothing ran", not _side_effects(ctx, run_id), "", "R-APPROVAL-1")
        ctx.cancel_run(api, run_id)  # every run the scenario starts ends
    parked = accepted(ctx, api, prompt=make_prompt(steps=3, park={"step": 1, "kind": "approval"}))
    late = _pending(ctx, api, parked)
    ctx.cancel_run(api, parked)
    after = _decide(api, parked, late["approval_id"], True, late["action_version"])
    ctx.expect("a decision after cancel is 409 and runs nothing",
               after.status_code == 409 and not _side_effects(ctx, parked), after.text[:120], "R-CANCEL-1")
