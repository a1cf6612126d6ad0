"""Section 3, the peer: DBOS Transact (the ``dbos`` package, ``pip install -e '.[bench]'``)
on the same PostgreSQL server, in a database of its own, run as a subprocess.

Figures (seconds, per second): ``dbos.e2e_p50_s``/``p95`` of a 3-step workflow run
sequentially; ``dbos.tput_c<C>`` workflows per second with one process at the same
concurrencies as qimpl (``dbos.lat_c<C>_p50_s`` their latency under that load);
``dbos.resume_after_kill_s``: the process SIGKILLed inside step 2 and started again at
once -> the recovered workflow's step 2 ran in the new process (median of trials;
``dbos.restart_ready_s`` is the share spent starting the process and ``DBOS.launch``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.env import BenchEnv, Subprocess, python_m
from bench.stats import summarize
from qualify.errors import HarnessError
from qualify.procs import wait_until

__all__ = ["measure_dbos"]


def _measure(env: BenchEnv, url: str) -> dict[str, Any]:
    plan = env.plan
    levels = ",".join(f"{c}:{plan.total(c)}" for c in plan.concurrency)
    log = env.workdir / "logs" / "dbos-measure.log"
    with Subprocess(python_m("bench.dbos_app", "measure", "--db-url", url, "--sequential",
                             str(plan.sequential), "--levels", levels), log_path=log,
                    ready_line="dbos.ready") as proc:
        assert proc.proc is not None
        proc.proc.wait(timeout=900)
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("dbos.result ")]
    if not lines:
        raise HarnessError(f"the DBOS app printed no result; see {log}")
    doc = json.loads(lines[-1].removeprefix("dbos.result "))
    e2e = summarize(doc["e2e_s"])
    out: dict[str, Any] = {"dbos.e2e_p50_s": e2e.p50, "dbos.e2e_p95_s": e2e.p95}
    for c in plan.concurrency:
        level = doc[f"c{c}"]
        out[f"dbos.tput_c{c}"] = level["total"] / level["elapsed_s"]
        out[f"dbos.lat_c{c}_p50_s"] = summarize(level["latencies_s"]).p50
        env.log(f"  dbos: concurrency {c}: {out[f'dbos.tput_c{c}']:.1f} workflows/s")
    return out


def _resume_trial(env: BenchEnv, url: str, i: int) -> tuple[float, float]:
    """(SIGKILL -> step 2 ran in the restarted process, SIGKILL -> restarted process
    launched), seconds."""
    control = env.workdir / f"dbos-kill-{i}"
    control.mkdir(parents=True, exist_ok=True)
    wid = f"bench-kill-{uuid.uuid4().hex[:8]}"
    args = ["--db-url", url, "--control", str(control), "--workflow-id", wid]
    logs = env.workdir / "logs"
    held = Subprocess(python_m("bench.dbos_app", "hold", *args), log_path=logs / f"dbos-hold-{i}.log",
                      env={**os.environ, "BENCH_DBOS_HOLD": "1"}, ready_line="dbos.held")
    try:
        held.start()
        killed_at = time.time()
        held.sigkill()
    finally:
        held.stop()
    again = Subprocess(python_m("bench.dbos_app", "recover", *args), log_path=logs / f"dbos-recover-{i}.log",
                       ready_line="dbos.ready")
    try:
        again.start()
        ready_at = time.time()
        done = Path(control, "step2.done")
        wait_until(done.exists, timeout_s=60, what="DBOS recovery of step 2", proc=again.proc)
        wait_until(lambda: done.read_text() != "", timeout_s=5, what="step2.done written")
        return float(done.read_text()) - killed_at, ready_at - killed_at
    finally:
        again.stop()


def measure_dbos(env: BenchEnv) -> dict[str, Any]:
    """Every peer figure (see the module docstring). Raises HarnessError when the DBOS
    app fails; ImportError surfaces as such when ``dbos`` is not installed."""
    import dbos  # noqa: F401 - fail early with the package's own error

    url = env.plain_database("bench_dbos")
    out = _measure(env, url)
    trials = [_resume_trial(env, url, i) for i in range(max(1, env.plan.pause_trials))]
    out["dbos.resume_after_kill_s"] = summarize([t[0] for t in trials]).p50
    out["dbos.restart_ready_s"] = summarize([t[1] for t in trials]).p50
    env.log(f"  dbos: SIGKILL -> step 2 again {out['dbos.resume_after_kill_s']:.2f} s "
            f"(process up after {out['dbos.restart_ready_s']:.2f} s)")
    return out
