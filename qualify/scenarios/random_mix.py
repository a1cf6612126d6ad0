"""Random scenarios: a seeded ``Schedule`` of runs and faults, executed on real processes.

``qualify run --random N --seed S`` makes N of them (ids ``random-0`` ..), each from its
own sub-seed; ``qualify repro random-3 --seed S`` re-derives the same schedule, and
``qualify repro --schedule repro.json`` replays a saved (for example shrunk) one.
"""

from __future__ import annotations

from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import Scenario, ScenarioContext
from qualify.scenarios.lifecycle import accepted
from qualify.schedule import PLATFORM_ACTIONS, FaultPlan, Schedule, generate

__all__ = ["random_scenario", "schedule_scenario"]

REQUIREMENTS = ("R-EXEC-2", "R-EXEC-3", "R-EXEC-4", "R-EXEC-7", "R-Q-2", "R-Q-7")


def _owner(workers: list[ManagedProcess], pid: int) -> ManagedProcess:
    for w in workers:
        if w.alive and w.pid == pid:
            return w
    raise HarnessError(f"no live worker with pid {pid}")


def _strike(ctx: ScenarioContext, fault: FaultPlan, run_id: str, workers: list[ManagedProcess],
            held: dict[str, object]) -> None:
    owner = _owner(workers, int(held["pid"]))  # type: ignore[call-overload]
    where = {"barrier": f"f{fault.run}", "step": fault.step, "run_id": run_id}
    if fault.action == "sigkill-worker":
        ctx.nemesis.sigkill(owner, **where)
    elif fault.action == "sigstop-worker":
        ctx.nemesis.sigstop(owner, **where)
    elif fault.action == "terminate-lock-session":
        ctx.nemesis.terminate_backend(ctx.deployment.dsn, f"qimpl-owner:{run_id}")
    elif fault.action == "restart-postgres":
        ctx.nemesis.restart_postgres(ctx.stack)
    elif fault.action == "restart-temporal":
        ctx.nemesis.restart_temporal(ctx.stack)
    elif fault.action == "restart-worker":
        # Released once the ownership is seen: a graceful shutdown then has work to finish.
        ctx.nemesis.restart(owner, owner_dsn=ctx.deployment.dsn,
                            then=lambda: ctx.release_barrier(f"f{fault.run}"), **where)
    else:
        raise HarnessError(f"unknown fault action {fault.action}")
    if not owner.alive or fault.action == "sigstop-worker":
        # A fresh worker joins (not waited for: the surviving one recovers the runs meanwhile).
        workers.append(ctx.processes.spawn_worker(f"worker-{len(workers) + 1}"))


def run_schedule(ctx: ScenarioContext, schedule: Schedule) -> None:
    ctx.history.record("schedule", plan=schedule.to_json())
    # Spawned together, then waited for: their imports overlap instead of adding up.
    spawned = [ctx.processes.spawn_api(), ctx.processes.spawn_worker("worker-1"),
               ctx.processes.spawn_worker("worker-2")]
    api, *workers = [p.wait_ready() for p in spawned]
    by_run = {f.run: f for f in schedule.faults}

    def create(i: int) -> str:
        fault = by_run.get(i)
        extra = {"barrier": {"step": fault.step, "name": f"f{i}"}} if fault else {}
        run = schedule.runs[i]
        return accepted(ctx, api, prompt=make_prompt(
            steps=run.steps, delay_ms=run.delay_ms, answer=f"r{i}", **extra))

    # Valid by construction: the runs without a fault start at once; each run with one
    # starts only after the previous fault was struck, so no fault is aimed at a worker an
    # earlier fault already killed (a barrier holds once, so a run whose holder died as
    # collateral would never hold again), and every fault strikes a live owner.
    run_ids: dict[int, str] = {i: create(i) for i in range(len(schedule.runs)) if i not in by_run}
    for fault in schedule.faults:
        run_ids[fault.run] = create(fault.run)
        held = ctx.wait_barrier(f"f{fault.run}", timeout_s=60)
        _strike(ctx, fault, run_ids[fault.run], workers, held)
        ctx.release_barrier(f"f{fault.run}")
    for i, run_id in sorted(run_ids.items()):
        final = ctx.wait_terminal(api, run_id, timeout_s=90)
        ctx.expect(f"run {i} completed with its answer",
                   final["state"] == "completed" and final["result_json"] == {"answer": f"r{i}"},
                   f"{final['state']} {final['result_json']}", "R-EXEC-4")


def schedule_scenario(schedule: Schedule, scenario_id: str = "schedule") -> Scenario:
    """A scenario that executes ``schedule`` (its faults must all land)."""
    return Scenario(
        id=scenario_id,
        title=f"random schedule: {len(schedule.runs)} runs, faults "
              + (", ".join(f"{f.action}@run{f.run}/step{f.step}" for f in schedule.faults) or "none"),
        requirements=REQUIREMENTS,
        body=lambda ctx: run_schedule(ctx, schedule),
        faults=tuple(f.action for f in schedule.faults),
        schedule=schedule.to_json(),
        needs_platform=any(f.action in PLATFORM_ACTIONS for f in schedule.faults),
    )


def random_scenario(index: int, seed: int) -> Scenario:
    """Scenario ``random-{index}`` of root seed ``seed``."""
    from qualify.runner import sub_seed

    sid = f"random-{index}"
    return schedule_scenario(generate(sub_seed(seed, sid)), sid)
