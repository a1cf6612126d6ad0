"""``qualify selftest`` (R-Q-9): does a broken mechanism fail qualification?

Each mutant of ``qualify.mutants.CATALOG`` is applied to a temporary copy of ``qimpl``
and ``qualify``; its scenario then runs from the copy (a real ``qualify run`` in a
subprocess, with its own disposable stack), and the mutant is *caught* when the verdict
is ``fail`` with the catalog's check among the failed ones.

The self-test proves itself first: the *baseline* runs every chosen mutant's scenario on
the unmutated code with the same seeds, and a mutant whose scenario does not pass there
is ``unproven`` (its failure might be the scenario's, not the mutant's), never caught.
Each mutant runs with every seed asked for (``seeds``: timing-dependent catches must
hold on more than one schedule) and is caught only when caught on each. The result —
the baseline, per mutant and seed caught or missed and the checks that fired — and the
kill rate go to ``<reports>/<stamp>-selftest/selftest.json`` and ``selftest.md``. Exit 0
only when every mutant was caught.
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
    patches there (each within the text after its ``after`` anchor, when it has one).
    UsageError when a patch does not apply exactly once (a stale catalog)."""
    for part in ("qimpl", "qualify"):
        shutil.copytree(root / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    for patch in mutant.patches:
        target = dest / patch.path
        text = target.read_text()
        head, anchor, tail = text.partition(patch.after) if patch.after else ("", "", text)
        if (patch.after and text.count(patch.after) != 1) or tail.count(patch.old) != 1:
            raise UsageError(f"mutant {mutant.name} no longer applies to {patch.path}: update the catalog")
        target.write_text(head + anchor + tail.replace(patch.old, patch.new))


def _qualify(scenarios: Sequence[str], *, seed: int, cwd: Path, reports: Path, parallel: int = 1,
             timeout_s: float = MUTANT_TIMEOUT_S) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """Run ``qualify run`` on ``scenarios`` from the code in ``cwd``; (exit code or None
    on timeout, scenario id -> its document)."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    argv = [sys.executable, "-m", "qualify.cli", "run", "--seed", str(seed), "--reruns", "0",
            "--reports-dir", str(reports), "-n", str(parallel)]
    for sid in scenarios:
        argv += ["-s", sid]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    found = sorted(reports.glob("*/summary.json"))
    docs = {str(d["id"]): d for d in json.loads(found[-1].read_text()).get("scenarios", [])} if found else {}
    return code, docs


def baseline(scenarios: Sequence[str], *, seeds: Sequence[int], work: Path, parallel: int = 2
             ) -> dict[str, dict[int, str]]:
    """Each scenario's verdict per seed on the unmutated code (``ROOT``): scenario ->
    seed -> ``pass`` / ``fail`` / ... (``timeout`` / ``no report`` when the run broke)."""
    out: dict[str, dict[int, str]] = {sid: {} for sid in scenarios}
    for seed in seeds:
        code, docs = _qualify(scenarios, seed=seed, cwd=ROOT, reports=work / f"baseline-{seed}",
                              parallel=min(parallel, len(scenarios)) or 1,
                              timeout_s=MUTANT_TIMEOUT_S * max(1, len(scenarios) // max(parallel, 1)))
        for sid in scenarios:
            out[sid][seed] = str(docs[sid]["status"]) if sid in docs else (
                "timeout" if code is None else "no report")
    return out


def _run_one(mutant: Mutant, *, seed: int, work: Path) -> dict[str, Any]:
    copy = work / "copy"
    apply_mutant(mutant, copy)
    t0 = time.monotonic()
    code, docs = _qualify([mutant.scenario], seed=seed, cwd=copy, reports=work / "reports")
    doc = docs.get(mutant.scenario)
    verdict = str(doc["status"]) if doc else ("timeout" if code is None else "no report")
    failed = [str(c["name"]) for c in (doc or {}).get("checks", []) if c.get("ok") is False]
    return {"seed": seed, "verdict": verdict, "failed_checks": failed,
            "caught": verdict == "fail" and mutant.check in failed, "exit_code": code,
            "duration_s": round(time.monotonic() - t0, 1)}


def run_selftest(names: Sequence[str], *, reports_root: Path, seed: int = 3, seeds: int = 1,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], Path, int]:
    """Run the named mutants (all when empty) with ``seeds`` seeds from ``seed`` on, after
    the unmutated baseline of their scenarios; returns (summary, report dir, exit code)."""
    by_name = {m.name: m for m in CATALOG}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UsageError(f"unknown mutants {unknown}; known: {sorted(by_name)}")
    chosen = [by_name[n] for n in names] if names else list(CATALOG)
    with tempfile.TemporaryDirectory(prefix="qualify-selftest-") as tmp:
        for m in chosen:  # refuse a stale catalog before spending minutes on the rest
            apply_mutant(m, Path(tmp) / m.name)
    seed_list = [seed + i for i in range(max(1, seeds))]
    with tempfile.TemporaryDirectory(prefix="qualify-selftest-baseline-") as tmp:
        base = baseline(sorted({m.scenario for m in chosen}), seeds=seed_list, work=Path(tmp))
    results = []
    for m in chosen:
        runs = []
        for s in seed_list:
            with tempfile.TemporaryDirectory(prefix="qualify-selftest-") as tmp:
                runs.append(_run_one(m, seed=s, work=Path(tmp)))
        proven = all(base[m.scenario].get(s) == "pass" for s in seed_list)
        result = {"name": m.name, "mechanism": m.mechanism, "scenario": m.scenario,
                  "expected_check": m.check, "baseline": base[m.scenario], "proven": proven,
                  "runs": runs, "verdict": runs[-1]["verdict"],
                  "failed_checks": sorted({c for r in runs for c in r["failed_checks"]}),
                  "caught": proven and all(r["caught"] for r in runs),
                  "duration_s": round(sum(r["duration_s"] for r in runs), 1)}
        results.append(result)
        if progress:
            progress(result)
    caught = sum(r["caught"] for r in results)
    unproven = sorted({r["scenario"] for r in results if not r["proven"]})
    summary = {"seed": seed, "seeds": seed_list, "baseline": base, "unproven_scenarios": unproven,
               "mutants": results, "caught": caught, "total": len(results),
               "kill_rate": round(caught / len(results), 3) if results else 1.0}
    out = reports_root / f"{utc_stamp()}-selftest"
    out.mkdir(parents=True, exist_ok=True)
    (out / "selftest.json").write_text(json.dumps(summary, indent=2))
    seeds_said = f"seed {seed_list[0]}" if len(seed_list) == 1 else f"seeds {', '.join(map(str, seed_list))}"
    of = "" if len(results) == len(CATALOG) else f"; a selection of {len(results)} of the catalog's {len(CATALOG)} mutants"
    lines = ["# qualify selftest", "", f"Kill rate: {caught}/{len(results)} ({seeds_said}{of})",
             "", f"Baseline (unmutated code, same seeds): {len(base) - len(unproven)} of {len(base)} scenarios pass"
             + (f"; not passing, so their mutants prove nothing: {', '.join(unproven)}" if unproven else ""),
             "", "| mutant | mechanism | scenario | verdicts per seed | caught by |", "|---|---|---|---|---|"]
    for r in results:
        if r["caught"]:
            by = r["expected_check"]
        elif not r["proven"]:
            by = f"UNPROVEN (baseline {r['baseline']})"
        else:
            by = "MISSED (" + (", ".join(r["failed_checks"]) or "no check") + ")"
        verdicts = " / ".join(x["verdict"] for x in r["runs"])
        lines.append(f"| {r['name']} | {r['mechanism']} | {r['scenario']} | {verdicts} | {by} |")
    (out / "selftest.md").write_text("\n".join(lines) + "\n")
    return summary, out, 0 if caught == len(results) else 1
