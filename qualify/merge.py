"""Merge the reports of ``qualify run --shard K/N`` into one report and one verdict (R-Q-10).

Each machine of a CI matrix runs one shard of the same selection and seed; ``qualify
merge`` checks that the shards are of one session (same seed, same selection, same code,
each of ``1..N`` exactly once, every selected scenario reported exactly once), puts their
scenarios into one report in selection order, and judges it as one run: a merged *full*
selection must also strike every crash point and pass the requirement gate, exactly as
an unsharded full run. Shards that do not fit together are a harness error (``crashed``),
never a pass.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qualify.errors import UsageError
from qualify.report import build_summary, write_report
from qualify.verdict import EXIT_CODES, Verdict

__all__ = ["merge_reports", "merge_shards"]


def merge_shards(summaries: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The scenario documents of ``summaries`` (each a shard's ``summary.json``) in the
    selection's order, and the problems that stop them from being one session (pure)."""
    problems: list[str] = []
    shards = [s.get("shard") for s in summaries]
    if not summaries or any(sh is None for sh in shards):
        return [], ["every report to merge must come from qualify run --shard K/N"]
    count = {sh["count"] for sh in shards if sh}
    selection = {tuple(sh["selection"]) for sh in shards if sh}
    for what, values in (("seed", {s["seed"] for s in summaries}), ("shard count", count),
                         ("selection", selection), ("git sha", {s.get("git_sha") for s in summaries})):
        if len(values) != 1:
            problems.append(f"the shards differ in their {what}")
    if len(count) == 1:
        (n,) = count
        indexes = Counter(sh["index"] for sh in shards if sh)
        missing = sorted(set(range(1, n + 1)) - set(indexes))
        if missing:
            problems.append(f"missing shard(s) {', '.join(f'{k}/{n}' for k in missing)}")
        twice = sorted(k for k, c in indexes.items() if c > 1)
        if twice:
            problems.append(f"shard(s) given twice: {', '.join(f'{k}/{n}' for k in twice)}")
    for s in summaries:
        if s.get("verdict") == str(Verdict.CRASHED) and s.get("error"):
            problems.append(f"shard {s['shard']['index']}/{s['shard']['count']} crashed: {s['error']}")
    docs = [d for s in summaries for d in s["scenarios"]]
    order = list(next(iter(selection))) if len(selection) == 1 else []
    seen = Counter(d["id"] for d in docs)
    refused = {i for s in summaries for i in s.get("refused", [])}
    absent = [i for i in order if seen[i] == 0 and i not in refused]
    if absent:
        problems.append(f"{len(absent)} selected scenario(s) reported by no shard: {', '.join(absent[:5])}")
    dup = sorted(i for i, c in seen.items() if c > 1)
    if dup:
        problems.append(f"scenario(s) reported twice: {', '.join(dup[:5])}")
    rank = {sid: i for i, sid in enumerate(order)}
    return sorted(docs, key=lambda d: rank.get(d["id"], len(rank))), problems


def merge_reports(shard_dirs: Sequence[Path], reports_root: Path) -> tuple[dict[str, Any], Path, int]:
    """Read each shard's ``summary.json``, merge, copy each scenario's directory (history,
    logs) and write the merged report under ``reports_root``. Returns (summary, report
    directory, exit code). UsageError (nothing written) when a directory holds no finished
    report, holds the report of a run that was not a shard, or is given twice; shards that
    do not fit together are merged into a ``crashed`` report."""
    from qualify.diff import load_summary
    from qualify.scenarios import REGISTRY
    from qualify.session import crash_point_catalog, full_run_gates, mark_selection, new_report_dir

    summaries = []
    given = Counter(d.resolve() for d in shard_dirs)
    if twice := [str(d) for d, n in given.items() if n > 1]:
        raise UsageError(f"{', '.join(twice)}: given more than once")
    for d in shard_dirs:
        path = d / "summary.json"
        if not path.is_file():
            raise UsageError(f"{d}: no summary.json (not a finished qualify report)")
        summary = load_summary(path)  # a file cut short, or no summary at all: UsageError
        shard = summary.get("shard")
        if shard is None:
            raise UsageError(f"{d}: not the report of a shard (qualify run --shard K/N)")
        if (not isinstance(shard, dict) or not all(isinstance(shard.get(k), int) for k in ("index", "count"))
                or not isinstance(shard.get("selection"), list) or not isinstance(summary.get("seed"), int)):
            raise UsageError(f"{path}: not the report of a shard (its seed or shard fields are missing)")
        summaries.append(summary)
    docs, problems = merge_shards(summaries)
    first = summaries[0]
    report_dir = new_report_dir(reports_root, str(first.get("git_sha") or "unknown"))
    for d, s in zip(shard_dirs, summaries, strict=True):
        for doc in s["scenarios"]:
            src = d / "scenarios" / doc["id"]
            if src.is_dir() and not (report_dir / "scenarios" / doc["id"]).exists():
                shutil.copytree(src, report_dir / "scenarios" / doc["id"])
    summary = build_summary(
        scenarios=docs, seed=int(first["seed"]),
        duration_s=max(float(s.get("duration_s", 0)) for s in summaries),
        stack=first.get("stack", {}), provenance=first.get("provenance", {}), report_dir=report_dir,
        crash_catalog=list(crash_point_catalog()))
    summary["refused"] = sorted({i for s in summaries for i in s.get("refused", [])})
    mark_selection(summary, docs)  # full_run_gates says otherwise when they apply
    modes = {s.get("spawn", "auto") for s in summaries}
    summary["spawn"] = "fork" if modes == {"fork"} else sorted(modes - {"fork"})[0]
    summary["merged_from"] = [{"dir": str(d), "shard": f"{s['shard']['index']}/{s['shard']['count']}",
                               "verdict": s.get("verdict"), "duration_s": s.get("duration_s")}
                              for d, s in zip(shard_dirs, summaries, strict=True)
                              if s.get("shard")]
    if problems:
        summary["verdict"] = str(Verdict.CRASHED)
        summary["error"] = "; ".join(problems)
    elif all(s["shard"]["whole_selection"] for s in summaries):
        full_run_gates(summary, docs, refused=[REGISTRY[i] for i in summary["refused"] if i in REGISTRY])
    write_report(report_dir, summary)
    return summary, report_dir, EXIT_CODES[Verdict(summary["verdict"])]
