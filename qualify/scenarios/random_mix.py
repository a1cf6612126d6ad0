"""Random scenarios: a seeded ``Schedule`` of runs and faults, executed on real processes.

``qualify run --random N --seed S`` makes N of them (ids ``random-0`` ..), each from its
own sub-seed; ``qualify repro random-3 --seed S`` re-derives the same schedule, and
``qualify repro --schedule repro.json`` replays a saved (for example shrunk) one.

Every fault strikes the run it names while that run is held at its barrier (the start of
the fault's step), so its target is known and live (R-Q-10):

- ``pause-in-transaction``: the workers run with ``owner.inside_checkpoint_transaction:stop?armed``;
  at the barrier the harness arms the point for (run, step) and releases the run, so its
  owner — whichever worker it is — stops itself inside that step's checkpoint transaction.
- ``kill-sink``: the run asks for a ``charge`` call at the step; the sink performs it and
  holds the reply ``SINK_HOLD_S`` (below the tool's timeout); the harness SIGKILLs the sink
  in that window and restarts it. The run must then park ``side_effect_outcome_unknown``
  (R-TOOL-3); the harness, as an operator, settles the call from the sink's record and
  resumes (R-RESUME-3), and the run must complete fed that result, executed once.
- ``skew-worker-clock``: every worker of such a schedule runs with its wall clock
  ``SKEW_S`` ahead (odd workers) or behind (even ones), so the owner at the barrier is a
  skewed one; the fault's evidence is the offset seen in that process. Every run of such a
  schedule gets a deadline of ``SKEWED_DEADLINE_S``, shorter than the skew, so a worker
  that judged the deadline on its own clock would expire a run early. The runs must still
  complete: qimpl compares times only on the database's clock (R-EXEC-8).
- ``restart-postgres-mid-sweep``, ``restart-temporal-mid-sweep``: the workers of such a
  schedule also reconcile (``SWEEPING``) with ``reconciler.after_dispatch:hold?armed``; the
  run is created on an API that dies right after its acceptance commit, the harness arms
  the point for that run, and when a sweep holds there (Temporal started the workflow, the
  dispatch not yet confirmed) it restarts PostgreSQL or Temporal, then releases the sweep.
  The run must complete: a later sweep or its owner confirms it, one workflow (R-OPS-3,
  R-CREATE-5).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess, faketime_env
from qualify.procs import poll
from qualify.scenarios.base import Scenario, ScenarioContext
from qualify.scenarios.lifecycle import accepted
from qualify.schedule import (
    PLATFORM_ACTIONS,
    SKEW_S,
    SWEEP_ACTIONS,
    FaultPlan,
    Schedule,
    generate,
    problems,
)

__all__ = ["random_scenario", "schedule_scenario"]

REQUIREMENTS = ("R-EXEC-2", "R-EXEC-3", "R-EXEC-4", "R-EXEC-7", "R-Q-2", "R-Q-7", "R-Q-10")

CKPT_TXN = "owner.inside_checkpoint_transaction"
SWEEP_DISPATCH = "reconciler.after_dispatch"
AFTER_ACCEPT = "api.after_acceptance_commit"
#: The workers of a mid-sweep schedule reconcile the harness's tenant every second; an
#: orphan is swept 2 s after its acceptance, time enough to arm the point for it first.
SWEEPING = {"DURABLE_AGENT_RECONCILE_TENANTS": json.dumps(["t-dev"]), "QIMPL_RECONCILE_INTERVAL_S": "1",
            "QIMPL_RECONCILE_GRACE_S": "2"}
#: The sink performs a ``kill-sink`` call, then holds its reply this long (s): under the
#: harness tools' timeout (``qualify.fakes.tools.TIMEOUT_S``, 1 s), so only the kill loses it.
SINK_HOLD_S = 0.8
#: The deadline of every run of a skew-worker-clock schedule (s): longer than any schedule
#: takes, shorter than ``SKEW_S``.
SKEWED_DEADLINE_S = 180
#: Faults after which a fresh worker joins (the owner died or is stopped).
_REPLACED = frozenset({"sigkill-worker", "sigstop-worker", "pause-in-transaction"})


def _owner(workers: list[ManagedProcess], pid: int) -> ManagedProcess:
    for w in workers:
        if w.alive and w.pid == pid:
            return w
    raise HarnessError(f"no live worker with pid {pid}")


def _struck(ctx: ScenarioContext, point: str, workers: list[ManagedProcess], run_id: str, *,
            timeout_s: float) -> tuple[ManagedProcess, dict[str, Any]]:
    """The live worker that struck ``point`` for ``run_id``, and its evidence line
    (HarnessError after ``timeout_s``)."""
    def reached() -> tuple[ManagedProcess, dict[str, Any]] | None:
        live = {w.pid: w for w in workers if w.alive}
        found = [e for e in ctx.crash_evidence(point)
                 if e.get("context", {}).get("run_id") == run_id and e["pid"] in live]
        return (live[found[-1]["pid"]], found[-1]) if found else None

    with ctx.waiting("wait_crash_point"):
        struck = poll(reached, timeout_s, interval_s=0.01)
    if struck is None:
        raise HarnessError(f"no live worker reached crash point {point} for run {run_id} in {timeout_s} s")
    return struck


def _wait_execution(ctx: ScenarioContext, run_id: str, timeout_s: float) -> dict[str, Any]:
    """The sink's executions line for ``run_id`` once it appears (HarnessError after ``timeout_s``)."""
    path = ctx.control / "sink" / "executions.jsonl"
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        found = [d for d in map(json.loads, filter(str.strip, lines)) if d.get("run_id") == run_id]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise HarnessError(f"the sink executed no call of run {run_id} in {timeout_s} s")
        time.sleep(0.005)


class _Workers:
    """The schedule's workers: the environment each new one gets (armed crash point,
    skewed clock) and the skew each one runs with."""

    def __init__(self, ctx: ScenarioContext, schedule: Schedule) -> None:
        actions = {f.action for f in schedule.faults}
        self.ctx = ctx
        self.armed = "pause-in-transaction" in actions
        self.skewed = "skew-worker-clock" in actions
        self.sweeping = bool(actions & SWEEP_ACTIONS)
        self.live: list[ManagedProcess] = []
        self.skew: dict[str, int] = {}

    def spawn(self) -> ManagedProcess:
        n = len(self.live) + 1
        name = f"worker-{n}"
        env: dict[str, str] = {}
        points = [f"{CKPT_TXN}:stop?armed"] if self.armed else []
        if self.sweeping:
            points.append(f"{SWEEP_DISPATCH}:hold?armed")
            env.update(SWEEPING)
        if points:
            env["QIMPL_CRASH_POINTS"] = ",".join(points)
        if self.skewed:
            self.skew[name] = SKEW_S if n % 2 else -SKEW_S
            env.update(faketime_env(self.skew[name]))
        proc = self.ctx.processes.spawn_worker(name, env=env)
        self.live.append(proc)
        return proc


def _strike(ctx: ScenarioContext, fault: FaultPlan, run_id: str, workers: _Workers,
            held: dict[str, object]) -> None:
    seen_t = time.time()
    owner = _owner(workers.live, int(held["pid"]))  # type: ignore[call-overload]
    where: dict[str, Any] = {"barrier": f"f{fault.run}", "step": fault.step, "run_id": run_id}
    if fault.action == "sigkill-worker":
        ctx.nemesis.sigkill(owner, **where)
    elif fault.action == "sigstop-worker":
        ctx.nemesis.sigstop(owner, **where)
    elif fault.action == "terminate-lock-session":
        ctx.nemesis.terminate_lease_session(ctx.deployment.dsn, run_id)
    elif fault.action == "restart-postgres":
        ctx.nemesis.restart_postgres(ctx.stack)
    elif fault.action == "restart-temporal":
        ctx.nemesis.restart_temporal(ctx.stack)
    elif fault.action == "restart-worker":
        # Released once the ownership is seen: a graceful shutdown then has work to finish.
        ctx.nemesis.restart(owner, owner_dsn=ctx.deployment.dsn,
                            then=lambda: ctx.release_barrier(f"f{fault.run}"), **where)
    elif fault.action == "pause-in-transaction":
        ctx.arm_crash_point(CKPT_TXN, {"run_id": run_id, "step": fault.step})
        ctx.release_barrier(f"f{fault.run}")
        # The run's owner at that checkpoint, whichever worker it is: the barrier's holder
        # may have lost the run meanwhile (Temporal timed its attempt out after a slow
        # claim, at this mix's 1 s heartbeat timeout), and its successor then reaches it.
        owner, evidence = _struck(ctx, CKPT_TXN, workers.live, run_id, timeout_s=60)
        ctx.nemesis.paused_in_transaction(owner, evidence, ctx.deployment.dsn, **where)
    elif fault.action == "kill-sink":
        ctx.release_barrier(f"f{fault.run}")
        call = _wait_execution(ctx, run_id, timeout_s=60)
        ctx.nemesis.kill_sink(ctx.sink, call=call, hold_s=SINK_HOLD_S, **where)
    elif fault.action == "skew-worker-clock":
        wall, true = float(str(held.get("wall_t", held["t"]))), float(str(held["t"]))
        ctx.nemesis.clock_skew(owner, expected_s=workers.skew.get(owner.name, 0), worker_t=wall,
                               seen_t=seen_t, dsn=ctx.deployment.dsn,
                               recorder_offset_s=round(true - seen_t, 3), **where)
    else:
        raise HarnessError(f"unknown fault action {fault.action}")
    if not owner.alive or fault.action in _REPLACED:
        # A fresh worker joins (not waited for: the surviving one recovers the runs meanwhile).
        workers.spawn()


def _strike_mid_sweep(ctx: ScenarioContext, fault: FaultPlan, prompt: str, workers: _Workers) -> str:
    """Orphan run ``fault.run`` (its API dies after the acceptance commit), hold the sweep
    that dispatches it between Temporal's start and the confirming commit, restart
    PostgreSQL or Temporal there, release. Returns the run id."""
    evidence = ctx.create_on_dying_api(AFTER_ACCEPT, name=f"api-doomed-{fault.run}", prompt=prompt)
    run_id = str(evidence["context"]["run_id"])
    ctx.arm_crash_point(SWEEP_DISPATCH, {"run_id": run_id})
    deadline = time.monotonic() + 60
    while not (held := [e for e in ctx.crash_evidence(SWEEP_DISPATCH) if e["context"]["run_id"] == run_id]):
        if time.monotonic() > deadline:
            raise HarnessError(f"no sweep dispatched orphan run {run_id} in 60 s")
        time.sleep(0.02)
    sweeper = _owner(workers.live, int(held[0]["pid"]))
    where = {"run_id": run_id, "reconciler": sweeper.name, "point": SWEEP_DISPATCH,
             "started": held[0]["context"].get("started")}
    ctx.history.record("barrier", name=f"f{fault.run}", **held[0])
    if fault.action == "restart-postgres-mid-sweep":
        ctx.nemesis.restart_postgres(ctx.stack, **where)
    else:
        ctx.nemesis.restart_temporal(ctx.stack, **where)
    Path(held[0]["release"]).touch()  # this arming's own release (qimpl.crashpoints)
    return run_id


def _expect_reconciled(ctx: ScenarioContext, api: ManagedProcess, i: int, run_id: str, *,
                       also_parked: frozenset[str] = frozenset()) -> None:
    """A ``kill-sink`` run: the spec's one allowed course (R-TOOL-3, R-RESUME-3). It parks
    ``side_effect_outcome_unknown``; the sink executed the call once; an operator records
    ``succeeded`` with the sink's receipt and an empty resume completes the run, fed that
    result (``r<i> [charge:succeeded]``), the call still executed once. ``also_parked``:
    the schedule's other ``kill-sink`` runs not reconciled yet, which the operator's
    listing may show beside it."""
    from qualify.scenarios.tools import _parked_unknown, _reconcile_and_finish, sink_lines

    _parked_unknown(ctx, api, run_id)
    ctx.expect(f"run {i}: the sink executed the call once before reconciliation",
               len(sink_lines(ctx, "executions", run_id)) == 1,
               str(sink_lines(ctx, "executions", run_id)), "R-TOOL-3")
    final = _reconcile_and_finish(ctx, api, run_id, answer_has="charge:succeeded", also_parked=also_parked)
    ctx.expect(f"run {i} completed with its answer, fed the reconciled result",
               final["state"] == "completed" and final["result_json"] == {"answer": f"r{i} [charge:succeeded]"},
               f"{final['state']} {final['result_json']}", "R-EXEC-4", "R-TOOL-2")
    ctx.expect(f"run {i}: the sink executed the call exactly once in all",
               len(sink_lines(ctx, "executions", run_id)) == 1,
               str(sink_lines(ctx, "executions", run_id)), "R-TOOL-2")


def run_schedule(ctx: ScenarioContext, schedule: Schedule) -> None:
    if why := problems(schedule):
        raise HarnessError(f"schedule not valid by construction: {'; '.join(why)}")
    ctx.history.record("schedule", plan=schedule.to_json())
    workers = _Workers(ctx, schedule)
    # Spawned together, then waited for: their imports overlap instead of adding up.
    spawned = [ctx.processes.spawn_api(), workers.spawn(), workers.spawn()]
    api = spawned[0]
    for p in spawned:
        p.wait_ready()
    by_run = {f.run: f for f in schedule.faults}

    def create(i: int) -> str:
        fault = by_run.get(i)
        extra: dict[str, Any] = {"barrier": {"step": fault.step, "name": f"f{i}"}} if fault else {}
        if fault is not None and fault.action == "kill-sink":
            extra["tools"] = {str(fault.step): [{"tool": "charge", "arguments": {
                "amount": 1 + i, "sink_hold_s": SINK_HOLD_S}}]}
        run = schedule.runs[i]
        deadline = {"deadline_seconds": SKEWED_DEADLINE_S} if workers.skewed else {}
        return accepted(ctx, api, prompt=make_prompt(
            steps=run.steps, delay_ms=run.delay_ms, answer=f"r{i}", **extra), **deadline)

    # Valid by construction: the runs without a fault start at once; each run with one
    # starts only after the previous fault was struck, so no fault is aimed at a worker an
    # earlier fault already killed (a barrier holds once, so a run whose holder died as
    # collateral would never hold again), and every fault strikes a live owner.
    run_ids: dict[int, str] = {i: create(i) for i in range(len(schedule.runs)) if i not in by_run}
    for fault in schedule.faults:
        if fault.action in SWEEP_ACTIONS:
            run = schedule.runs[fault.run]
            run_ids[fault.run] = _strike_mid_sweep(ctx, fault, make_prompt(
                steps=run.steps, delay_ms=run.delay_ms, answer=f"r{fault.run}"), workers)
            continue
        run_ids[fault.run] = create(fault.run)
        held = ctx.wait_barrier(f"f{fault.run}", timeout_s=60)
        _strike(ctx, fault, run_ids[fault.run], workers, held)
        ctx.release_barrier(f"f{fault.run}")
    unreconciled = {r for i, r in run_ids.items() if i in by_run and by_run[i].action == "kill-sink"}
    for i, run_id in sorted(run_ids.items()):
        if run_id in unreconciled:
            unreconciled.discard(run_id)
            _expect_reconciled(ctx, api, i, run_id, also_parked=frozenset(unreconciled))
            continue
        final = ctx.wait_terminal(api, run_id, timeout_s=90)
        ctx.expect(f"run {i} completed with its answer",
                   final["state"] == "completed" and final["result_json"] == {"answer": f"r{i}"},
                   f"{final['state']} {final['result_json']}",
                   *(("R-EXEC-4", "R-EXEC-8") if workers.skewed else ("R-EXEC-4",)))


def schedule_scenario(schedule: Schedule, scenario_id: str = "schedule", *,
                      schedule_file: str | None = None) -> Scenario:
    """A scenario that executes ``schedule`` (its faults must all land); ``schedule_file``
    when it was read from a saved one (its repro line replays that file)."""
    return Scenario(
        id=scenario_id,
        title=f"random schedule: {len(schedule.runs)} runs, faults "
              + (", ".join(f"{f.action}@run{f.run}/step{f.step}" for f in schedule.faults) or "none"),
        requirements=REQUIREMENTS + tuple(
            r for a, r in (("kill-sink", "R-TOOL-3"), ("kill-sink", "R-RESUME-3"),
                           ("skew-worker-clock", "R-EXEC-8"), ("pause-in-transaction", "R-EXEC-11"),
                           ("restart-postgres-mid-sweep", "R-OPS-3"), ("restart-temporal-mid-sweep", "R-OPS-3"))
            if any(f.action == a for f in schedule.faults)),
        body=lambda ctx: run_schedule(ctx, schedule),
        faults=tuple(f.action for f in schedule.faults),
        schedule=schedule.to_json(),
        schedule_file=schedule_file,
        needs_platform=any(f.action in PLATFORM_ACTIONS for f in schedule.faults),
    )


def random_scenario(index: int, seed: int) -> Scenario:
    """Scenario ``random-{index}`` of root seed ``seed``."""
    from qualify.runner import sub_seed

    sid = f"random-{index}"
    return schedule_scenario(generate(sub_seed(seed, sid)), sid)
