"""``qualify selftest`` (R-Q-9): does a broken mechanism fail qualification?

Each mutant of ``qualify.mutants.CATALOG`` is applied to a temporary copy of ``qimpl``
and ``qualify``; its scenario then runs from the copy (a real ``qualify run`` in a
subprocess, with its own disposable stack), and the mutant is *caught* when the verdict
is ``fail`` with the catalog's check among the failed ones. The result — per mutant,
caught or missed and the checks that fired — and the kill rate go to
``<reports>/<stamp>-selftest/selftest.json`` and ``selftest.md``. Exit 0 only when every
mutant was caught.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from qualify.errors import UsageError
from qualify.mutants import CATALOG, Mutant
from qualify.provenance import utc_stamp

__all__ = ["apply_mutant", "run_selftest"]

ROOT = Path(__file__).resolve().parents[1]
#: Longest one mutant's scenario may run (seconds) before it counts as missed.
MUTANT_TIMEOUT_S = 600


def apply_mutant(mutant: Mutant, dest: Path, root: Path = ROOT) -> None:
    """Copy ``qimpl`` and ``qualify`` from ``root`` to ``dest`` and apply the mutant's
    patches there. UsageError when a patch does not apply exactly once (a stale catalog)."""
    for part in ("qimpl", "qualify"):
        shutil.copytree(root / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    for patch in mutant.patches:
        target = dest / patch.path
        text = target.read_text()
        if text.count(patch.old) != 1:
            raise UsageError(f"mutant {mutant.name} no longer applies to {patch.path}: update the catalog")
        target.write_text(text.replace(patch.old, patch.new))


def _run_one(mutant: Mutant, *, seed: int, work: Path) -> dict[str, Any]:
    copy = work / "copy"
    apply_mutant(mutant, copy)
    reports = work / "reports"
    env = {**os.environ, "PYTHONPATH": str(copy)}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "qualify.cli", "run", "-s", mutant.scenario, "--seed", str(seed),
             "--reruns", "0", "--reports-dir", str(reports)],
            cwd=copy, env=env, capture_output=True, text=True, timeout=MUTANT_TIMEOUT_S, check=False)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    found = sorted(reports.glob("*/summary.json"))
    verdict, failed = "timeout" if code is None else "no report", []
    if found:
        summary = json.loads(found[-1].read_text())
        scenarios = summary.get("scenarios") or [{}]
        verdict = str(scenarios[0].get("status"))
        failed = [str(c["name"]) for c in scenarios[0].get("checks", []) if c.get("ok") is False]
    return {"name": mutant.name, "mechanism": mutant.mechanism, "scenario": mutant.scenario,
            "expected_check": mutant.check, "verdict": verdict, "failed_checks": failed,
            "caught": verdict == "fail" and mutant.check in failed, "exit_code": code,
            "duration_s": round(time.monotonic() - t0, 1)}


def run_selftest(names: Sequence[str], *, reports_root: Path, seed: int = 3,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], Path, int]:
    """Run the named mutants (all when empty); returns (summary, report dir, exit code)."""
    by_name = {m.name: m for m in CATALOG}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UsageError(f"unknown mutants {unknown}; known: {sorted(by_name)}")
    chosen = [by_name[n] for n in names] if names else list(CATALOG)
    with tempfile.TemporaryDirectory(prefix="qualify-selftest-") as tmp:
        for m in chosen:  # refuse a stale catalog before spending minutes on the rest
            apply_mutant(m, Path(tmp) / m.name)
    results = []
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix="qualify-selftest-") as tmp:
            result = _run_one(m, seed=seed, work=Path(tmp))
        results.append(result)
        if progress:
            progress(result)
    caught = sum(r["caught"] for r in results)
    summary = {"seed": seed, "mutants": results, "caught": caught, "total": len(results),
               "kill_rate": round(caught / len(results), 3) if results else 1.0}
    out = reports_root / f"{utc_stamp()}-selftest"
    out.mkdir(parents=True, exist_ok=True)
    (out / "selftest.json").write_text(json.dumps(summary, indent=2))
    lines = ["# qualify selftest", "", f"Kill rate: {caught}/{len(results)} (seed {seed})", "",
             "| mutant | mechanism | scenario | verdict | caught by |", "|---|---|---|---|---|"]
    for r in results:
        by = r["expected_check"] if r["caught"] else "MISSED (" + (", ".join(r["failed_checks"]) or "no check") + ")"
        lines.append(f"| {r['name']} | {r['mechanism']} | {r['scenario']} | {r['verdict']} | {by} |")
    (out / "selftest.md").write_text("\n".join(lines) + "\n")
    return summary, out, 0 if caught == len(results) else 1
