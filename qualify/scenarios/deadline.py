"""The deadline at its edge (R-EXEC-8, R-EXEC-12, R-RESUME-1): resumes sent a few
milliseconds either side of a parked run's deadline, by the database's clock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from qualify import http
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess, faketime_env
from qualify.scenarios.base import API_KEY, ScenarioContext, outcome, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.sweeps import poll_until
from qualify.schedule import SKEW_S

#: When each resume is sent relative to its run's deadline (seconds, database clock); a
#: resume reaches its UPDATE some 50 ms after it is sent, but several hundred ms on a
#: saturated machine (two slices on 2 cores), and a tester saw the harness's own thread
#: send the 1 s one 0.88 s late under a heavier load: the one sent 2 s before still lands
#: before the deadline there, so both sides are always struck, and the others probe the edge.
OFFSETS = (-2.0, -1.0, -0.3, -0.15, -0.03, 0.0, 0.03, 0.1)
#: Each run's deadline, seconds: the 4.5 s allowed for parking all of them, then the
#: earliest offset, rounded up to a whole second.
DEADLINE_S = 7


@scenario(
    "resume-at-the-deadline",
    title="Eight runs parked in awaiting_input with a 7 s deadline, resumes sent from 2 s "
          "before to 100 ms after each deadline by the database's clock: before, 202 and the "
          "next generation is never claimed, checkpointed or completed after the deadline; "
          "after, 409 run_terminal and the run expired; all end expired with no reconciler running",
    requirements=("R-EXEC-8", "R-EXEC-12", "R-READ-2", "R-RESUME-1", "R-RESUME-2"),
)
def resume_at_the_deadline(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    # Steps of 600 ms: the generation resumed 2 s before its deadline still has 2.4 s of
    # steps to run, so it too meets its deadline mid-step.
    script = make_prompt(steps=5, delay_ms=600, park={"step": 1, "kind": "input"})
    runs = [accepted(ctx, api, prompt=script, deadline_seconds=DEADLINE_S) for _ in OFFSETS]
    poll_until(ctx, "all parked", lambda: all(ctx.read_run(api, r)["state"] == "awaiting_input" for r in runs),
          timeout_s=4.5)
    offset = ctx.db_clock_offset()
    deadlines = {r: datetime.fromisoformat(ctx.read_run(api, r)["deadline_at"]).timestamp() for r in runs}

    def resume_at(run_id: str, delta: float) -> tuple[float, int, Any]:
        at = deadlines[run_id] + delta - offset  # local time when the database reads deadline + delta
        while (left := at - time.time()) > 0:
            time.sleep(max(left - 0.002, 0.0005))  # one long sleep, then 0.5 ms steps
        ctx.history.record("client", op="resume", phase="invoke", run_id=run_id, offset_s=delta)
        resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume",
                          headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": f"edge-{run_id}"},
                          json={"additional_prompt": "just in time?"}, timeout=15)
        body = resp.json()
        ctx.history.record("client", op="resume", phase="ok" if resp.status_code == 202 else "fail",
                           run_id=run_id, status=resp.status_code, code=body.get("code"))
        return delta, resp.status_code, body.get("code")

    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {r: pool.submit(resume_at, r, d) for r, d in zip(runs, OFFSETS, strict=True)}
        answers: dict[str, tuple[float, int, Any]] = {r: f.result() for r, f in futures.items()}
    finals = {r: ctx.wait_terminal(api, r, timeout_s=20) for r in runs}
    ctx.expect("every run ended expired with deadline_exceeded",
               all(f["state"] == "expired" and f["error_code"] == "deadline_exceeded" for f in finals.values()),
               "; ".join(f"{r[:8]}: {outcome(f)}" for r, f in finals.items()),
               "R-EXEC-8", judged=len(finals))
    # A run the deadline ended while it waited for input asks for nothing any more (R-READ-2).
    parked = {r for r in runs if ctx.sql("SELECT count(*) FROM run_transitions WHERE run_id = %s"
                                         " AND old_state = 'awaiting_input' AND new_state = 'expired'", r)[0][0]}
    pending = {r[:8]: f["result_json"] for r, f in finals.items()
               if set(f.get("result_json") or {}) & {"pending_input", "pending_approval"}}
    ctx.expect("no ended run's result_json still holds a pending request", bool(parked) and not pending,
               f"{len(parked)} expired while awaiting input; still pending: {pending}", "R-READ-2",
               judged=len(parked))
    bad = [f"{r[:8]} at {d * 1000:+.0f} ms: {s} {c}" for r, (d, s, c) in answers.items()
           if not (s == 202 or (s == 409 and c == "run_terminal"))]
    ctx.expect("each resume answered 202 or 409 run_terminal", not bad, "; ".join(bad), "R-RESUME-2")
    statuses = sorted(s for _, s, _ in answers.values())
    ctx.expect("both sides of the deadline were struck (202 before, 409 after)",
               202 in statuses and 409 in statuses, str(statuses), "R-EXEC-8")
    for run_id, (delta, status, _) in answers.items():
        resumed = ctx.sql("SELECT count(*) FROM run_transitions WHERE run_id = %s"
                          " AND old_state = 'awaiting_input' AND new_state = 'accepted'", run_id)[0][0]
        # Named by the resume's fixed offset, never by the run id or the answer, so two
        # runs of the same code have the same checks (``qualify diff``).
        ctx.expect(f"the resume {delta * 1000:+.0f} ms from its deadline: the answer agrees with the record",
                   resumed == (1 if status == 202 else 0),
                   f"{run_id[:8]}: answered {status}; {resumed} resume transitions", "R-RESUME-1")


#: Their deadlines (s): the long run's ends mid-run, the short run's is far away.
SKEWED_SHORT_DEADLINE_S = 6
SKEWED_LONG_DEADLINE_S = 120


@scenario(
    "skewed-worker-clocks-meet-the-deadline",
    title=f"A worker whose wall clock is {SKEW_S} s ahead owns a run with a {SKEWED_LONG_DEADLINE_S} s "
          f"deadline: it completes (its clock never expires it); a worker {SKEW_S} s behind owns a "
          f"run that outlives its {SKEWED_SHORT_DEADLINE_S} s deadline: it ends expired at the "
          "deadline by the database's clock, nothing asked or written after it",
    requirements=("R-EXEC-8", "R-EXEC-12", "R-Q-2"),
    faults=(f"worker clock skewed +{SKEW_S} s", f"worker clock skewed -{SKEW_S} s"),
)
def skewed_worker_clocks_meet_the_deadline(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ahead = ctx.processes.worker("worker-ahead", **faketime_env(SKEW_S))
    short = accepted(ctx, api, prompt=make_prompt(steps=3, answer="in time", barrier={"step": 1, "name": "ahead"}),
                     deadline_seconds=SKEWED_LONG_DEADLINE_S)
    _skewed_owner(ctx, ahead, "ahead", short, SKEW_S)
    done = _terminal_or_last(ctx, api, short, timeout_s=30)
    ctx.expect(f"the run of the worker {SKEW_S} s ahead completed: its own clock did not expire it",
               done["state"] == "completed", outcome(done), "R-EXEC-12")
    ahead.stop()
    behind = ctx.processes.worker("worker-behind", **faketime_env(-SKEW_S))
    long = accepted(ctx, api, prompt=make_prompt(steps=200, answer="never", delay_ms=100,
                                                 barrier={"step": 1, "name": "behind"}),
                    deadline_seconds=SKEWED_SHORT_DEADLINE_S)
    _skewed_owner(ctx, behind, "behind", long, -SKEW_S)
    ended = _terminal_or_last(ctx, api, long, timeout_s=SKEWED_SHORT_DEADLINE_S + 20)
    rows = ctx.sql("SELECT extract(epoch FROM t.at - r.deadline_at)::float8 FROM run_transitions t"
                   " JOIN runs r USING (run_id) WHERE t.run_id = %s AND t.new_state = 'expired'", long)
    late = float(rows[0][0]) if rows else None
    ctx.figure("expired_after_the_deadline_s", late if late is not None else -1.0, at_least=0, at_most=2.0,
               unit="s")
    ctx.expect(f"the run of the worker {SKEW_S} s behind ended expired within 2 s after its deadline"
               " (database clock)", ended["state"] == "expired" and late is not None and 0 <= late <= 2.0,
               f"{outcome(ended)}, {late} s after deadline_at", "R-EXEC-8")


def _terminal_or_last(ctx: ScenarioContext, api: ManagedProcess, run_id: str, *, timeout_s: float) -> dict[str, Any]:
    """The run once terminal, or its last read when it is not within ``timeout_s``: a run
    the deadline failed to end is this scenario's finding, judged by its check, not a
    harness error."""
    try:
        return ctx.wait_terminal(api, run_id, timeout_s=timeout_s)
    except HarnessError:
        return ctx.read_run(api, run_id)


def _skewed_owner(ctx: ScenarioContext, worker: ManagedProcess, barrier: str, run_id: str, skew_s: int) -> None:
    """Wait for ``worker`` to hold ``run_id`` at ``barrier``, record the skew it runs with
    (its own wall clock against the harness's), release it."""
    try:
        held = ctx.wait_barrier(barrier)
    except HarnessError as exc:  # its clock kept it from even asking: judged by the checks after
        ctx.expect(f"the worker {skew_s:+d} s off took its run and asked its first step", False, str(exc),
                   "R-EXEC-12")
        return
    seen_t = time.time()
    ctx.nemesis.clock_skew(worker, expected_s=skew_s, worker_t=float(held.get("wall_t", held["t"])),
                           seen_t=seen_t, dsn=ctx.deployment.dsn, run_id=run_id)
    ctx.release_barrier(barrier)
