"""The deadline at its edge (R-EXEC-8, R-EXEC-12, R-RESUME-1): resumes sent a few
milliseconds either side of a parked run's deadline, by the database's clock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx

from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import API_KEY, ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.reconciler import _wait

#: When each resume is sent relative to its run's deadline (seconds, database clock); a
#: resume reaches its UPDATE some 50 ms after it is sent.
OFFSETS = (-0.3, -0.15, -0.03, 0.0, 0.03, 0.1)


def _db_clock_offset(ctx: ScenarioContext) -> float:
    """The database's clock minus this process's (seconds), from the best of a few
    round trips."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        t0 = time.time()
        db = float(ctx.sql("SELECT extract(epoch FROM clock_timestamp())::float8")[0][0])
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, db - (t0 + t1) / 2)
    assert best is not None
    return best[1]


@scenario(
    "resume-at-the-deadline",
    title="Six runs parked in awaiting_input with a 6 s deadline, resumes sent from 300 ms "
          "before to 100 ms after each deadline by the database's clock: before, 202 and the "
          "next generation is never claimed, checkpointed or completed after the deadline; "
          "after, 409 run_terminal and the run expired; all end expired with no reconciler running",
    requirements=("R-EXEC-8", "R-EXEC-12", "R-RESUME-1", "R-RESUME-2"),
)
def resume_at_the_deadline(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    script = make_prompt(steps=3, delay_ms=300, park={"step": 1, "kind": "input"})
    runs = [accepted(ctx, api, prompt=script, deadline_seconds=6) for _ in OFFSETS]
    _wait(ctx, "all parked", lambda: all(ctx.read_run(api, r)["state"] == "awaiting_input" for r in runs),
          timeout_s=4.5)
    offset = _db_clock_offset(ctx)
    deadlines = {r: datetime.fromisoformat(ctx.read_run(api, r)["deadline_at"]).timestamp() for r in runs}

    def resume_at(run_id: str, delta: float) -> tuple[float, int, Any]:
        at = deadlines[run_id] + delta - offset  # local time when the database reads deadline + delta
        while time.time() < at:
            time.sleep(0.0005)
        ctx.history.record("client", op="resume", phase="invoke", run_id=run_id, offset_s=delta)
        resp = httpx.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume",
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
               "; ".join(f"{r[:8]}: {f['state']}/{f['error_code']}" for r, f in finals.items()),
               "R-EXEC-8", judged=len(finals))
    bad = [f"{r[:8]} at {d * 1000:+.0f} ms: {s} {c}" for r, (d, s, c) in answers.items()
           if not (s == 202 or (s == 409 and c == "run_terminal"))]
    ctx.expect("each resume answered 202 or 409 run_terminal", not bad, "; ".join(bad), "R-RESUME-2")
    statuses = sorted(s for _, s, _ in answers.values())
    ctx.expect("both sides of the deadline were struck (202 before, 409 after)",
               202 in statuses and 409 in statuses, str(statuses), "R-EXEC-8")
    for run_id, (_, status, _) in answers.items():
        resumed = ctx.sql("SELECT count(*) FROM run_transitions WHERE run_id = %s"
                          " AND old_state = 'awaiting_input' AND new_state = 'accepted'", run_id)[0][0]
        ctx.expect(f"{run_id[:8]}: the answer ({status}) agrees with the record",
                   resumed == (1 if status == 202 else 0), f"{resumed} resume transitions", "R-RESUME-1")
