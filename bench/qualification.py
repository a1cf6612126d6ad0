"""Section 5, qualification: what the harness costs. Seconds, per hour.

- ``qual.boot_p50_s``: an embedded stack's boot (PostgreSQL from the cached golden data
  directory + the Temporal dev server, both ready), ``plan.boot_trials`` boots;
- ``qual.random_per_h``: random schedules per hour as the soak runs them (``qualify run
  --random N -n 4``: four slices, each with its stack and fork server, R-Q-10), from a
  session of ``plan.random_schedules`` (the boots included, so a short session
  understates an hour's rate); the session's verdict beside it, and its report kept next
  to the results when it is not ``pass``;
- ``qual.run_n1_s``/``qual.run_nauto_s`` (only with ``--qualify``: minutes each): the
  wall time of the full ``qualify run --reruns 0`` at ``-n 1`` and ``-n auto``, as a
  subprocess (``python -m qualify.cli``), with its exit code beside it, and the
  scenarios' seconds by kind (``qual.run_n1_s.<kind>``, ``qualify.timing``), where that
  run's time went.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.env import ROOT, BenchEnv
from bench.stats import summarize

__all__ = ["measure_qualification"]

#: A fixed seed: the same random schedules in every benchmark run.
SEED = 1414
#: The soak's slices (README, "The soak"): schedules mostly wait, so four share 2 cores.
SOAK_SLICES = 4


def _boots(n: int) -> list[float]:
    from qualify.stack import EmbeddedStack

    out = []
    for _ in range(n):
        stack = EmbeddedStack()
        try:
            out.append(stack.start().boot_s)
        finally:
            stack.stop()
    return out


def _random_rate(env: BenchEnv) -> tuple[float, str, str]:
    """(schedules per hour, the session's verdict, where its report was kept: only when
    the verdict is not ``pass``, else "")."""
    from qualify.session import SessionOptions, run_session

    n = env.plan.random_schedules
    summary, report_dir, _ = run_session(SessionOptions(random_n=n, seed=SEED, reruns=0, parallel=SOAK_SLICES,
                                                        reports_root=env.workdir / "qualify-random"))
    kept = ""
    if summary["verdict"] != "pass" and env.keep_dir is not None:
        kept_path = env.keep_dir / report_dir.name
        shutil.copytree(report_dir, kept_path)
        kept = str(kept_path)
    return n / float(summary["duration_s"]) * 3600, str(summary["verdict"]), kept


def _by_kind(reports: Path) -> dict[str, float]:
    """Seconds by kind (``qualify.timing.KINDS``) over the scenarios of the newest report
    under ``reports``; empty when there is none."""
    from qualify.timing import sum_by_kind

    found = sorted(reports.glob("*/summary.json"))
    return sum_by_kind(json.loads(found[-1].read_text())["scenarios"]) if found else {}


def _full_run(env: BenchEnv, parallel: str) -> tuple[float, int]:
    """(wall seconds, exit code) of the full ``qualify run -n <parallel> --reruns 0``."""
    log = env.workdir / "logs" / f"qualify-run-n{parallel}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        # subprocess.run reaps it; the harness's own children die with it (PR_SET_PDEATHSIG).
        code = subprocess.run([sys.executable, "-m", "qualify.cli", "run", "--reruns", "0", "-n", parallel,
                               "--reports-dir", str(env.workdir / f"qualify-n{parallel}")],
                              cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    return time.monotonic() - t0, code


def measure_qualification(env: BenchEnv) -> dict[str, Any]:
    """Every qualification figure (see the module docstring)."""
    out: dict[str, Any] = {"qual.boot_p50_s": summarize(_boots(env.plan.boot_trials)).p50}
    env.log(f"  qualification: boot p50 {out['qual.boot_p50_s']:.2f} s")
    out["qual.random_per_h"], out["qual.random_verdict"], out["qual.random_report"] = _random_rate(env)
    env.log(f"  qualification: {out['qual.random_per_h']:.0f} random schedules/h ({out['qual.random_verdict']})")
    if env.full_qualify:
        for parallel, key in (("1", "qual.run_n1_s"), ("auto", "qual.run_nauto_s")):
            out[key], out[f"{key}_exit"] = _full_run(env, parallel)
            env.log(f"  qualification: qualify run -n {parallel}: {out[key]:.0f} s (exit {out[f'{key}_exit']})")
            kinds = _by_kind(env.workdir / f"qualify-n{parallel}")
            out.update({f"{key}.{kind}": v for kind, v in kinds.items()})
            env.log("    scenario seconds by kind: " + ", ".join(f"{k} {v:.0f}" for k, v in kinds.items()))
    return out
