"""The reconciler, tenant slots and operator signals under faults (R-OPS-3..6, R-EXEC-8..9)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from qimpl.lifecycle import workflow_id
from qualify import http
from qualify.checkers import slot_holders
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import API_KEY, ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted, every_run_completed, provider_calls
from qualify.scenarios.sweeps import (
    AFTER_ACCEPT,
    OPERATOR_KEY,
    RECONCILE,
    TENANT,
    poll_until,
    sweep_rows,
    sweep_rows_between,
    unreachable_temporal,
)
from qualify.scenarios.tools import resume as empty_resume
from qualify.schedule import SKEW_S


def _accepted_then_api_dies(ctx: ScenarioContext) -> str:
    """Create a run on an API that dies right after the acceptance commit; the client never
    retries. Returns the run id (from the crash point's evidence)."""
    evidence = ctx.create_on_dying_api(AFTER_ACCEPT, name="api-doomed",
                                       prompt=make_prompt(steps=2, answer="reconciled"))
    return str(evidence["context"]["run_id"])


@scenario(
    "reconciler-dispatches-orphan",
    exec_because="the reconciler inside the worker's entry point, after the API's entry point was SIGKILLed",
    title="SIGKILL the API after the acceptance commit, the client never retries: the "
          "reconciler dispatches the run within two sweeps; one workflow; it completes",
    requirements=("R-OPS-3", "R-CREATE-4", "R-CREATE-5", "R-Q-4"),
    faults=(f"sigkill at {AFTER_ACCEPT}",),
    crash_points=(AFTER_ACCEPT,),
)
def reconciler_dispatches_orphan(ctx: ScenarioContext) -> None:
    # The reconciler sweeps before the run exists, every half second: a sweep that ignored
    # the grace period would dispatch the orphan well inside it.
    ctx.processes.worker("worker-1", **ORPHAN_RECONCILE)
    poll_until(ctx, "a first sweep", lambda: bool(sweep_rows(ctx)))
    run_id = _accepted_then_api_dies(ctx)
    api = ctx.processes.api("api-2")
    run = ctx.wait_terminal(api, run_id, timeout_s=30)
    ctx.expect("run completed", run["state"] == "completed", run["state"], "R-OPS-3")
    # Every time on the database's clock: the grace runs from the acceptance commit.
    requested, confirmed = ctx.sql(
        "SELECT extract(epoch FROM coalesce(dispatch_requested_at, accepted_at))::float8,"
        " extract(epoch FROM dispatch_confirmed_at)::float8 FROM runs WHERE run_id = %s", run_id)[0]
    grace_at = requested + ORPHAN_GRACE_S
    # The sweep that took the run as its candidate (its query compares the acceptance with
    # the database's clock minus the grace) must be one of the first two sweeps to end after
    # the grace, and the only one: judged by the sweeps' own rows, whichever of the sweep and
    # the worker's claim then recorded the confirmation first. A sweep that started just
    # before the grace may still take it (its query ran after): a sweep is placed by its end.
    rows = sorted(sweep_rows_between(ctx, 0.0), key=lambda s: s[5])
    took = [s for s in rows if s[1]]
    ended_after = [s for s in rows if s[5] >= grace_at]
    ctx.expect("dispatched by the reconciler after the grace period, within two sweeps of it",
               confirmed is not None and confirmed >= grace_at and len(took) == 1 and took[0] in ended_after[:2],
               f"confirmed {(confirmed or 0) - requested:.2f} s after acceptance (grace {ORPHAN_GRACE_S} s); "
               f"sweeps with a candidate: {len(took)}, the one ending "
               f"{(took[0][5] - grace_at) if took else float('nan'):.2f} s after the grace, "
               f"number {ended_after.index(took[0]) + 1 if took and took[0] in ended_after else 0} to end after it",
               "R-OPS-3")
    result = ctx.workflow_result(workflow_id(run_id, 1))
    ctx.expect("exactly one workflow, generation 1", result.get("state") == "completed"
               and run["generation"] == 1,
               f"workflow g1: {result.get('state')}; run generation {run['generation']}", "R-CREATE-5")


SWEEP_DISPATCH = "reconciler.after_dispatch"
SWEEP_BEFORE_DISPATCH = "reconciler.before_dispatch"
#: Grace 2 s, a sweep every half second: dispatched 2-2.5 s after acceptance, never sooner.
ORPHAN_GRACE_S = 2.0
ORPHAN_RECONCILE = {**RECONCILE, "QIMPL_RECONCILE_INTERVAL_S": "0.5",
                    "QIMPL_RECONCILE_GRACE_S": str(ORPHAN_GRACE_S)}


@scenario(
    "late-sweep-after-the-run-finished",
    title="A sweep reads an orphaned run (its API SIGKILLed after the acceptance commit) and is "
          "held before it starts the run's workflow; meanwhile the client's empty resume "
          "dispatches it and it completes; released, the sweep's start of the same workflow "
          "id is refused as a duplicate: one execution, and the finished run is left as it was",
    requirements=("R-CREATE-5", "R-OPS-3", "R-RESUME-2", "R-Q-4"),
    faults=(f"sigkill at {AFTER_ACCEPT}",),
    crash_points=(AFTER_ACCEPT, SWEEP_BEFORE_DISPATCH),
)
def late_sweep_after_the_run_finished(ctx: ScenarioContext) -> None:
    run_id = _accepted_then_api_dies(ctx)
    reconciler = ctx.processes.worker("worker-1", QIMPL_CRASH_POINTS=f"{SWEEP_BEFORE_DISPATCH}:hold",
                                      **RECONCILE)
    held = ctx.wait_crash_point(SWEEP_BEFORE_DISPATCH, reconciler, timeout_s=30)
    ctx.expect("the sweep read the orphan and holds before starting its workflow",
               held["context"]["run_id"] == run_id, str(held["context"]), "R-Q-4")
    api = ctx.processes.api("api-2")
    resume = empty_resume(ctx, api, run_id)
    ctx.expect("the client's empty resume dispatches the accepted run: 202 queued",
               resume.status_code == 202 and resume.json().get("state") == "queued",
               f"{resume.status_code} {resume.text[:200]}", "R-RESUME-2")
    run = ctx.wait_terminal(api, run_id, timeout_s=30)
    first = ctx.workflow_result(workflow_id(run_id, 1))  # closed: a reuse policy would now allow a start
    version = ctx.sql("SELECT row_version FROM runs WHERE run_id = %s", run_id)[0][0]
    released_at = ctx.db_now()
    ctx.release_crash_point(SWEEP_BEFORE_DISPATCH)
    poll_until(ctx, "the held sweep finished", lambda: bool(
        [s for s in sweep_rows_between(ctx, 0) if s[6] < released_at <= s[5]]))
    executions = ctx.workflow_executions(workflow_id(run_id, 1))
    after = ctx.sql("SELECT state, row_version, generation FROM runs WHERE run_id = %s", run_id)[0]
    ctx.expect("the late start of the finished run's workflow id was refused: one execution",
               executions == 1 and first.get("state") == "completed",
               f"{executions} executions of generation 1; the first closed {first.get('state')}", "R-CREATE-5")
    ctx.expect("the finished run was left as it was",
               run["state"] == "completed" and after == ("completed", version, 1),
               f"{run['state']} v{version}, after the sweep {after}", "R-OPS-3")


@scenario(
    "postgres-restarted-mid-sweep",
    title="The reconciler dispatches an orphaned run (its API SIGKILLed after the acceptance "
          "commit); PostgreSQL restarts while that sweep holds between Temporal's start and "
          "the confirming commit: a later sweep or the owner confirms it, one workflow, the "
          "run completes",
    requirements=("R-OPS-3", "R-CREATE-5", "R-Q-4"),
    faults=(f"sigkill at {AFTER_ACCEPT}", f"PostgreSQL restart at {SWEEP_DISPATCH}"),
    crash_points=(AFTER_ACCEPT, SWEEP_DISPATCH),
    needs_platform=True,
)
def postgres_restarted_mid_sweep(ctx: ScenarioContext) -> None:
    run_id = _accepted_then_api_dies(ctx)
    reconciler = ctx.processes.worker("worker-1", QIMPL_CRASH_POINTS=f"{SWEEP_DISPATCH}:hold", **RECONCILE)
    held = ctx.wait_crash_point(SWEEP_DISPATCH, reconciler, timeout_s=30)
    ctx.expect("the sweep started the orphan's workflow and holds before confirming it",
               held["context"]["run_id"] == run_id and held["context"]["started"] == "started",
               str(held["context"]), "R-OPS-3")
    # The order of the sweep's two steps, read while it holds between them: Temporal's start
    # first, the confirming commit only after it (a confirmation before the start would mark
    # as dispatched a run whose start could still fail).
    early = ctx.sql("SELECT dispatch_confirmed_at IS NOT NULL FROM runs WHERE run_id = %s", run_id)
    ctx.expect("the run was not yet confirmed while the sweep held after Temporal's start",
               bool(early) and early[0][0] is False, f"confirmed then: {early}", "R-OPS-3", "R-CREATE-5")
    ctx.nemesis.restart_postgres(ctx.stack)
    ctx.release_crash_point(SWEEP_DISPATCH)
    api = ctx.processes.api("api-2")
    run = ctx.wait_terminal(api, run_id, timeout_s=60)
    ctx.expect("run completed", run["state"] == "completed", run["state"], "R-OPS-3")
    confirmed = ctx.sql("SELECT dispatch_confirmed_at IS NOT NULL FROM runs WHERE run_id = %s", run_id)[0][0]
    result = ctx.workflow_result(workflow_id(run_id, 1))
    ctx.expect("its dispatch confirmed; exactly one workflow, generation 1",
               confirmed and result.get("state") == "completed" and run["generation"] == 1,
               f"confirmed {confirmed}; workflow g1: {result.get('state')}; generation {run['generation']}",
               "R-CREATE-5")


def _cancel_requested(ctx: ScenarioContext, wf_id: str) -> bool:
    """Whether ``wf_id``'s history holds a cancel request (Temporal's own record)."""
    from temporalio.api.enums.v1 import EventType

    async def look(client: Any) -> bool:
        async for event in client.get_workflow_handle(wf_id).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
                return True
        return False

    requested: bool = ctx.temporal(look)
    return requested


@scenario(
    "expiry-without-worker",
    title="No worker at all, deadline 2 s: the one-shot sweep expires the run; a worker "
          "started afterwards makes no provider call for it",
    requirements=("R-EXEC-8", "R-OPS-3", "R-OPS-4"),
)
def expiry_without_worker(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    # 2 s: nothing but the create must happen before the deadline (the API's least is 1 s;
    # one more keeps a create slowed by a loaded machine clear of it).
    run_id = accepted(ctx, api, prompt=make_prompt(steps=2), deadline_seconds=2)
    deadline = ctx.read_run(api, run_id)["deadline_at"]
    poll_until(ctx, "deadline", lambda: ctx.sql("SELECT clock_timestamp() > %s::timestamptz", deadline)[0][0],
          timeout_s=15, kind="wait_deadline")
    sweep = subprocess.run([sys.executable, "-m", "qimpl.scripts.agent_runs", "--tenant", TENANT],
                           env=ctx.deployment.env(), capture_output=True, text=True, timeout=60)
    ctx.history.record("operator", op="sweep", exit_code=sweep.returncode, stdout=sweep.stdout[-500:])
    report = json.loads(sweep.stdout.splitlines()[-1]) if sweep.returncode == 0 else {}
    ctx.expect("one-shot sweep exits 0 and reports one expiry",
               sweep.returncode == 0 and report.get("expired") == 1,
               f"exit {sweep.returncode}: {sweep.stdout.strip()[-200:]} {sweep.stderr.strip()[-200:]}",
               "R-OPS-4")
    run = ctx.read_run(api, run_id)
    ctx.expect("run expired by the sweep", run["state"] == "expired"
               and run["error_code"] == "deadline_exceeded", run["state"], "R-EXEC-8")
    # Before any worker runs: the sweep itself asked Temporal to cancel the run's workflow
    # (its history says so), so the worker started next closes it without running it.
    asked = _cancel_requested(ctx, workflow_id(run_id, 1))
    ctx.expect("the sweep asked Temporal to cancel the expired run's workflow (before any worker ran)",
               asked, "a cancel request in the workflow's history" if asked else "no cancel request",
               "R-OPS-3", "R-OPS-4")
    ctx.processes.worker()
    status, _ = ctx.workflow_outcome(workflow_id(run_id, 1))
    ctx.expect("its workflow is closed", status != "running", f"workflow {status}")
    ctx.expect("no provider call for the expired run", provider_calls(ctx, run_id) == [],
               str(len(provider_calls(ctx, run_id))), "R-EXEC-8")


@scenario(
    "parked-runs-expire",
    title=f"Runs parked in awaiting_input and awaiting_approval past their deadline expire "
          f"within a sweep, on the database's clock, though the reconciler's own clock is "
          f"{SKEW_S} s ahead (never before the deadline); a resume afterwards answers 409, a "
          "cancel cancelled: false",
    requirements=("R-EXEC-8", "R-OPS-3", "R-READ-2", "R-RESUME-2", "R-CANCEL-1", "R-Q-10"),
    faults=(f"reconciler clock skewed +{SKEW_S} s",),
)
def parked_runs_expire(ctx: ScenarioContext) -> None:
    from qualify.processes import faketime_env
    from qualify.scenarios.deadline import _skewed_owner

    api = ctx.processes.api()
    # The only reconciler runs SKEW_S ahead: an expiry judged on its own clock would end
    # both runs at its first sweep, seconds before their deadlines (the check below refuses
    # a negative delay).
    worker = ctx.processes.worker("worker-1", **RECONCILE, **faketime_env(SKEW_S))
    waiting = accepted(ctx, api, prompt=make_prompt(steps=3, park={"step": 1, "kind": "input"},
                                                    barrier={"step": 1, "name": "skewed"}),
                       deadline_seconds=4)
    _skewed_owner(ctx, worker, "skewed", waiting, SKEW_S)
    approving = accepted(ctx, api, prompt=make_prompt(steps=3, park={"step": 2, "kind": "approval"}),
                         deadline_seconds=4)
    poll_until(ctx, "both parked", lambda: {ctx.read_run(api, waiting)["state"],
                                       ctx.read_run(api, approving)["state"]}
          == {"awaiting_input", "awaiting_approval"})
    parked = ctx.read_run(api, approving)
    ctx.expect("pending_approval carries approval_id, action_version, tool, arguments",
               set((parked["result_json"] or {}).get("pending_approval", {}))
               >= {"approval_id", "action_version", "tool", "arguments"},
               json.dumps(parked["result_json"]), "R-READ-2")
    interval = float(RECONCILE["QIMPL_RECONCILE_INTERVAL_S"])
    for run_id in (waiting, approving):
        run = ctx.wait_terminal(api, run_id, timeout_s=20)
        late = ctx.sql("SELECT extract(epoch FROM t.at - r.deadline_at)::float8 FROM runs r JOIN run_transitions t"
                       " USING (run_id) WHERE r.run_id = %s AND t.new_state = 'expired'", run_id)
        took = late[0][0] if late else None
        # Within a sweep: the next one after the deadline, on the database's clock (a sweep
        # waits the interval after the previous one ended; 2.5 s for the sweep itself, its
        # Temporal and pruning calls included, on a loaded machine).
        ctx.expect(f"{'input' if run_id == waiting else 'approval'} run expired within a sweep of its "
                   "deadline (the interval + 2.5 s)",
                   run["state"] == "expired" and took is not None and 0 <= took <= interval + 2.5,
                   f"{run['state']} {took} s after the deadline (sweep every {interval:g} s)", "R-EXEC-8")
    gone = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{waiting}/cancel",
                     headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    ctx.expect("a cancel of the expired run answers cancelled: false and leaves it expired",
               gone.status_code == 200 and gone.json().get("cancelled") is False
               and ctx.read_run(api, waiting)["state"] == "expired", gone.text[:120], "R-CANCEL-1")
    resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{waiting}/resume",
                      headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": "late"},
                      json={"additional_prompt": "too late"}, timeout=10)
    ctx.history.record("client", op="resume", phase="fail", run_id=waiting, status=resp.status_code)
    ctx.expect("resume after expiry answers 409 run_terminal",
               resp.status_code == 409 and resp.json().get("code") == "run_terminal",
               f"{resp.status_code} {resp.text[:120]}", "R-RESUME-2")
    # What the database refused: an expiry the skewed reconciler tried before the deadline
    # (its own clock) is refused by the transition guard, and counted as the sweep's error.
    sweeps = sweep_rows(ctx)
    ctx.expect("no sweep met an error (the guard refused no early expiry by the skewed reconciler)",
               bool(sweeps) and sum(s[4] for s in sweeps) == 0,
               f"{len(sweeps)} sweeps; errors {[s[4] for s in sweeps if s[4]]}", "R-EXEC-8", "R-OPS-3",
               judged=len(sweeps))


@scenario(
    "three-reconcilers",
    title="Three reconcilers at once over 250 overdue runs of one tenant: each run expired "
          "exactly once, at most 100 per sweep per reconciler",
    requirements=("R-OPS-3", "R-EXEC-8"),
)
def three_reconcilers(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    n = 250

    def create(i: int) -> str:
        return accepted(ctx, api, prompt=make_prompt(steps=1), deadline_seconds=1, key=f"overdue-{i}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        run_ids = list(pool.map(create, range(n)))
    idle_queue = {"QIMPL_TASK_QUEUE": f"{ctx.deployment.task_queue}-reconcile-only"}
    for i in range(3):
        ctx.processes.worker(f"reconciler-{i + 1}", **RECONCILE, **idle_queue)
    poll_until(ctx, "all expired", lambda: ctx.sql(
        "SELECT count(*) FROM runs WHERE state = 'expired'")[0][0] == n, timeout_s=60)
    # A sweep writes its row after its expiries commit, once it has also looked for runs to
    # confirm and vanished workflows and pruned event streams (``qimpl.reconciler.sweep_tenant``):
    # the last sweep's row trails the last expiry's commit, by seconds on a loaded 2-core
    # machine (10 s was once not enough under `qualify run -n auto`). Wait (without raising)
    # for the rows to catch up; the wait returns as they do, and rows that never account
    # for every expiry fail the check below.
    try:
        poll_until(ctx, "sweep rows", lambda: sum(s[2] for s in sweep_rows(ctx)) >= n, timeout_s=30)
    except HarnessError:
        pass
    sweeps = sweep_rows(ctx)
    per_run = ctx.sql("SELECT count(*) FROM run_transitions WHERE new_state = 'expired'"
                      " GROUP BY run_id HAVING count(*) <> 1")
    ctx.expect("every run expired exactly once", len(run_ids) == n and not per_run,
               f"{len(per_run)} runs with != 1 expiry", "R-OPS-3")
    ctx.expect("at most 100 candidates per sweep per reconciler", max(s[1] for s in sweeps) <= 100,
               f"max {max(s[1] for s in sweeps)}", "R-OPS-3")
    ctx.expect("sweeps account for every expiry", sum(s[2] for s in sweeps) == n,
               f"{sum(s[2] for s in sweeps)} expired by sweeps")
    # Exactly once by the reconcilers' own locking (FOR UPDATE SKIP LOCKED), not by the
    # guard refusing the second writer: a refused expiry is a sweep's error.
    ctx.expect("no sweep met an error (among them a refused expiry: the reconcilers never contended "
               "for a run)",
               sum(s[4] for s in sweeps) == 0, f"errors {[s[4] for s in sweeps if s[4]]}", "R-OPS-3",
               judged=len(sweeps))
    ctx.figures["reconcilers_that_expired"] = len({s[0] for s in sweeps if s[2]})


@scenario(
    "tenant-slots",
    title="AGENT_CONCURRENCY_LIMIT=2 with six runs and a SIGKILLed owner in the middle: never "
          "more than two slot holders, and all six finish",
    requirements=("R-EXEC-9", "R-Q-2"),
    faults=("sigkill owner at barrier",),
)
def tenant_slots(ctx: ScenarioContext) -> None:
    limit = {"AGENT_CONCURRENCY_LIMIT": "2"}
    api = ctx.processes.api()
    workers = [ctx.processes.worker("worker-1", **limit), ctx.processes.worker("worker-2", **limit)]
    run_ids = [accepted(ctx, api, prompt=make_prompt(
        steps=3, delay_ms=150, **({"barrier": {"step": 2, "name": "slot"}} if i == 2 else {})))
        for i in range(6)]
    held = ctx.wait_barrier("slot")
    owner = next(w for w in workers if w.alive and w.pid == held["pid"])
    ctx.nemesis.sigkill(owner, barrier="slot", attempt=held["attempt"])
    ctx.processes.worker("worker-3", **limit)
    every_run_completed(ctx, api, run_ids)
    from qualify.collect import database_events

    most = slot_holders(database_events(ctx.deployment.dsn))
    ctx.expect("never more than 2 slot holders", most <= 2, f"max {most}", "R-EXEC-9", judged=len(run_ids))
    ctx.expect("the limit was reached (the check is not vacuous)", most == 2, f"max {most}", "R-EXEC-9")


def _oldest_accepted_age(api: ManagedProcess) -> float:
    text = http.get(f"{api.base_url}/metrics", timeout=10,  # an operator key (R-OPS-7)
                     headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).text
    found = re.search(rf'qimpl_oldest_accepted_run_age_seconds{{tenant="{TENANT}"}} ([0-9.e+-]+)', text)
    return float(found.group(1)) if found else 0.0


@scenario(
    "oldest-accepted-metric",
    title="Worker down: the oldest-accepted-age metric grows; it falls back once the worker "
          "(and its reconciler) returns",
    requirements=("R-OPS-6", "R-OPS-3"),
    faults=(f"sigkill at {AFTER_ACCEPT}",),
)
def oldest_accepted_metric(ctx: ScenarioContext) -> None:
    api = ctx.processes.api("api-2")
    # An older run that is queued (dispatched, no worker yet), not accepted: not counted.
    queued = ctx.create_run(api, prompt=make_prompt(steps=2, answer="queued first"))
    if queued is None or queued.status_code != 202 or queued.json().get("state") != "queued":
        raise HarnessError(f"the queued run was not created: {queued and queued.text[:200]}")
    run_id = _accepted_then_api_dies(ctx)
    # A younger accepted run (its dispatch unknown): the metric is the oldest's age, not its.
    cut = ctx.processes.api("api-no-temporal", **unreachable_temporal())
    younger = ctx.create_run(cut, prompt=make_prompt(steps=2, answer="accepted later"))
    receipt = (younger.json().get("receipt") or {}) if younger is not None else {}
    if younger is None or younger.status_code != 503 or receipt.get("state") != "accepted":
        raise HarnessError(f"the younger run was not left accepted: {younger and younger.text[:200]}")
    first = _oldest_accepted_age(api)
    poll_until(ctx, "the age to grow", lambda: _oldest_accepted_age(api) > first + 0.5, timeout_s=10)
    grown = _oldest_accepted_age(api)
    ctx.expect("the metric grows while no worker runs", grown > first > 0, f"{first:.2f} -> {grown:.2f}",
               "R-OPS-6")
    # The value, by the database's clock: the scrape's own clock_timestamp() lies between two
    # reads of it, so the age lies between them minus the oldest accepted run's acceptance.
    accepted_at = float(ctx.sql("SELECT extract(epoch FROM accepted_at)::float8 FROM runs WHERE run_id = %s",
                                run_id)[0][0])
    before = ctx.db_now()
    age = _oldest_accepted_age(api)
    after = ctx.db_now()
    ctx.expect("the metric is the age of the oldest accepted run by the database's clock (not an older "
               "queued run's, not a younger accepted run's)",
               before - accepted_at - 0.01 <= age <= after - accepted_at + 0.01,
               f"{age:.3f} s; the oldest accepted run's age {before - accepted_at:.3f}.."
               f"{after - accepted_at:.3f} s", "R-OPS-6")
    ctx.processes.worker("worker-1", **RECONCILE)
    for run in (run_id, str(receipt["run_id"]), queued.json()["run_id"]):
        ctx.wait_terminal(api, run, timeout_s=30)
    ctx.expect("the metric falls back to 0 after the worker returns", _oldest_accepted_age(api) == 0.0,
               str(_oldest_accepted_age(api)), "R-OPS-6")
