"""The walking-skeleton scenarios: a happy path, and a worker SIGKILLed mid-activity."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime

from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.receipts import receipt_against_the_run

STEPS = 5
#: ``(input_tokens, output_tokens)`` the synthetic provider reports for each step it answers.
SYNTHETIC_TOKENS = (10, 5)


def _provider_calls(ctx: ScenarioContext, run_id: str) -> Counter[int]:
    path = ctx.control / "provider_calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(int(d["step"]) for d in map(json.loads, lines) if d["run_id"] == run_id)


@scenario(
    "happy-path",
    exec_because="the API and worker entry points, exec'd, through a whole run",
    title="A durable run completes with the scripted answer",
    requirements=("R-CREATE-3", "R-CREATE-4", "R-CREATE-5", "R-READ-1", "R-EXEC-1", "R-EXEC-2",
                  "R-EXEC-3", "R-Q-1", "R-Q-3", "R-Q-5", "R-AUTH-4", "R-Q34-2"),
)
def happy_path(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    answer = f"answer-{ctx.rng.randrange(10**6)}"
    resp = ctx.create_run(api, prompt=make_prompt(steps=STEPS, answer=answer))
    if resp is None or resp.status_code != 202:
        raise HarnessError(f"create failed: {resp and resp.status_code} {resp and resp.text[:200]}")
    receipt = resp.json()
    ctx.expect("receipt says queued, temporal, lifecycle 2",
               (receipt["state"], receipt["durability"], receipt["lifecycle_version"])
               == ("queued", "temporal", 2),
               json.dumps({k: v for k, v in receipt.items() if k != "stream_key"}), "R-CREATE-3")
    committed = ctx.sql("SELECT run_id::text, stream_key, extract(epoch FROM deadline_at)::float8, agent_id"
                        " FROM runs WHERE run_id = %s", receipt["run_id"])
    differ = receipt_against_the_run(receipt, dict(zip(
        ("run_id", "stream_key", "deadline_t"), committed[0][:3], strict=True))) if committed else {"run": "missing"}
    ctx.expect("the receipt is the run's own as committed (run, agent, stream key, deadline_at)",
               not differ and bool(committed) and receipt.get("agent_id") == committed[0][3] == "agent-1",
               f"differs {differ}; agent {receipt.get('agent_id')}", "R-CREATE-3", "R-CREATE-4")
    run = ctx.wait_terminal(api, receipt["run_id"])
    ctx.expect("run completed", run["state"] == "completed", run["state"], "R-EXEC-1")
    ctx.expect("result_json holds the scripted answer", run["result_json"] == {"answer": answer},
               json.dumps(run["result_json"]), "R-READ-2")
    usage = run["usage"]
    ctx.expect("usage: provider calls and tokens per step, and wall time",
               usage.get("provider_calls") == STEPS and usage.get("input_tokens") == STEPS * SYNTHETIC_TOKENS[0]
               and usage.get("output_tokens") == STEPS * SYNTHETIC_TOKENS[1] and usage.get("wall_s", 0) > 0,
               f"{usage}; the synthetic provider reports {SYNTHETIC_TOKENS} tokens a step", "R-Q34-2")
    # A provider that does not report a count: unknown in the run's usage, never 0.
    quiet = ctx.create_run(api, prompt=make_prompt(steps=2, answer="quiet", usage={"output_tokens": None}))
    if quiet is None or quiet.status_code != 202:
        raise HarnessError(f"create failed: {quiet and quiet.status_code} {quiet and quiet.text[:200]}")
    unreported = ctx.wait_terminal(api, quiet.json()["run_id"])["usage"]
    ctx.expect("tokens the provider did not report are null in usage, the reported ones counted",
               unreported.get("output_tokens", 0) is None and unreported.get("input_tokens") == 20,
               str(unreported), "R-Q34-2")
    roles = ctx.sql("SELECT DISTINCT committed_by FROM run_checkpoints")
    ctx.expect("the worker committed its checkpoints under its restricted role",
               roles == [("qimpl_worker",)], str(roles), "R-AUTH-4")
    calls = _provider_calls(ctx, receipt["run_id"])
    ctx.expect("each step asked of the synthetic provider, loaded into the real worker by "
               "configuration, once", calls == Counter(range(1, STEPS + 1)),
               dict(sorted(calls.items())).__repr__(), "R-EXEC-3", "R-Q-3")
    fields = {"run_id", "agent_id", "state", "durability", "lifecycle_version", "row_version",
              "generation", "deadline_at", "accepted_at", "started_at", "completed_at", "result_json",
              "error_code", "error_message", "usage"}
    # Each field's value against the record as committed (the run is terminal: it no longer
    # changes), times to the microsecond.
    cols = ("agent_id", "state", "durability", "lifecycle_version", "row_version", "generation",
            "error_code", "error_message", "result_json")
    times = ("deadline_at", "accepted_at", "started_at", "completed_at")
    record = ctx.sql(f"SELECT {', '.join(cols)}, "
                     + ", ".join(f"extract(epoch FROM {t})::float8" for t in times)
                     + " FROM runs WHERE run_id = %s", receipt["run_id"])
    held = dict(zip(cols + times, record[0], strict=True)) if record else {}

    def _epoch(value: object) -> float | None:
        return None if value is None else datetime.fromisoformat(str(value)).timestamp()

    differs = {k: (run.get(k), held.get(k)) for k in cols if run.get(k) != held.get(k)}
    differs |= {k: (run.get(k), held.get(k)) for k in times
                if k not in run or held.get(k) is None or _epoch(run[k]) is None
                or abs(float(_epoch(run[k]) or 0) - float(held[k])) > 1e-3}
    ctx.expect("the read answers the run record's fields, for its run",
               fields <= set(run) and run["run_id"] == receipt["run_id"]
               and run["generation"] == 1 and run["lifecycle_version"] == 2 and bool(held) and not differs,
               f"missing {sorted(fields - set(run))}; differs from the record {differs}", "R-READ-1")


@scenario(
    "worker-killed-mid-activity",
    title="SIGKILL the worker at a barrier after checkpoint k; a fresh worker finishes the run",
    requirements=("R-EXEC-2", "R-EXEC-3", "R-EXEC-4", "R-Q-2", "R-Q-3"),
    faults=("sigkill worker at barrier after checkpoint k",),
)
def worker_killed_mid_activity(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    worker = ctx.processes.worker("worker-1")
    k = ctx.rng.randint(1, STEPS - 2)  # after checkpoint k, before step k+1 completes
    ctx.figures["last_checkpoint_before_kill"] = k
    resp = ctx.create_run(api, prompt=make_prompt(
        steps=STEPS, answer="survived", barrier={"step": k + 1, "name": "strike"}))
    if resp is None or resp.status_code != 202:
        raise HarnessError(f"create failed: {resp and resp.status_code}")
    run_id = resp.json()["run_id"]
    held = ctx.wait_barrier("strike")
    if held["pid"] != worker.pid or held["step"] != k + 1:
        raise HarnessError(f"barrier held by an unexpected process or step: {held}")
    ctx.nemesis.sigkill(worker, barrier="strike", step=held["step"], attempt=held["attempt"],
                        run_id=run_id)
    killed_at = time.monotonic()
    ctx.processes.worker("worker-2")
    run = ctx.wait_terminal(api, run_id, timeout_s=45)
    ctx.figures["takeover_and_finish_s"] = round(time.monotonic() - killed_at, 3)
    ctx.expect("run completed after the kill", run["state"] == "completed", run["state"], "R-EXEC-4")
    ctx.expect("result_json holds the scripted answer", run["result_json"] == {"answer": "survived"},
               json.dumps(run["result_json"]), "R-READ-2")
    calls = _provider_calls(ctx, run_id)
    repeated = {s: n for s, n in calls.items() if s <= k and n != 1}
    ctx.expect("provider not asked again for any step checkpointed before the kill",
               not repeated,
               f"killed at the barrier of step {k + 1}; calls per step: {dict(sorted(calls.items()))}",
               "R-EXEC-4")
    ctx.expect("every step asked at least once", set(calls) == set(range(1, STEPS + 1)),
               f"steps asked: {sorted(calls)}", "R-EXEC-3")


DELTA_STEPS = 30
#: The churning run's kill: past step 16, the first whose delta unsets a key (the first
#: states are stored whole, while smaller than their delta), so the restore folds both a
#: `set` and an `unset` on every seed.
CHURN_STRIKE = 20


@scenario(
    "checkpoint-deltas",
    title="A 30-step run whose state grows every step stores each checkpoint after the first "
          "as its delta (a few bytes, not the whole state); the worker SIGKILLed mid-run, a "
          "fresh one folds the chain back and every step is handed exactly the state its "
          "predecessor checkpointed",
    requirements=("R-EXEC-3", "R-EXEC-4", "R-Q-2"),
    faults=("sigkill worker at a barrier in the middle of a delta chain",),
)
def checkpoint_deltas(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    worker = ctx.processes.worker("worker-1")
    # Past the first few whole states (those of the shortest trails), so the restore folds
    # several deltas.
    k = ctx.rng.randint(12, DELTA_STEPS - 5)
    resp = ctx.create_run(api, prompt=make_prompt(
        steps=DELTA_STEPS, answer="folded", barrier={"step": k + 1, "name": "strike"}))
    if resp is None or resp.status_code != 202:
        raise HarnessError(f"create failed: {resp and resp.status_code}")
    run_id = resp.json()["run_id"]
    # A second run whose state also replaces a counter and adds or drops a key every step:
    # its deltas set and unset, and the fold after the kill must undo neither (the generic
    # check compares each step's state, whole, with the checkpoints folded).
    churned = ctx.create_run(api, prompt=make_prompt(
        steps=DELTA_STEPS, answer="churned", churn=True, barrier={"step": CHURN_STRIKE, "name": "strike-churn"}))
    if churned is None or churned.status_code != 202:
        raise HarnessError(f"create failed: {churned and churned.status_code}")
    churn_id = churned.json()["run_id"]
    held = ctx.wait_barrier("strike")
    ctx.wait_barrier("strike-churn")
    ctx.nemesis.sigkill(worker, barrier="strike", step=held["step"], attempt=held["attempt"],
                        run_id=run_id)
    ctx.processes.worker("worker-2")
    run = ctx.wait_terminal(api, run_id, timeout_s=60)
    ctx.expect("run completed after the kill", run["state"] == "completed", run["state"], "R-EXEC-4")
    churn = ctx.wait_terminal(api, churn_id, timeout_s=60)
    ops = {op for (delta,) in ctx.sql("SELECT state_delta FROM run_checkpoints WHERE run_id = %s"
                                      " AND state_delta IS NOT NULL", churn_id) for op in delta}
    from qualify.scenarios.lifecycle import provider_calls

    restored = [c for c in provider_calls(ctx, churn_id) if c["attempt"] > 1]
    ctx.expect("the churning run completed after the kill, its deltas setting and unsetting keys, "
               "and a later attempt handed the folded state",
               churn["state"] == "completed" and {"set", "unset", "append"} <= ops and bool(restored),
               f"{churn['state']}; delta ops {sorted(ops)}; {len(restored)} calls after the kill", "R-EXEC-3",
               "R-EXEC-4")
    rows = ctx.sql("SELECT step, state_json IS NOT NULL, pg_column_size(COALESCE(state_json, state_delta)),"
                   " state_delta FROM run_checkpoints WHERE run_id = %s ORDER BY step", run_id)
    whole = [step for step, is_whole, _, _ in rows if is_whole]
    # A delta is stored once it is smaller than the state: here from the step where the
    # trail outgrows ``{"append": {"trail": [k]}}`` on.
    ctx.expect("the whole state is stored only while it is smaller than its delta (the first "
               "steps); every later checkpoint holds its delta",
               len(rows) == DELTA_STEPS and whole == list(range(1, len(whole) + 1))
               and 1 <= len(whole) <= 10, f"whole at steps {whole} of {len(rows)}", "R-EXEC-3",
               judged=len(rows))
    deltas = [(step, delta) for step, is_whole, _, delta in rows if not is_whole]
    ctx.expect("each delta appends its own step to the trail",
               bool(deltas) and all(d == {"append": {"trail": [step]}} for step, d in deltas),
               json.dumps(deltas[:3]), "R-EXEC-3", judged=len(deltas))
    sizes = [size for _, _, size, _ in rows]
    if_whole = [size for (size,) in ctx.sql(
        "SELECT pg_column_size(jsonb_build_object('trail', to_jsonb(ARRAY(SELECT generate_series(1, s)))))"
        " FROM generate_series(1, %s) s ORDER BY s", DELTA_STEPS)]
    ctx.figures["stored_state_bytes"] = sum(sizes)
    ctx.figures["stored_state_bytes_if_whole"] = sum(if_whole)
    ctx.expect("storage is linear in steps: no checkpoint row is larger than the largest delta "
               "or the first whole states, while whole states would grow every step",
               max(sizes) <= max(max((s for _, w, s, _ in rows if not w), default=0), max(sizes[:len(whole)], default=0))
               and sum(sizes) * 2 < sum(if_whole),
               f"bytes per step: {sizes}; whole states would be {if_whole}", "R-EXEC-3",
               judged=len(sizes))
