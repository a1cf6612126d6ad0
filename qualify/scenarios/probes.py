"""Strikes where one mechanism is the only defence (issue: a pass must mean crash-proof).

Every fault that makes a stale owner in the other scenarios also ends that owner's
database session, so the fenced update, the transition guard and row-level security
each hide behind a dead connection or an application-level filter. Here a live session
of the worker's or the API's own database role writes what only that one mechanism
refuses, while the real owner holds the run at a barrier, and the database's refusal is
the evidence: no row matched (the fence), the guard's SQLSTATE, or row-level security's.

- **Fence (R-EXEC-7):** ``RunOwner`` — qimpl's own fenced writes — built with a token
  that differs from the owner's in exactly one part (a stale ``row_version``, an attempt
  that never claimed, another generation), on a session that holds no advisory lock:
  only the token's predicate can refuse it.
- **Transition guard (R-STATE-1, R-EXEC-8/12):** raw UPDATEs by the worker role that no
  fence stands in front of: a row version that skips, an illegal transition, ``expired``
  before the deadline, an attempt going back (also through NULL), a changed deadline,
  prompt or stream key, a generation that jumps; any write to a terminal run; raw
  INSERTs by the API and worker roles of a run that is not new (``QG014``).
- **Checkpoint guard (R-EXEC-4, R-EXEC-7, R-EXEC-8):** a checkpoint row with the owner's own
  token written outside the owner's fenced write (``QG015``), which the next attempt would
  otherwise restore; and one landing after the deadline, a round trip after its run's
  write passed the guard just before it (``QG006``).

The writers themselves are in ``qualify.scenarios.writers``.
- **Row-level security (R-AUTH-4):** sessions of the API and worker roles scoped to
  another tenant read the run, its checkpoints and audit (nothing visible), update it
  (no row) and insert a run into the first tenant (refused, ``42501``).
"""

from __future__ import annotations

import time
from typing import Any

from qualify.fakes.synthetic import make_prompt
from qualify.owner_sessions import LEASE_PIDS_SQL
from qualify.procs import wait_until
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import writes_by_others_until
from qualify.scenarios.writers import (
    fence_probe,
    guard_probe,
    insert_probe,
    late_checkpoint_probe,
    rls_probes,
    stray_checkpoint_probe,
)

__all__ = ["FENCE_CASES", "GUARD_CASES", "INSERT_CASES"]

#: (case, how the token differs from the owner's): each is refused only by its predicate.
FENCE_CASES = (
    ("a stale row_version", {"row_version": -1}),
    ("an attempt that never claimed", {"attempt": +1}),
    ("another generation", {"generation": +1}),
)

#: (case, SET clause, the guard's SQLSTATE) on the live running run.
GUARD_CASES = (
    ("a row_version that skips one", "row_version = row_version + 2", "QG003"),
    ("running -> accepted", "state = 'accepted', row_version = row_version + 1", "QG002"),
    ("expired before the deadline", "state = 'expired', row_version = row_version + 1", "QG007"),
    ("an attempt taking its generation back",
     "owner_attempt = owner_attempt - 1, row_version = row_version + 1", "QG008"),
    ("a moved deadline", "deadline_at = deadline_at + interval '1 hour', row_version = row_version + 1",
     "QG004"),
    ("an attempt going back through NULL", "owner_attempt = NULL, row_version = row_version + 1", "QG008"),
    ("a generation that jumps", "generation = generation + 40, row_version = row_version + 1", "QG004"),
    ("a changed prompt", "prompt = 'rewritten', row_version = row_version + 1", "QG004"),
    ("a changed stream key", "stream_key = 'guessable', row_version = row_version + 1", "QG004"),
    ("a changed workspace", "workspace_id = 'elsewhere', row_version = row_version + 1", "QG004"),
    ("a changed acceptance time", "accepted_at = accepted_at - interval '1 hour', row_version = row_version + 1",
     "QG004"),
    ("running -> queued", "state = 'queued', row_version = row_version + 1", "QG002"),
)
#: (case, the INSERT's state, row_version, generation, owner_attempt): a run inserted
#: other than new, by an application role in its own tenant (QG014).
INSERT_CASES = (
    ("a run inserted straight into completed at row version 7", "completed", 7, 1, None),
    ("a run inserted running, owned by attempt 1", "running", 1, 1, 1),
    ("a run inserted at generation 3", "accepted", 1, 3, None),
)


def _owner_row(ctx: ScenarioContext, run_id: str) -> dict[str, Any]:
    (row,) = ctx.sql("SELECT row_version, generation, owner_attempt, state FROM runs WHERE run_id = %s",
                     run_id)
    return dict(zip(("row_version", "generation", "owner_attempt", "state"), row, strict=True))


@scenario(
    "stale-writers-refused",
    title="With the owner alive at a barrier, live sessions of the worker and API roles write "
          "what only one mechanism refuses: the fence refuses each stale token, the guard each "
          "illegal write, row-level security every cross-tenant read and write; the run completes",
    requirements=("R-EXEC-7", "R-STATE-1", "R-EXEC-12", "R-AUTH-4"),
)
def stale_writers_refused(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    created = ctx.create_run(api, prompt=make_prompt(steps=3, barrier={"step": 2, "name": "probe"}))
    assert created is not None and created.status_code == 202, created
    run_id = created.json()["run_id"]
    ctx.wait_barrier("probe")
    worker_dsn = ctx.deployment.app_dsn("qimpl_worker")
    before = _owner_row(ctx, run_id)
    owner = {"row_version": int(before["row_version"]), "generation": int(before["generation"]),
             "attempt": int(before["owner_attempt"])}

    for case, delta in FENCE_CASES:
        token = {k: v + delta.get(k, 0) for k, v in owner.items()}
        answer = fence_probe(worker_dsn, run_id, "t-dev", token, step=2)
        ctx.history.record("probe", mechanism="fence", case=case, run_id=run_id, answer=answer)
        ctx.expect(f"the fence refuses {case}", answer == "refused",
                   f"{answer} (token {token}, owner {owner})", "R-EXEC-7")
        streamed = fence_probe(worker_dsn, run_id, "t-dev", token, step=2, write="output delta")
        ctx.history.record("probe", mechanism="output fence", case=case, run_id=run_id, answer=streamed)
        ctx.expect(f"the output fence refuses a delta from {case} (QG013)", streamed == "guard:QG013",
                   f"{streamed} (token {token}, owner {owner})", "R-EXEC-7", "R-EVENT-1")

    for case, set_clause, sqlstate in GUARD_CASES:
        answer = guard_probe(worker_dsn, run_id, "t-dev", set_clause)
        ctx.history.record("probe", mechanism="guard", case=case, run_id=run_id, answer=answer)
        ctx.expect(f"the guard refuses {case} ({sqlstate})", answer == sqlstate, answer,
                   "R-EXEC-12" if sqlstate == "QG007" else "R-STATE-1")

    for role in ("qimpl_api", "qimpl_worker"):
        for case, state, version, generation, attempt in INSERT_CASES:
            answer = insert_probe(ctx.deployment.app_dsn(role), "t-dev", state, version, generation,
                                   attempt)
            ctx.history.record("probe", mechanism="insert guard", case=case, role=role, answer=answer)
            ctx.expect(f"the guard refuses {case} by {role} (QG014)", answer == "QG014", answer,
                       "R-STATE-1")

    # Step 99, and the owner's own current step at its own row version: only the
    # transaction condition (the owner's fenced write in this very transaction) refuses it.
    owner_step = int(ctx.sql("SELECT checkpoint_step FROM runs WHERE run_id = %s", run_id)[0][0])
    for step in (99, owner_step):
        answer = stray_checkpoint_probe(worker_dsn, run_id, "t-dev", owner, step)
        ctx.history.record("probe", mechanism="checkpoint guard", case=f"step {step}", run_id=run_id,
                           answer=answer)
        ctx.expect(f"the checkpoint guard refuses a checkpoint of step {step} outside the owner's "
                   "fenced write (QG015)", answer == "QG015", answer, "R-EXEC-4", "R-EXEC-7")

    for role in ("qimpl_api", "qimpl_worker"):
        seen = rls_probes(ctx.deployment.app_dsn(role), run_id, victim="t-dev", intruder="t-other")
        ctx.history.record("probe", mechanism="rls", role=role, run_id=run_id, answers=seen)
        for what, answer in seen.items():
            want = "error 42501" if what.startswith("insert") else "0 rows"
            there = 1
            if what == "read workspace_grants":  # the tenant's grants exist: hidden, not absent
                there = int(ctx.sql("SELECT count(*) FROM workspace_grants WHERE tenant_id = 't-dev'")[0][0])
            elif what.startswith("read "):  # the rows exist: hidden, not absent
                there = int(ctx.sql(f"SELECT count(*) FROM {what.removeprefix('read ')}"
                                    " WHERE run_id = %s", run_id)[0][0])
            ctx.expect(f"row-level security: {role} of t-other, {what}: {want}",
                       answer == want and there > 0, f"{answer} ({there} rows exist)", "R-AUTH-4")

    after = _owner_row(ctx, run_id)
    ctx.expect("the probes changed nothing", after == before, f"{before} -> {after}", "R-EXEC-7")
    ctx.release_barrier("probe")
    done = ctx.wait_terminal(api, run_id)
    ctx.expect("the owner, untouched by the probes, completes the run", done["state"] == "completed",
               str(done.get("state")), "R-EXEC-7")

    final = _owner_row(ctx, run_id)
    last = {"row_version": int(final["row_version"]), "generation": int(final["generation"]),
            "attempt": int(final["owner_attempt"])}
    answer = fence_probe(worker_dsn, run_id, "t-dev", last, step=4)
    ctx.expect("the last owner's own token writes nothing to its completed run",
               answer in ("refused", "guard:QG001"), answer, "R-STATE-1")
    answer = guard_probe(worker_dsn, run_id, "t-dev", "row_version = row_version + 1")
    ctx.expect("the guard refuses any write to a terminal run (QG001)", answer == "QG001", answer,
               "R-STATE-1")

    # QG006 alone: a run parked awaiting input whose deadline passed may only end. Nothing
    # else refuses a resume's write here (no owner to fence, no tool call unsettled).
    # A 3 s deadline: time to park first even on a saturated machine (at 1 s, a loaded run
    # sometimes expired before it parked), then its deadline passes while it waits.
    late = ctx.create_run(api, prompt=make_prompt(steps=2, park={"step": 1, "kind": "input"}), deadline_seconds=3)
    assert late is not None and late.status_code == 202, late
    late_id = late.json()["run_id"]
    ctx.wait_state(api, late_id, "awaiting_input")
    wait_until(lambda: bool(ctx.sql("SELECT clock_timestamp() > deadline_at FROM runs WHERE run_id = %s",
                                    late_id)[0][0]), timeout_s=10, what="the parked run's deadline", interval_s=0.05)
    answer = guard_probe(ctx.deployment.app_dsn("qimpl_api"), late_id, "t-dev",
                          "state = 'accepted', generation = generation + 1, row_version = row_version + 1, owner_attempt = NULL")
    ctx.history.record("probe", mechanism="guard", case="resume after the deadline", run_id=late_id, answer=answer)
    ctx.expect("the guard refuses a new generation after the deadline: the run may only end (QG006)",
               answer == "QG006", answer, "R-EXEC-8")
    ended = ctx.cancel_run(api, late_id)
    ctx.expect("that run, cancelled after its deadline, ends expired",
               ctx.wait_terminal(api, late_id)["state"] == "expired", str(ended)[:200], "R-EXEC-8")

    # QG006 from the checkpoint guard: a fenced write that passed the run's guard before
    # the deadline, and its checkpoint row a moment after it (the owner's two statements
    # with a slow round trip between them). A 4 s deadline: time to reach the barrier.
    held = ctx.create_run(api, prompt=make_prompt(steps=3, barrier={"step": 2, "name": "late-checkpoint"}),
                          deadline_seconds=4)
    assert held is not None and held.status_code == 202, held
    held_id = held.json()["run_id"]
    ctx.wait_barrier("late-checkpoint")
    answer = late_checkpoint_probe(worker_dsn, held_id, "t-dev")
    ctx.history.record("probe", mechanism="checkpoint guard", case="checkpoint after the deadline",
                       run_id=held_id, answer=answer)
    ctx.expect("the checkpoint guard refuses a checkpoint row after the deadline, its run's write "
               "before it (QG006)", answer == "QG006", answer, "R-EXEC-8")
    ctx.release_barrier("late-checkpoint")
    ctx.expect("that run ends expired", ctx.wait_terminal(api, held_id)["state"] == "expired",
               held_id, "R-EXEC-8")


@scenario(
    "owner-cut-off-from-temporal",
    title="Temporal's server is paused for 3 x the heartbeat timeout while the owner holds a run "
          "mid-step, its database session alive: no later attempt claims the run while that "
          "session lives, and the run completes. Whether a later attempt tries the lock while it "
          "lives is Temporal's timing (figure lock_contenders_seen; the check covers only when one "
          "did); owner-partitioned-from-temporal contests it in every run",
    requirements=("R-EXEC-2", "R-EXEC-7", "R-Q-2"),
    faults=("SIGSTOP of the Temporal server", "SIGCONT of the Temporal server"),
    needs_platform=True,
)
def owner_cut_off_from_temporal(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker("worker-1")
    ctx.processes.worker("worker-2")
    h = ctx.deployment.heartbeat_timeout_s
    run_id = ctx.create_run(api, prompt=make_prompt(steps=3, barrier={"step": 2, "name": "cut"}))
    assert run_id is not None and run_id.status_code == 202, run_id
    run = str(run_id.json()["run_id"])
    held = ctx.wait_barrier("cut")
    def owner_pids() -> tuple[set[int], float]:
        rows = ctx.sql("SELECT pid, extract(epoch FROM clock_timestamp())::float8 FROM pg_stat_activity"
                       f" WHERE pid IN {LEASE_PIDS_SQL} UNION ALL"
                       " SELECT NULL, extract(epoch FROM clock_timestamp())::float8", run)
        return {int(r[0]) for r in rows if r[0] is not None}, float(rows[-1][1])

    first, _ = owner_pids()
    ctx.nemesis.pause_temporal(ctx.stack)
    try:
        lived = True
        until = time.monotonic() + 3 * h
        while time.monotonic() < until:  # the pause's length is the fault itself
            lived = lived and owner_pids()[0] == first
            time.sleep(0.1)
    finally:
        ctx.nemesis.resume_temporal(ctx.stack)
    ctx.expect("the owner's database session lived through Temporal's pause", lived and bool(first),
               f"owner sessions {sorted(first)}", "R-EXEC-2")
    ctx.release_barrier("cut")
    # The DB-clock time the first owner's session was last seen alive: no other attempt's
    # claim may be earlier (two owners at once).
    last_alive = 0.0
    contenders: set[int] = set()  # other attempts' lease sessions seen beside the first's
    stop_by = time.monotonic() + 60
    while time.monotonic() < stop_by:
        pids, now = owner_pids()
        if pids & first:
            last_alive = now
            contenders |= pids - first
        else:
            break
        time.sleep(0.05)
    ctx.figures["lock_contenders_seen"] = len(contenders)
    done = ctx.wait_terminal(api, run, timeout_s=60)
    ctx.expect("the run completed", done["state"] == "completed", done["state"], "R-EXEC-2")
    token = f"{run}:1:{held['attempt']}"
    early = writes_by_others_until(ctx, run, token, last_alive)
    # Judged by the later attempts seen trying the lock while the first session lived: in
    # most runs Temporal fails the first attempt as it resumes and the next one comes after
    # that session ended, so the lock is never contested (a reviewer's finding: the check
    # passed with the lock ignored; owner-partitioned-from-temporal contests it always).
    ctx.expect("no other attempt wrote while the first owner's session lived", not early,
               f"{len(early)} writes before {last_alive:.3f}: {early[:3]}; {len(contenders)} other "
               "attempt(s) seen trying the lock meanwhile", "R-EXEC-2", "R-EXEC-7", judged=len(contenders))


#: How many times kill-at-random-moments strikes its run's owner.
RANDOM_KILLS = 5


@scenario(
    "kill-at-random-moments",
    title="SIGKILL the owner of a 150-step run with fast steps at five seeded random moments "
          "(not at named points), a fresh worker after each: a probe for gaps no crash point "
          "names (a split write is also refused outright by the guard, QG015); the run "
          "completes with its answer and every step is checkpointed once",
    requirements=("R-EXEC-3", "R-EXEC-4", "R-STATE-1", "R-Q-2"),
    faults=("sigkill of the owner at a random moment",),
)
def kill_at_random_moments(ctx: ScenarioContext) -> None:
    from qualify.faults import owned_runs
    from qualify.scenarios.lifecycle import accepted

    api = ctx.processes.api()
    workers = [ctx.processes.worker("worker-1")]
    run_id = accepted(ctx, api, prompt=make_prompt(steps=150, delay_ms=3, answer="random moments"))
    kills = 0
    for i in range(RANDOM_KILLS):
        # Wait (bounded) for a live owner that is past its claim, then strike at a moment
        # drawn from the scenario's seed: the moment, not a point in the code, is the fault.
        stop_by = time.monotonic() + 30
        owner = None
        while owner is None and time.monotonic() < stop_by:
            owner = next((w for w in workers if w.alive and owned_runs(w, ctx.deployment.dsn)), None)
            if owner is None:
                if ctx.sql("SELECT state FROM runs WHERE run_id = %s", run_id)[0][0] == "completed":
                    break
                time.sleep(0.01)
        if owner is None:
            break
        time.sleep(ctx.rng.uniform(0.0, 0.15))
        ctx.nemesis.sigkill(owner, moment=i)
        kills += 1
        workers.append(ctx.processes.spawn_worker(f"worker-{len(workers) + 1}"))
    done = ctx.wait_terminal(api, run_id, timeout_s=120)
    ctx.figures["random_kills"] = float(kills)
    # The kills are the probe: had the run completed before they all struck, or the kills
    # hit workers that did not hold the run, every check below would pass having survived
    # less. Each kill struck a worker holding the run's lease (its named owner session);
    # a kill between that session's lock and its claim leaves no claim of its attempt, so
    # the claims are at least two, not one per kill (5 kills, 5 claims once: attempt 4 was
    # struck holding the lock, unclaimed).
    owners = ctx.sql("SELECT count(DISTINCT owner_attempt) FROM run_transitions"
                     " WHERE run_id = %s AND owner_attempt IS NOT NULL", run_id)[0][0]
    ctx.expect(f"all {RANDOM_KILLS} seeded kills struck a worker holding the run's lease mid-run, "
               "and the run changed hands", kills == RANDOM_KILLS and owners >= 2,
               f"{kills} kills, {owners} claiming attempts", "R-Q-2", judged=kills)
    ctx.expect("the run completed with its answer after the kills",
               done["state"] == "completed" and done["result_json"] == {"answer": "random moments"},
               f"{done['state']} after {kills} kills", "R-EXEC-4")
