"""What changed between two sign-offs (issue 25, item 3): ``qualify diff OLD NEW`` compares
two ``summary.json`` documents (or the report directories holding them), pure.

It says which scenarios were added or removed, which changed status, which checks appeared,
disappeared, changed result or came to judge nothing in a scenario both ran, and which
requirements lost or gained coverage by the requirement gate (R-Q-8, R-Q-12), every figure
that changed (``takeover_after_sigkill_s: 2.95 -> 4.1``, with its check's bound) and every
scenario whose duration changed by more than ``DURATION_CHANGE`` — the questions a release
manager asks of the last sign-off before signing this one. A check
named twice in one scenario (an ``expect`` in a loop) is one check: ok when every one is,
judging the sum. ``regressions`` says whether NEW judges less than OLD (``qualify diff``
exits 1)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qualify.errors import UsageError

__all__ = ["DURATION_CHANGE", "diff_summaries", "duration_changed", "load_summary", "print_diff", "render_diff"]

#: A scenario's duration "changed" when it moved by more than both of these: 1 s and 25 %
#: of the old duration (a scenario's time varies by some 10-20 % between runs on a shared
#: machine; below 1 s, scheduling noise). Figures are different: every change is shown.
DURATION_CHANGE = {"seconds": 1.0, "share": 0.25}


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


def duration_changed(was: float, now: float) -> bool:
    """Whether a scenario's duration moved beyond ``DURATION_CHANGE`` (pure)."""
    delta = abs(now - was)
    return delta > DURATION_CHANGE["seconds"] and delta > DURATION_CHANGE["share"] * was


def _figures(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each figure whose value changed (or that one side lacks): ``{name: {"old", "new",
    "bound"}}``, the bound NEW's check used (else OLD's) or empty."""
    was, now = before.get("figures") or {}, after.get("figures") or {}
    bounds = {**(before.get("figure_bounds") or {}), **(after.get("figure_bounds") or {})}
    return {name: {"old": was.get(name), "new": now.get(name), "bound": bounds.get(name, "")}
            for name in sorted(set(was) | set(now)) if was.get(name) != now.get(name)}


def diff_summaries(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``{verdict: [old, new], scenarios_added, scenarios_removed, status_changed: {id: [old,
    new]}, checks_added: {id: [...]}, checks_removed: {id: [...]}, checks_changed: {id:
    {check: [old ok, new ok]}}, checks_vacuous: {id: [...]} (judged something before,
    nothing now), coverage_lost, coverage_gained, figures_changed: {id: {figure: {old, new,
    bound}}}, durations_changed: {id: [old s, new s]} (beyond ``DURATION_CHANGE``),
    duration_s: [old, new] (the sessions'), selection: [old, new] (each a selection of the
    catalog, not a full run), regressions: [what NEW judges less]}`` (lists sorted)."""
    before = {s["id"]: s for s in old["scenarios"]}
    after = {s["id"]: s for s in new["scenarios"]}
    both = sorted(set(before) & set(after))
    added: dict[str, list[str]] = {}
    removed: dict[str, list[str]] = {}
    changed: dict[str, dict[str, list[Any]]] = {}
    vacuous: dict[str, list[str]] = {}
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    durations: dict[str, list[float]] = {}
    for sid in both:
        if moved_figures := _figures(before[sid], after[sid]):
            figures[sid] = moved_figures
        was_s, now_s = float(before[sid].get("duration_s") or 0), float(after[sid].get("duration_s") or 0)
        if duration_changed(was_s, now_s):
            durations[sid] = [was_s, now_s]
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
        "figures_changed": figures,
        "durations_changed": durations,
        "duration_s": [old.get("duration_s"), new.get("duration_s")],
    }


def _num(v: Any) -> str:
    if v is None:
        return "none"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _change(was: Any, now: Any) -> str:
    """``2.95 -> 4.1 (+39 %)``; a negative figure is the catalog's "did not happen"."""
    def shown(v: Any) -> str:
        return "did not happen" if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 else _num(v)

    text = f"{shown(was)} -> {shown(now)}"
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in (was, now))
    if numbers and was:
        text += f" ({(now - was) / was:+.0%})".replace("%", " %")
    return text


def _sections(d: Mapping[str, Any]) -> list[tuple[str, str, list[str]]]:
    """The diff as ``(style, heading, items)``: what both renderings say, in order.
    ``style`` is ``bad`` (NEW judges less), ``warn`` or empty."""
    out: list[tuple[str, str, list[str]]] = []
    for side, selected in zip(("OLD", "NEW"), d.get("selection", [False, False]), strict=True):
        if selected:
            out.append(("warn", f"{side} is a selection of the catalog, not a full run: coverage it lacks "
                        "may be scenarios it did not run", []))
    if d["coverage_lost"]:
        out.append(("bad", f"requirements that lost coverage ({len(d['coverage_lost'])})", d["coverage_lost"]))
    if d["coverage_gained"]:
        out.append(("", f"requirements newly covered ({len(d['coverage_gained'])})", d["coverage_gained"]))
    for key, label, style in (("scenarios_added", "scenarios added", ""),
                              ("scenarios_removed", "scenarios removed", "bad")):
        if d[key]:
            out.append((style, f"{label} ({len(d[key])})", d[key]))
    if d["status_changed"]:
        out.append(("warn", "status changed", [f"{sid}: {was} -> {now}" for sid, (was, now) in d["status_changed"].items()]))
    for key, label, style in (("checks_added", "checks added", ""), ("checks_removed", "checks removed", "bad")):
        if d[key]:
            out.append((style, label, [f"{sid}: {name}" for sid, names in d[key].items() for name in names]))
    if d["checks_changed"]:
        out.append(("warn", "checks that changed result", [
            f"{sid}: {name}: {was} -> {now}" for sid, moved in d["checks_changed"].items()
            for name, (was, now) in moved.items()]))
    if d.get("checks_vacuous"):
        out.append(("bad", "checks that judged something before and nothing now", [
            f"{sid}: {name}" for sid, names in d["checks_vacuous"].items() for name in names]))
    if d.get("figures_changed"):
        out.append(("", "figures that changed", [
            f"{sid}: {name}: {_change(f['old'], f['new'])}" + (f" (bound {f['bound']})" if f["bound"] else "")
            for sid, figs in d["figures_changed"].items() for name, f in figs.items()]))
    if d.get("durations_changed"):
        limit = DURATION_CHANGE
        out.append(("", f"scenario durations that changed by more than {limit['seconds']:g} s and "
                        f"{limit['share']:.0%}".replace("%", " %") + " (s)", [
            f"{sid}: {_change(was, now)}" for sid, (was, now) in d["durations_changed"].items()]))
    return out


def render_diff(d: Mapping[str, Any], width: int = 100) -> str:
    """The diff as markdown (``qualify diff --markdown``: for a pull request or a ticket),
    long lists wrapped at ``width``."""
    import textwrap

    lines = [f"verdict: {d['verdict'][0]} -> {d['verdict'][1]}"]
    if any(d.get("duration_s", [None, None])):
        lines.append(f"session duration: {_change(*d['duration_s'])} s")
    sections = _sections(d)
    for style, heading, items in sections:
        lines.append(f"**{heading}**" if style == "bad" else heading if not items else f"{heading}:")
        if style == "bad" and items:
            lines[-1] += ":"
        if items and all(" " not in i for i in items):   # ids: one wrapped paragraph
            lines += textwrap.wrap(", ".join(items), width, initial_indent="  ", subsequent_indent="  ",
                                   break_on_hyphens=False)
        else:
            for item in items:
                lines += textwrap.wrap(item, width, initial_indent="- ", subsequent_indent="  ",
                                       break_on_hyphens=False)
    if not sections:
        lines.append("no change in scenarios, checks, coverage, figures or durations")
    return "\n".join(lines) + "\n"


def print_diff(d: Mapping[str, Any], console: Any) -> None:
    """The diff on a terminal (a rich ``Console``): headings styled, never raw markdown,
    each list wrapped to the terminal's width under its heading (a list item's further
    lines hang under its text)."""
    import textwrap

    from rich.text import Text

    style = {"bad": "bold red", "warn": "yellow", "": "bold"}
    width = max(40, int(console.width))

    def say(text: str, kind: str | None = None, first: str = "", more: str = "") -> None:
        for line in textwrap.wrap(text, width, initial_indent=first, subsequent_indent=more,
                                  break_on_hyphens=False) or [""]:
            console.print(Text(line, style=style[kind] if kind is not None else ""), soft_wrap=True)

    say(f"verdict: {d['verdict'][0]} -> {d['verdict'][1]}")
    if any(d.get("duration_s", [None, None])):
        say(f"session duration: {_change(*d['duration_s'])} s")
    sections = _sections(d)
    for kind, heading, items in sections:
        say(heading, kind)
        if items and all(" " not in i for i in items):
            say(", ".join(items), first="  ", more="  ")
        else:
            for item in items:
                say(item, first="  - ", more="    ")
    if not sections:
        say("no change in scenarios, checks, coverage, figures or durations")
