"""What changed between two sign-offs (issue 25, item 3): ``qualify diff OLD NEW`` compares
two ``summary.json`` documents (or the report directories holding them), pure.

It says which scenarios were added or removed, which changed status, which checks appeared,
disappeared or changed result in a scenario both ran, and which requirements lost or gained
coverage by the requirement gate (R-Q-8, R-Q-12) — the questions a release manager asks of
the last sign-off before signing this one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qualify.errors import UsageError

__all__ = ["diff_summaries", "load_summary", "render_diff"]


def load_summary(path: Path) -> dict[str, Any]:
    """A summary from ``path`` (a ``summary.json`` or a report directory); UsageError when
    there is none or it is not one."""
    file = path / "summary.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{file}: not a readable summary.json ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise UsageError(f"{file}: not a qualify summary (no scenarios)")
    return doc


def _checks(scenario: Mapping[str, Any]) -> dict[str, Any]:
    return {str(c.get("name")): c.get("ok") for c in scenario.get("checks", [])}


def _covered(summary: Mapping[str, Any]) -> set[str]:
    from qualify.coverage import gate
    from qualify.spec_ids import REQUIREMENTS

    judged = summary.get("requirement_gate") or gate(summary["scenarios"], REQUIREMENTS)
    return set(judged["covered"])


def diff_summaries(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``{verdict: [old, new], scenarios_added, scenarios_removed, status_changed: {id: [old,
    new]}, checks_added: {id: [...]}, checks_removed: {id: [...]}, checks_changed: {id:
    {check: [old ok, new ok]}}, coverage_lost, coverage_gained}`` (lists sorted)."""
    before = {s["id"]: s for s in old["scenarios"]}
    after = {s["id"]: s for s in new["scenarios"]}
    both = sorted(set(before) & set(after))
    added: dict[str, list[str]] = {}
    removed: dict[str, list[str]] = {}
    changed: dict[str, dict[str, list[Any]]] = {}
    for sid in both:
        was, now = _checks(before[sid]), _checks(after[sid])
        if plus := sorted(set(now) - set(was)):
            added[sid] = plus
        if minus := sorted(set(was) - set(now)):
            removed[sid] = minus
        if moved := {c: [was[c], now[c]] for c in sorted(set(was) & set(now)) if was[c] != now[c]}:
            changed[sid] = moved
    covered_before, covered_after = _covered(old), _covered(new)
    return {
        "verdict": [old.get("verdict"), new.get("verdict")],
        "scenarios_added": sorted(set(after) - set(before)),
        "scenarios_removed": sorted(set(before) - set(after)),
        "status_changed": {sid: [before[sid].get("status"), after[sid].get("status")] for sid in both
                           if before[sid].get("status") != after[sid].get("status")},
        "checks_added": added, "checks_removed": removed, "checks_changed": changed,
        "coverage_lost": sorted(covered_before - covered_after),
        "coverage_gained": sorted(covered_after - covered_before),
    }


def render_diff(d: Mapping[str, Any]) -> str:
    """The diff as markdown (the terminal shows it as is)."""
    lines = [f"verdict: {d['verdict'][0]} -> {d['verdict'][1]}"]
    if d["coverage_lost"]:
        lines.append(f"**requirements that lost coverage**: {', '.join(d['coverage_lost'])}")
    if d["coverage_gained"]:
        lines.append(f"requirements newly covered: {', '.join(d['coverage_gained'])}")
    for key, label in (("scenarios_added", "scenarios added"), ("scenarios_removed", "scenarios removed")):
        if d[key]:
            lines.append(f"{label} ({len(d[key])}): {', '.join(d[key])}")
    for sid, (was, now) in d["status_changed"].items():
        lines.append(f"{sid}: {was} -> {now}")
    for key, label in (("checks_added", "+"), ("checks_removed", "-")):
        for sid, names in d[key].items():
            lines += [f"{sid}: {label} {name}" for name in names]
    for sid, moved in d["checks_changed"].items():
        lines += [f"{sid}: {name}: {was} -> {now}" for name, (was, now) in moved.items()]
    if len(lines) == 1:
        lines.append("no change in scenarios, checks or coverage")
    return "\n".join(lines) + "\n"
