"""Dispatch confirmation under faults: vanished workflows, slow confirmations, the grace
period after a resume, slot waits and no lock held over Temporal (R-OPS-8, R-OPS-3).

About 430 lines: five scenarios of one mechanism (confirming a dispatch) and the helpers
only they use; the reconciler's shared settings and sweep reads are in ``sweeps``."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from qimpl.lifecycle import workflow_id
from qualify import http
from qualify.checkers import slot_holders
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.procs import free_port, poll
from qualify.scenarios.approvals import _decide, _side_effects
from qualify.scenarios.base import (
    API_KEY,
    TERMINAL,
    ScenarioContext,
    json_object,
    outcome,
    scenario,
)
from qualify.scenarios.lifecycle import accepted, provider_calls
from qualify.scenarios.receipts import receipt_against_the_run
from qualify.scenarios.sweeps import (
    FAST_RECONCILE,
    RECONCILE,
    TENANT,
    poll_until,
    sweep_rows,
    sweep_rows_between,
    unreachable_temporal,
)

AFTER_DISPATCH = "api.after_dispatch"
#: What a trace or an exception text looks like in an error message (R-EXEC-6).
_TRACE_TEXT = re.compile(r'Traceback|File "|\b\w+(Error|Exception)\b|agent-run-|\n')


def _settled(ctx: ScenarioContext, api: ManagedProcess, run_id: str, timeout_s: float) -> dict[str, Any]:
    """The run once terminal, or as it is after ``timeout_s`` (never raises for a slow run:
    the caller's check says what was expected)."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = ctx.read_run(api, run_id)
        if doc["state"] in TERMINAL or time.monotonic() > deadline:
            ctx.history.record("client", op="read", phase="ok" if doc["state"] in TERMINAL else "info",
                               run_id=run_id, state=doc["state"], row_version=doc["row_version"])
            return doc
        time.sleep(0.05)


def _receipt_is_the_runs(ctx: ScenarioContext, run_id: str, receipt: dict[str, Any], state: str) -> None:
    """Check that a resume's receipt (of its 202, or inside its 503) is the run's own as the
    database holds it (run, stream key, deadline_at: a resume keeps them, R-RESUME-1) and
    says ``state``; asserted once per answer, one check."""
    rows = ctx.sql("SELECT run_id::text, stream_key, extract(epoch FROM deadline_at)::float8 FROM runs"
                   " WHERE run_id = %s", run_id)
    row = dict(zip(("run_id", "stream_key", "deadline_t"), rows[0], strict=True)) if rows else {}
    differ = receipt_against_the_run(receipt, row) if receipt and row else {"receipt": "missing"}
    ctx.expect("each resume answer carries the run's own receipt (run, stream key, deadline_at) "
               "and its state", not differ and receipt.get("state") == state,
               f"differs {differ}; state {receipt.get('state')}, want {state}", "R-RESUME-1", "R-CREATE-5")


def _transitions(ctx: ScenarioContext, run_id: str) -> list[tuple[Any, ...]]:
    """``(old_state, new_state, generation)`` of each transition of the run, in commit order."""
    return ctx.sql("SELECT old_state, new_state, generation FROM run_transitions WHERE run_id = %s"
                   " ORDER BY id", run_id)


def _resume(ctx: ScenarioContext, api: ManagedProcess, run_id: str, key: str,
            body: dict[str, Any] | None, timeout_s: float = 30.0) -> httpx.Response:
    """POST a resume (``body`` None: no body at all, R-RESUME-2's dispatch retry)."""
    ctx.history.record("client", op="resume", phase="invoke", run_id=run_id, key=key, process=api.name)
    resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": key},
                      timeout=timeout_s)
    ctx.history.record("client", op="resume", phase="ok" if resp.status_code == 202 else "fail",
                       run_id=run_id, key=key, status=resp.status_code,
                       code=_code(resp))
    return resp


def _code(resp: httpx.Response) -> Any:
    try:
        doc = resp.json()
    except ValueError:
        return None
    return doc.get("code") if isinstance(doc, dict) else None


def _warnings(port: int, kind: str) -> float:
    """``qimpl_reconcile_warnings_total{tenant, kind}`` on a worker's Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = http.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "qimpl_reconcile_warnings_total"
               and s.labels.get("kind") == kind and s.labels.get("tenant") == TENANT)


@scenario(
    "vanished-workflow",
    title="Workflows terminated behind the runs' backs: an accepted run whose workflow closed "
          "is not confirmed by \"already started\" but failed workflow_vanished; a running one "
          "is failed workflow_vanished with a fixed message and its tenant slot goes to the next "
          "run; one whose workflow the store lost ends the same way; the worker counts the warnings",
    requirements=("R-OPS-8", "R-OPS-3", "R-EXEC-9", "R-OPS-6", "R-CREATE-5"),
    faults=(f"sigkill at {AFTER_DISPATCH}", "terminate the accepted run's workflow",
            "terminate the running run's workflow", "delete the running run's workflow"),
    crash_points=(AFTER_DISPATCH,),
)
def vanished_workflow(ctx: ScenarioContext) -> None:
    # Part 1: Temporal accepted C's workflow, the API died before confirming it, and an
    # operator terminated the workflow before any worker ran it.
    evidence = ctx.create_on_dying_api(AFTER_DISPATCH, name="api-doomed",
                                       prompt=make_prompt(steps=2, answer="never"))
    closed_run = str(evidence["context"]["run_id"])
    ctx.nemesis.terminate_workflow(ctx.deployment.temporal_address, workflow_id(closed_run, 1),
                                   namespace=ctx.deployment.namespace, reason="operator: C")
    # Part 2: one slot, the reconciler and the worker's metrics endpoint.
    port = free_port()
    api = ctx.processes.api("api-1")
    ctx.processes.worker("worker-1", AGENT_CONCURRENCY_LIMIT="1", QIMPL_METRICS_PORT=str(port),
                         **RECONCILE)
    long_run = accepted(ctx, api, prompt=make_prompt(steps=60, delay_ms=1000))
    ctx.wait_state(api, long_run, "running", timeout_s=20)
    ctx.nemesis.terminate_workflow(ctx.deployment.temporal_address, workflow_id(long_run, 1),
                                   namespace=ctx.deployment.namespace, reason="operator: A")
    struck = time.monotonic()
    next_run = accepted(ctx, api, prompt=make_prompt(steps=2, answer="slot freed"))

    c = _settled(ctx, api, closed_run, timeout_s=20)
    a = _settled(ctx, api, long_run, timeout_s=max(1.0, 20 - (time.monotonic() - struck)))
    b = _settled(ctx, api, next_run, timeout_s=max(1.0, 20 - (time.monotonic() - struck)))
    c_path = _transitions(ctx, closed_run)
    c_confirmed = ctx.sql("SELECT dispatch_confirmed_at FROM runs WHERE run_id = %s", closed_run)[0][0]
    c_moves = ", ".join(f"{t[0] or 'none'}->{t[1]}" for t in c_path)
    ctx.expect("C (accepted, its workflow terminated) failed workflow_vanished",
               c["state"] == "failed" and c["error_code"] == "workflow_vanished",
               outcome(c), "R-OPS-8", "R-OPS-3")
    ctx.expect("C was never confirmed: \"already started\" of a closed workflow is no confirmation",
               [t[1] for t in c_path] == ["accepted", "failed"] and c_confirmed is None,
               f"transitions {c_moves}, dispatch_confirmed_at {c_confirmed or 'not set'}",
               "R-CREATE-5", "R-OPS-8")
    ctx.expect("A (running, its workflow terminated) failed workflow_vanished within 20 s",
               a["state"] == "failed" and a["error_code"] == "workflow_vanished",
               outcome(a), "R-OPS-8")
    message = a["error_message"] or ""
    ctx.expect("A's error message is fixed (the same as C's) and carries no trace text",
               bool(message) and message == c["error_message"] and not _TRACE_TEXT.search(message),
               repr(message)[:200], "R-OPS-8")
    ctx.expect("B completed within 20 s: A's tenant slot was freed",
               b["state"] == "completed", b["state"], "R-EXEC-9", "R-OPS-8")
    poll(lambda: _warnings(port, "workflow_vanished") >= 2, timeout_s=5)
    counted = _warnings(port, "workflow_vanished")
    ctx.expect("the worker counts >= 2 qimpl_reconcile_warnings_total{kind=\"workflow_vanished\"}",
               counted >= 2, f"{counted}", "R-OPS-6", "R-OPS-8")
    # Part 3: a running run whose workflow the Temporal store lost (deleted): missing, not
    # closed; it too ends workflow_vanished (not re-dispatched: see docs/operations.md).
    lost_run = accepted(ctx, api, prompt=make_prompt(steps=60, delay_ms=1000))
    ctx.wait_state(api, lost_run, "running", timeout_s=20)
    ctx.nemesis.delete_workflow(ctx.deployment.temporal_address, workflow_id(lost_run, 1),
                                namespace=ctx.deployment.namespace)
    d = _settled(ctx, api, lost_run, timeout_s=20)
    ctx.expect("D (running, its workflow lost by the store) failed workflow_vanished within 20 s",
               d["state"] == "failed" and d["error_code"] == "workflow_vanished",
               outcome(d), "R-OPS-8")
    lost_message = d["error_message"] or ""
    ctx.expect("D's error message is the same fixed one and carries no trace text",
               bool(lost_message) and lost_message == c["error_message"] and not _TRACE_TEXT.search(lost_message),
               repr(lost_message)[:200], "R-OPS-8")
    for run_id in (closed_run, long_run, next_run, lost_run):  # every run the scenario starts ends
        if ctx.read_run(api, run_id)["state"] not in TERMINAL:
            ctx.cancel_run(api, run_id)


@scenario(
    "slow-confirmation-names-its-generation",
    title="The creating API holds after Temporal accepted generation 1 while the run parks and "
          "is resumed (generation 2, dispatch unknown): the late confirmation of generation 1 "
          "leaves generation 2 accepted; an empty resume then dispatches it",
    requirements=("R-CREATE-5", "R-RESUME-1", "R-RESUME-2"),
    crash_points=(AFTER_DISPATCH,),
)
def slow_confirmation_names_its_generation(ctx: ScenarioContext) -> None:
    # The hold is not a nemesis fault (the process lives on); its evidence line is
    # collected as a struck crash point and checked below.
    api1 = ctx.processes.api("api-1", QIMPL_CRASH_POINTS=f"{AFTER_DISPATCH}:hold")
    api2 = ctx.processes.api("api-2", **unreachable_temporal())
    key = f"create-{ctx.rng.getrandbits(64):016x}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        creating = pool.submit(ctx.create_run, api1, key=key, timeout_s=60,
                               prompt=make_prompt(steps=3, answer="second generation",
                                                  park={"step": 1, "kind": "input"}))
        try:
            held = ctx.wait_crash_point(AFTER_DISPATCH, api1)
            run_id = str(held["context"]["run_id"])
            ctx.processes.worker("worker-1")
            ctx.wait_state(api2, run_id, "awaiting_input", timeout_s=30)
            resumed = _resume(ctx, api2, run_id, "resume-with-input", {"additional_prompt": "more"})
            ctx.expect("resume through an API without Temporal: 503 durable_dispatch_unknown",
                       resumed.status_code == 503 and _code(resumed) == "durable_dispatch_unknown",
                       f"{resumed.status_code} {resumed.text[:200]}", "R-RESUME-1")
            before = ctx.sql("SELECT state, generation FROM runs WHERE run_id = %s", run_id)
            ctx.expect("the run is accepted in generation 2", before == [("accepted", 2)], str(before),
                       "R-RESUME-1")
            _receipt_is_the_runs(ctx, run_id, (json_object(resumed).get("receipt") or {}), "accepted")
        finally:
            ctx.release_crash_point(AFTER_DISPATCH)
        created = creating.result(timeout=90)
    ctx.expect("the held create was api-1's dispatch of this run's generation 1",
               held["pid"] == api1.pid and held["action"] == "hold", json.dumps(held)[:200])
    ctx.expect("the held create answered once released",
               created is not None and created.status_code in (202, 503),
               f"{created and created.status_code} {created and created.text[:200]}", "R-CREATE-5")
    after = ctx.sql("SELECT state, generation, dispatch_confirmed_at FROM runs WHERE run_id = %s", run_id)
    ctx.expect("the late confirmation of generation 1 left generation 2 accepted and unconfirmed",
               after == [("accepted", 2, None)], str(after), "R-CREATE-5", "R-RESUME-1")
    retried = _resume(ctx, api1, run_id, "resume-empty", None)
    ctx.expect("an empty resume of the accepted run dispatches generation 2: 202 queued",
               retried.status_code == 202 and retried.json().get("state") == "queued",
               f"{retried.status_code} {retried.text[:200]}", "R-RESUME-2")
    _receipt_is_the_runs(ctx, run_id, json_object(retried), "queued")
    run = _settled(ctx, api1, run_id, timeout_s=30)
    ctx.expect("the run completed in generation 2", run["state"] == "completed" and run["generation"] == 2,
               f"{run['state']} g{run['generation']}", "R-RESUME-1", "R-RESUME-2")
    if run["state"] not in TERMINAL:
        ctx.cancel_run(api1, run_id)


#: reconciler-grace-after-resume: seconds between its reconciler's sweeps, and how long
#: before the grace's end (s, the database's clock) the held dispatch is released.
GRACE_SWEEP_S = 0.1
GRACE_MARGIN_S = 0.3


@scenario(
    "reconciler-grace-after-resume",
    title="A run resumed long after its acceptance, its dispatch held in the API until "
          f"{GRACE_MARGIN_S:g} s before the grace ends, the reconciler sweeping every "
          f"{GRACE_SWEEP_S:g} s: the grace runs from the generation's dispatch request, so it "
          "never dispatches the run itself",
    requirements=("R-OPS-3", "R-RESUME-1"),
    crash_points=(AFTER_DISPATCH,),
)
def reconciler_grace_after_resume(ctx: ScenarioContext) -> None:
    grace_s = float(FAST_RECONCILE["QIMPL_RECONCILE_GRACE_S"])
    api = ctx.processes.api("api-1")
    # Sweeps every 0.1 s: a grace shorter than the hold by more than that is caught by the
    # sweeps that fall in between (every 0.5 s, the hold's last 0.4 s met one sweep or none).
    ctx.processes.worker("worker-1", **{**FAST_RECONCILE, "QIMPL_RECONCILE_INTERVAL_S": str(GRACE_SWEEP_S)})
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="resumed",
                                                   park={"step": 1, "kind": "input"}))
    ctx.wait_state(api, run_id, "awaiting_input", timeout_s=30)
    poll_until(ctx, "the grace period to pass since acceptance", lambda: ctx.sql(
        "SELECT clock_timestamp() > accepted_at + make_interval(secs => %s) FROM runs WHERE run_id = %s",
        grace_s + 0.2, run_id)[0][0], timeout_s=15)
    # The held API hands generation 2 to a queue no worker polls yet: a worker claiming it
    # would confirm the dispatch itself within milliseconds, leaving the reconciler nothing
    # to race. worker-1 (and its reconciler) stays on the deployment's queue.
    later = f"{ctx.deployment.task_queue}-after-hold"
    holder = ctx.processes.api("api-hold", QIMPL_CRASH_POINTS=f"{AFTER_DISPATCH}:hold",
                               QIMPL_TASK_QUEUE=later)
    with ThreadPoolExecutor(max_workers=1) as pool:
        sent = ctx.db_now()
        resuming = pool.submit(_resume, ctx, holder, run_id, "resume-held", {"additional_prompt": "go on"}, 60)
        try:
            held = ctx.wait_crash_point(AFTER_DISPATCH, holder)
            stamped = float(ctx.sql("SELECT extract(epoch FROM dispatch_requested_at)::float8 FROM runs"
                                    " WHERE run_id = %s", run_id)[0][0])
            # The hold is timed from the resume's own dispatch request, and never from before
            # the resume was sent (a stale stamp is judged below, not trusted here).
            requested = max(stamped, sent)
            # Hold until GRACE_MARGIN_S before the grace ends (the database's clock): a
            # reconciler whose grace is shorter by more than a sweep's interval dispatches.
            poll(lambda: ctx.db_now() - requested >= grace_s - GRACE_MARGIN_S, timeout_s=grace_s,
                 interval_s=0.02)
            state = ctx.sql("SELECT state, generation, dispatch_confirmed_at FROM runs WHERE run_id = %s",
                            run_id)
        finally:
            released = ctx.db_now()
            ctx.release_crash_point(AFTER_DISPATCH)
        answer = resuming.result(timeout=60)
    during = sweep_rows_between(ctx, requested, released)
    accepted_at = float(ctx.sql("SELECT extract(epoch FROM accepted_at)::float8 FROM runs WHERE run_id = %s",
                                run_id)[0][0])
    ctx.expect("the resume stamped its generation's dispatch request (dispatch_requested_at) after it "
               "was sent: the reconciler's grace runs from it",
               stamped >= sent, f"stamped {stamped - sent:+.3f} s after the resume was sent", "R-OPS-3",
               "R-RESUME-1")
    ctx.expect("the held resume was api-hold's dispatch of this run",
               held["context"].get("run_id") == run_id and held["pid"] == holder.pid
               and held["action"] == "hold", json.dumps(held)[:200])
    ctx.expect("during the hold the run stayed accepted in generation 2, its dispatch unconfirmed",
               state == [("accepted", 2, None)], str(state), "R-OPS-3", "R-RESUME-1")
    ctx.expect(f"at least 3 sweeps ran during the hold, all more than {grace_s:.0f} s after acceptance "
               "and released before the grace after the resume ended",
               len(during) >= 3 and all(s[6] - accepted_at > grace_s for s in during)
               and released - requested < grace_s,
               f"{len(during)} sweeps in {released - requested:.2f} s; acceptance "
               f"{min((s[6] for s in during), default=accepted_at) - accepted_at:.2f} s before the first",
               "R-OPS-3")
    ctx.processes.worker("worker-2", QIMPL_TASK_QUEUE=later)
    run = _settled(ctx, api, run_id, timeout_s=30)
    ctx.expect("the resume answered 202 once released", answer.status_code == 202,
               f"{answer.status_code} {answer.text[:200]}", "R-RESUME-1")
    ctx.expect("the run completed in generation 2", run["state"] == "completed" and run["generation"] == 2,
               f"{run['state']} g{run['generation']}", "R-RESUME-1")
    dispatched = sum(s[3] for s in sweep_rows(ctx))
    ctx.expect("the reconciler dispatched nothing: its grace runs from the generation's dispatch "
               "request, not from acceptance", dispatched == 0,
               f"dispatched {dispatched} over {len(sweep_rows(ctx))} sweeps", "R-OPS-3")
    if run["state"] not in TERMINAL:
        ctx.cancel_run(api, run_id)


@scenario(
    "slot-wait-not-redispatched",
    title="One tenant slot: an approved run queued in its next generation (Temporal unreachable "
          "at approval) is dispatched once by the reconciler and then waits for the slot without "
          "being dispatched again every sweep; it completes once the slot frees",
    requirements=("R-EXEC-9", "R-OPS-3", "R-APPROVAL-1"),
)
def slot_wait_not_redispatched(ctx: ScenarioContext) -> None:
    from qualify.collect import database_events

    api = ctx.processes.api("api-1")
    # The sweeps run in a worker of their own, talking to Temporal through a gRPC proxy:
    # B's dispatches are then counted where Temporal receives them, not only by the
    # reconciler's own counters (a re-dispatch it did not count would pass those).
    proxy, via = ctx.temporal_proxy("reconciler-1<->temporal", grpc=True)
    ctx.processes.worker("worker-1", AGENT_CONCURRENCY_LIMIT="1")
    ctx.processes.worker("reconciler-1", AGENT_CONCURRENCY_LIMIT="1", **FAST_RECONCILE, **via,
                         QIMPL_TASK_QUEUE=f"{ctx.deployment.task_queue}-reconcile-only")
    approving = accepted(ctx, api, prompt=make_prompt(steps=3, answer="approved",
                                                      park={"step": 1, "kind": "approval"}))
    pending = (ctx.wait_state(api, approving, "awaiting_approval")["result_json"] or {})["pending_approval"]
    long_run = accepted(ctx, api, prompt=make_prompt(steps=60, delay_ms=1000))
    poll_until(ctx, "A waiting for the slot", lambda: ctx.read_run(api, long_run)["state"] == "queued"
          and len(provider_calls(ctx, long_run)) == 0, timeout_s=5)
    cut_off = ctx.processes.api("api-no-temporal", **unreachable_temporal())
    decided = _decide(cut_off, approving, pending["approval_id"], True, pending["action_version"])
    ctx.history.record("client", op="decide", phase="ok" if decided.status_code == 200 else "fail",
                       run_id=approving, status=decided.status_code)
    approved_at = ctx.db_now()
    ctx.expect("the approval is accepted: B queued in generation 2 (its dispatch failed)",
               decided.status_code == 200 and decided.json().get("state") == "queued"
               and decided.json().get("generation") == 2, decided.text[:200], "R-APPROVAL-1")
    ctx.wait_state(api, long_run, "running", timeout_s=10)
    poll_until(ctx, "the reconciler's first dispatch of B", lambda: any(
        s[1] for s in sweep_rows_between(ctx, approved_at)), timeout_s=15)
    first = min(s[5] for s in sweep_rows_between(ctx, approved_at) if s[1])
    poll_until(ctx, "6 more sweeps", lambda: len(sweep_rows_between(ctx, first + 1e-6)) >= 6, timeout_s=15)
    waiting = ctx.sql("SELECT state, generation FROM runs WHERE run_id = %s", approving)
    sweeps = sweep_rows(ctx)
    ctx.expect("B stayed queued in generation 2 while A held the slot", waiting == [("queued", 2)],
               str(waiting), "R-EXEC-9")
    # At most once: the worker's claim may record the confirmation before the reconciler's
    # compare-and-set does (then the reconciler counts none).
    ctx.expect("the reconciler counted B's dispatch at most once (sum of dispatched over all sweeps <= 1)",
               sum(s[3] for s in sweeps) <= 1,
               f"dispatched {[s[3] for s in sweeps if s[3]]} over {len(sweeps)} sweeps", "R-OPS-3")
    ctx.expect("B was a dispatch candidate in one sweep only, not again while it waited for the slot",
               sum(s[1] for s in sweeps) == 1,
               f"candidates {[s[1] for s in sweeps if s[1]]} over {len(sweeps)} sweeps", "R-OPS-3", "R-EXEC-9")
    wf = workflow_id(approving, 2).encode()
    starts = [c["t"] for c in list(proxy.calls) if c["method"] == "StartWorkflowExecution" and wf in c["request"]]
    ctx.expect("Temporal was asked to start B's generation-2 workflow once while B waited (counted at the "
               "reconciler's gRPC proxy)", len(starts) == 1,
               f"{len(starts)} StartWorkflowExecution calls for {wf.decode()} over {len(sweeps)} sweeps",
               "R-OPS-3", "R-EXEC-9")
    cancelled = ctx.cancel_run(api, long_run)
    ctx.expect("A cancelled", cancelled.get("cancelled") is True, str(cancelled))
    run = _settled(ctx, api, approving, timeout_s=30)
    effects = _side_effects(ctx, approving)
    ctx.expect("B completed once the slot freed, its approved tool run exactly once",
               run["state"] == "completed" and len(effects) == 1
               and effects[0]["approval_id"] == pending["approval_id"],
               f"{run['state']}; side effects {effects}", "R-EXEC-9", "R-APPROVAL-1")
    most = slot_holders(database_events(ctx.deployment.dsn))
    ctx.expect("never more than 1 slot holder", most <= 1, f"max {most}", "R-EXEC-9")
    if run["state"] not in TERMINAL:
        ctx.cancel_run(api, approving)


def _expired(ctx: ScenarioContext, run_id: str) -> bool:
    """Whether ``run_id`` is expired in the database (False for no such run)."""
    return bool(ctx.sql("SELECT 1 FROM runs WHERE run_id::text = %s AND state = 'expired'", run_id))


@scenario(
    "reconciler-holds-no-lock-over-temporal",
    title="Temporal down with an accepted run to dispatch and another overdue: the reconciler "
          "calls Temporal outside any transaction, to dispatch one and to tell it of the other's "
          "expiry (no idle-in-transaction session, no row lock), so a cancel answers at once",
    requirements=("R-OPS-3", "R-CANCEL-1"),
    faults=("temporal down", "temporal back"),
    needs_platform=True,
)
def reconciler_holds_no_lock_over_temporal(ctx: ScenarioContext) -> None:
    api = ctx.processes.api("api-1", QIMPL_DISPATCH_TIMEOUT_S="2")
    ctx.processes.worker("worker-1", DURABLE_AGENT_RECONCILE_TENANTS=json.dumps([TENANT]),
                         QIMPL_RECONCILE_INTERVAL_S="0.5", QIMPL_RECONCILE_GRACE_S="0.5")
    ctx.nemesis.stop_temporal(ctx.stack)
    try:
        resp = ctx.create_run(api, prompt=make_prompt(steps=2, answer="never dispatched"), timeout_s=30)
        if resp is None:
            raise HarnessError("create timed out on the client side")
        doc = resp.json()
        receipt = doc.get("receipt") or {}
        ctx.expect("503 durable_dispatch_unknown with the receipt (accepted)",
                   resp.status_code == 503 and doc.get("code") == "durable_dispatch_unknown"
                   and receipt.get("state") == "accepted", f"{resp.status_code} {resp.text[:200]}",
                   "R-CREATE-5")
        run_id = str(receipt.get("run_id"))
        # A second run, overdue within seconds: the sweep's expiry phase then asks Temporal
        # (down) to cancel its workflow, which must happen after the expiry's transaction.
        late = ctx.create_run(api, prompt=make_prompt(steps=2, answer="overdue"), key="overdue",
                              deadline_seconds=2, timeout_s=30)
        overdue = str(((late.json() if late is not None else {}).get("receipt") or {}).get("run_id"))
        since = ctx.db_now()
        # Sample for at least 4 s and until a sweep has tried (and failed) to dispatch it. A
        # session counts when it sat idle inside a transaction for more than 0.1 s: longer
        # than the gap between two statements of one transaction, far shorter than a call
        # to an unreachable Temporal.
        stuck: list[tuple[Any, ...]] = []
        samples = 0
        deadline = time.monotonic() + 4.0
        give_up = time.monotonic() + 20.0
        while time.monotonic() < deadline or not any(
                s[1] and s[4] for s in sweep_rows_between(ctx, since)) or not _expired(ctx, overdue):
            if time.monotonic() > give_up:
                break
            samples += 1
            stuck += ctx.sql(
                "SELECT pid, state, extract(epoch FROM clock_timestamp() - state_change)::float8,"
                " left(query, 160) FROM pg_stat_activity WHERE application_name = 'qimpl-reconciler'"
                " AND state = 'idle in transaction'"
                " AND clock_timestamp() - state_change > interval '100 milliseconds'")
            time.sleep(0.05)
        tried = [s for s in sweep_rows_between(ctx, since) if s[1] and s[4]]
        ctx.expect("the reconciler tried to dispatch the run while Temporal was down (sampled)",
                   bool(tried), f"{len(tried)} sweeps with a candidate and an error; {samples} samples",
                   "R-OPS-3")
        ctx.expect("the reconciler expired the overdue run while Temporal was down (sampled)",
                   _expired(ctx, overdue), f"run {overdue[:8]}", "R-EXEC-8", "R-OPS-3")
        ctx.expect("no reconciler session sat idle in a transaction",
                   not stuck, f"{len(stuck)} of {samples} samples: {stuck[:2]}", "R-OPS-3")
        # Cancel while the reconciler is inside its call to Temporal: its session last read
        # the runs table and has been idle (in a transaction or not) for a while since.
        calling = poll(lambda: bool(ctx.sql(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'qimpl-reconciler'"
            " AND state IN ('idle', 'idle in transaction') AND query ILIKE 'SELECT%%FROM runs%%'"
            " AND clock_timestamp() - state_change > interval '300 milliseconds'")), timeout_s=20)
        ctx.expect("the cancel was sent while the reconciler was calling Temporal for the run",
                   calling, "its session read runs and then waited on something else", "R-OPS-3")
        ctx.history.record("client", op="cancel", phase="invoke", run_id=run_id)
        t0 = time.monotonic()
        try:
            cancel = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/cancel",
                                headers={"Authorization": f"Bearer {API_KEY}"}, timeout=15)
            status, body = cancel.status_code, cancel.text
        except httpx.HTTPError as exc:
            status, body = 0, type(exc).__name__
        took = time.monotonic() - t0
        answered = json.loads(body) if status == 200 else {}
        ctx.history.record("client", op="cancel", phase="ok" if status == 200 else "fail", run_id=run_id,
                           status=status, cancelled=answered.get("cancelled"))
        ctx.expect("the cancel answered within 1 s with cancelled true",
                   status == 200 and answered.get("cancelled") is True and took <= 1.0,
                   f"{status} in {took:.2f} s: {body[:160]}", "R-CANCEL-1", "R-OPS-3")
    finally:
        ctx.nemesis.start_temporal(ctx.stack)
    if ctx.read_run(api, run_id)["state"] not in TERMINAL:
        ctx.cancel_run(api, run_id)
