"""What changed between two sign-offs (issue 25, item 3): ``qualify diff OLD NEW`` compares
two ``summary.json`` documents (or the report directories holding them), pure.

It says which scenarios were added or removed, which changed status, which checks appeared,
disappeared, changed result or came to judge nothing in a scenario both ran, and which
requirements lost or gained coverage by the requirement gate (R-Q-8, R-Q-12) — the
questions a release manager asks of the last sign-off before signing this one. A check
named twice in one scenario (an ``expect`` in a loop) is one check: ok when every one is,
judging the sum. ``regressions`` says whether NEW judges less than OLD (``qualify diff``
exits 1)."""

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


def _checks(scenario: Mapping[str, Any]) -> dict[str, tuple[Any, int]]:
    """Each check's (ok, items judged), a name's repeats folded into one."""
    out: dict[str, tuple[Any, int]] = {}
    for c in scenario.get("checks", []):
        name, ok, judged = str(c.get("name")), c.get("ok"), int(c.get("judged", 1) or 0)
        if name in out:
            was_ok, was_judged = out[name]
            ok = ok if was_ok is True else was_ok
            judged += was_judged
        out[name] = (ok, judged)
    return out


def _covered(summary: Mapping[str, Any]) -> set[str]:
    from qualify.coverage import gate
    from qualify.spec_ids import REQUIREMENTS

    # Recomputed from the checks, never read from the stored gate: what a summary covers
    # is what its checks judged (the stored gate only adds waivers, which cover nothing).
    return set(gate(summary["scenarios"], REQUIREMENTS)["covered"])


def diff_summaries(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``{verdict: [old, new], scenarios_added, scenarios_removed, status_changed: {id: [old,
    new]}, checks_added: {id: [...]}, checks_removed: {id: [...]}, checks_changed: {id:
    {check: [old ok, new ok]}}, checks_vacuous: {id: [...]} (judged something before,
    nothing now), coverage_lost, coverage_gained, selection: [old, new] (each a selection
    of the catalog, not a full run), regressions: [what NEW judges less]}`` (lists sorted)."""
    before = {s["id"]: s for s in old["scenarios"]}
    after = {s["id"]: s for s in new["scenarios"]}
    both = sorted(set(before) & set(after))
    added: dict[str, list[str]] = {}
    removed: dict[str, list[str]] = {}
    changed: dict[str, dict[str, list[Any]]] = {}
    vacuous: dict[str, list[str]] = {}
    for sid in both:
        was, now = _checks(before[sid]), _checks(after[sid])
        if plus := sorted(set(now) - set(was)):
            added[sid] = plus
        if minus := sorted(set(was) - set(now)):
            removed[sid] = minus
        common = sorted(set(was) & set(now))
        if moved := {c: [was[c][0], now[c][0]] for c in common if was[c][0] != now[c][0]}:
            changed[sid] = moved
        if empty := [c for c in common if was[c][1] > 0 and now[c][1] == 0]:
            vacuous[sid] = empty
    covered_before, covered_after = _covered(old), _covered(new)
    scenarios_removed = sorted(set(before) - set(after))
    failing = {sid: [c for c, (was_ok, now_ok) in moved.items() if was_ok is True and now_ok is not True]
               for sid, moved in changed.items()}
    regressions = (
        [f"requirement lost coverage: {r}" for r in sorted(covered_before - covered_after)]
        + [f"scenario removed: {sid}" for sid in scenarios_removed]
        + [f"{sid}: check removed: {c}" for sid, names in removed.items() for c in names]
        + [f"{sid}: check judged nothing: {c}" for sid, names in vacuous.items() for c in names]
        + [f"{sid}: check fails: {c}" for sid, names in failing.items() for c in names])
    return {
        "selection": [old.get("full_run") is False, new.get("full_run") is False],
        "checks_vacuous": vacuous,
        "regressions": regressions,
        "verdict": [old.get("verdict"), new.get("verdict")],
        "scenarios_added": sorted(set(after) - set(before)),
        "scenarios_removed": scenarios_removed,
        "status_changed": {sid: [before[sid].get("status"), after[sid].get("status")] for sid in both
                           if before[sid].get("status") != after[sid].get("status")},
        "checks_added": added, "checks_removed": removed, "checks_changed": changed,
        "coverage_lost": sorted(covered_before - covered_after),
        "coverage_gained": sorted(covered_after - covered_before),
    }


def render_diff(d: Mapping[str, Any]) -> str:
    """The diff as markdown (the terminal shows it as is)."""
    lines = [f"verdict: {d['verdict'][0]} -> {d['verdict'][1]}"]
    for side, selected in zip(("OLD", "NEW"), d.get("selection", [False, False]), strict=True):
        if selected:
            lines.append(f"{side} is a selection of the catalog, not a full run: coverage it lacks "
                         "may be scenarios it did not run")
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
    for sid, names in d.get("checks_vacuous", {}).items():
        lines += [f"{sid}: **judged nothing now**: {name}" for name in names]
    if len(lines) == 1:
        lines.append("no change in scenarios, checks or coverage")
    return "\n".join(lines) + "\n"
