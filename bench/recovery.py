"""Section 4, recovery, with qimpl's default lease (``DEFAULT_LEASE_S``) and heartbeat
timeout (``DEFAULT_HEARTBEAT_TIMEOUT_S``, above the lease). Seconds throughout.

- ``recovery.sigkill_p50_s``/``p95``: the owning worker SIGKILLed while it holds at a
  synthetic-provider barrier in step 2 (checkpoint 1 committed) -> checkpoint 2
  committed by the surviving worker (``run_checkpoints.created_at``, the database's
  clock, against the kill's wall clock on the same machine); ``plan.sigkill_trials``
  trials, two workers up at every kill. ``recovery.sigkill_lease1_p50_s``: the same with
  the harness's 1 s lease and heartbeat timeout (half the trials), to show how much of it
  is the lease;
  ``..._retry_started_p50_s``: the share until Temporal started the retried attempt (its
  history's ``ActivityTaskStarted``), the rest being qimpl's claim and step 2.
- ``recovery.sigstop_s``, ``recovery.in_txn_s``, ``recovery.cancel_s``: the harness's
  own scenarios ``paused-owner`` (SIGSTOP at a barrier -> first write of a later attempt),
  ``owner-paused-inside-checkpoint-transaction`` (stopped between the UPDATE and the
  commit -> first write of a later attempt) and ``cancel-stops-a-long-step`` (cancel
  commit -> the provider call cancelled), run by ``qualify.runner`` with the default lease
  and heartbeat timeout and judged as usual; the median of their figures over ``plan.pause_trials`` runs. Every
  process runs with the default lease, the pause scenarios' own included (``qualify run``
  gives those 3 s, ``Deployment.paused_lease_s``): their targets are lease + 1.5 s.
- ``tuned.*``: the SIGKILL trials and the two pause scenarios again on a second stack
  whose Temporal dev server runs with ``qualify.stack.temporal.TUNED_DYNAMIC_CONFIG``
  (timer shift 20 ms). Users run stock servers: the targets
  are judged on the default figures; the tuned ones say how much is the server's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.env import DEFAULT_HEARTBEAT_TIMEOUT_S, DEFAULT_LEASE_S, BenchEnv, deployment_context
from bench.stats import summarize
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import ScenarioContext
from qualify.scenarios.lifecycle import accepted

__all__ = ["HARNESS_LEASE_S", "SCENARIO_FIGURES", "measure_recovery"]

#: The lease ``qualify run`` gives its processes (``qualify.runner``), seconds.
HARNESS_LEASE_S = 1.0

#: figure key -> (scenario id, the figure the scenario records; < 0 means "did not happen").
SCENARIO_FIGURES: dict[str, tuple[str, str]] = {
    "recovery.sigstop_s": ("paused-owner", "takeover_after_sigstop_s"),
    "recovery.in_txn_s": ("owner-paused-inside-checkpoint-transaction",
                          "takeover_after_sigstop_in_transaction_s"),
    "recovery.cancel_s": ("cancel-stops-a-long-step", "step_stopped_after_cancel_s"),
}


def _checkpoint_at(ctx: ScenarioContext, run_id: str, step: int, *, timeout_s: float) -> float:
    """Epoch seconds at which checkpoint ``step`` of ``run_id`` was written."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = ctx.sql("SELECT extract(epoch FROM created_at)::float8 FROM run_checkpoints"
                       " WHERE run_id = %s AND step = %s", run_id, step)
        if rows:
            return float(rows[0][0])
        if time.monotonic() > deadline:
            raise HarnessError(f"checkpoint {step} of run {run_id} not written in {timeout_s} s")
        time.sleep(0.01)


def _retry_started(address: str, run_id: str) -> tuple[float, int] | None:
    """(epoch seconds, attempt) at which Temporal started the activity attempt that
    completed the run's first generation (its ``ActivityTaskStarted`` event: Temporal
    writes it for the last attempt only); None if the history has none."""
    import asyncio

    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    from qimpl.lifecycle import workflow_id

    async def fetch() -> tuple[float, int] | None:
        client = await Client.connect(address)
        async for event in client.get_workflow_handle(workflow_id(run_id, 1)).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                at = event.event_time.seconds + event.event_time.nanos / 1e9
                return at, int(event.activity_task_started_event_attributes.attempt)
        return None

    return asyncio.run(fetch())


def _sigkill_trials(env: BenchEnv, trials: int, *, lease_s: float = DEFAULT_LEASE_S,
                    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
                    ) -> tuple[list[float], list[float]]:
    """(seconds from each SIGKILL of the owner to checkpoint 2 by a surviving worker,
    seconds from each SIGKILL to Temporal starting the attempt that did it)."""
    samples, started = [], []
    with deployment_context(env, f"recovery-sigkill-{lease_s:g}", lease_s=lease_s,
                            heartbeat_timeout_s=heartbeat_timeout_s) as ctx:
        api = ctx.processes.api()
        workers = [ctx.processes.spawn_worker("worker-0"), ctx.processes.spawn_worker("worker-1")]
        for w in workers:
            w.wait_ready()
        for i in range(trials):
            name = f"k{i}"
            run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="bench",
                                                           barrier={"step": 2, "name": name}))
            held = ctx.wait_barrier(name)
            owner = next((w for w in workers if w.alive and w.pid == held["pid"]), None)
            if owner is None:
                raise HarnessError(f"barrier held by no worker of ours: {held}")
            # The kill's time on each clock a later event is read on: the checkpoint's
            # (the database's) and the retry's start (the Temporal server's; the harness
            # boots it on this host, so it keeps this host's clock).
            killed_wall = time.time()
            ctx.nemesis.sigkill(owner, barrier=name, run_id=run_id)
            killed_at = ctx.db_now()
            samples.append(_checkpoint_at(ctx, run_id, 2, timeout_s=60) - killed_at)
            ctx.wait_terminal(api, run_id, timeout_s=60)
            retry = _retry_started(env.temporal_address, run_id)
            if retry is not None and retry[1] > 1:
                started.append(retry[0] - killed_wall)
            env.log(f"  recovery: SIGKILL -> next checkpoint {samples[-1]:.2f} s (lease {lease_s:g} s;"
                    f" Temporal started attempt {retry and retry[1]} after "
                    f"{retry[0] - killed_wall if retry else float('nan'):.2f} s)")
            workers.remove(owner)
            workers.append(ctx.processes.worker(f"worker-{i + 2}"))
    return samples, started


def _scenario_figures(env: BenchEnv, trials: int) -> tuple[dict[str, Any], dict[str, list[str]]]:
    from qualify.runner import run_scenario
    from qualify.scenarios import REGISTRY

    out: dict[str, Any] = {}
    verdicts: dict[str, list[str]] = {}
    for key, (sid, figure) in SCENARIO_FIGURES.items():
        values = []
        for i in range(trials):
            result = run_scenario(env.stack, REGISTRY[sid], seed=i, out_dir=Path(env.workdir, sid, str(i)),
                                  heartbeat_timeout_s=DEFAULT_HEARTBEAT_TIMEOUT_S,
                                  lease_s=DEFAULT_LEASE_S, paused_lease_s=DEFAULT_LEASE_S)
            verdicts.setdefault(sid, []).append(str(result.verdict))
            ran_with = result.figures.get("paused_lease_s", DEFAULT_LEASE_S)
            if ran_with != DEFAULT_LEASE_S:  # judged against lease_s + 1.5 s: it must be that lease
                raise HarnessError(f"{sid} ran with a {ran_with} s lease, not the default {DEFAULT_LEASE_S} s")
            got = result.figures.get(figure)
            if got is not None and got >= 0:
                values.append(float(got))
            env.log(f"  recovery: {sid}: {got} s ({result.verdict})")
        if values:
            out[key] = summarize(values).p50
    return out, verdicts


def measure_tuned(env: BenchEnv) -> dict[str, Any]:
    """The SIGKILL and pause figures again on a second stack whose dev server runs with
    ``TUNED_DYNAMIC_CONFIG`` (the harness may use it; users' servers do not): what of the
    takeover is the server's timer rounding, not qimpl's."""
    import dataclasses

    from qualify.stack import EmbeddedStack
    from qualify.stack.temporal import TUNED_DYNAMIC_CONFIG

    stack = EmbeddedStack(temporal_config=TUNED_DYNAMIC_CONFIG)
    try:
        stack.start()
        tuned = dataclasses.replace(env, stack=stack, workdir=env.workdir / "tuned")
        samples, _ = _sigkill_trials(tuned, max(2, env.plan.sigkill_trials // 2))
        kills = summarize(samples)
        out: dict[str, Any] = {"tuned.sigkill_p50_s": kills.p50, "tuned.sigkill_p95_s": kills.p95,
                               "tuned.dynamic_config": dict(TUNED_DYNAMIC_CONFIG)}
        figures, verdicts = _scenario_figures(tuned, env.plan.pause_trials)
        out.update({k.replace("recovery.", "tuned."): v for k, v in figures.items()
                    if k != "recovery.cancel_s"})
        out["tuned.scenario_verdicts"] = verdicts
        return out
    finally:
        stack.stop()


def measure_recovery(env: BenchEnv) -> dict[str, Any]:
    """Every recovery figure (see the module docstring), on the stack's default Temporal
    server and then on a tuned one; processes always reaped."""
    out: dict[str, Any] = {"recovery.lease_s": DEFAULT_LEASE_S,
                           "recovery.heartbeat_timeout_s": DEFAULT_HEARTBEAT_TIMEOUT_S}
    samples, started = _sigkill_trials(env, env.plan.sigkill_trials)
    kills = summarize(samples)
    out.update({"recovery.sigkill_p50_s": kills.p50, "recovery.sigkill_p95_s": kills.p95,
                "recovery.sigkill_max_s": kills.max})
    if started:
        out["recovery.sigkill_retry_started_p50_s"] = summarize(started).p50
    # The same with the harness's lease and timeout (1 s): how much of the figure is the lease.
    samples, started = _sigkill_trials(env, max(2, env.plan.sigkill_trials // 2), lease_s=HARNESS_LEASE_S,
                                       heartbeat_timeout_s=HARNESS_LEASE_S)
    out["recovery.sigkill_lease1_p50_s"] = summarize(samples).p50
    if started:
        out["recovery.sigkill_lease1_retry_started_p50_s"] = summarize(started).p50
    figures, verdicts = _scenario_figures(env, env.plan.pause_trials)
    out.update(figures)
    out["recovery.scenario_verdicts"] = verdicts
    out.update(measure_tuned(env))
    return out
