"""Sign-off reports (R-Q-6): ``summary.json`` (schema ``qualify.summary/1``), ``junit.xml``
and ``report.md`` in ``reports/<UTC timestamp>-<short sha>/``.

``summary.json`` fields are stable for CI consumers: later versions only add fields.
Building the documents is pure (``build_summary``, ``render_junit``, ``render_markdown``);
``write_report`` does the file I/O.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qualify.runner import ScenarioResult
from qualify.verdict import Verdict, merge

__all__ = [
    "SCHEMA",
    "build_summary",
    "code_text",
    "crash_matrix",
    "evidence_text",
    "failing_first",
    "figure_rows",
    "figure_text",
    "gate_line",
    "not_passing",
    "render_html",
    "render_junit",
    "render_markdown",
    "repro_line",
    "scenario_doc",
    "value_text",
    "worst_first",
    "write_report",
]

SCHEMA = "qualify.summary/1"


def repro_line(scenario_id: str, seed: int, stack_kind: str, schedule_file: str | None = None) -> str:
    """The one-line command that re-runs one scenario with its seed (a random scenario's
    schedule is re-derived from the same seed); a schedule replayed from a file is
    replayed from that file again (its id, ``random-<i>``, would re-derive another)."""
    extra = "" if stack_kind == "embedded" else f" --stack {stack_kind}"
    if schedule_file is not None:
        return f"qualify repro --schedule {shlex.quote(schedule_file)} --seed {seed}{extra}"
    return f"qualify repro {scenario_id} --seed {seed}{extra}"


def _fault_line(f: dict[str, Any]) -> str:
    ev = f.get("evidence", {})
    keys = ("pid", "old_pid", "new_pid", "backend_pids", "point", "barrier", "step", "attempt")
    where = "; ".join(f"{k} {value_text(ev[k])}" for k in keys if k in ev)
    # Landed or not is said either way; the evidence keys only when there are some.
    return (f"{f['fault']} {f['target']}{f' ({where})' if where else ''}"
            f"{' [landed]' if f['landed'] else ' [did not land]'}")


def value_text(v: Any) -> str:
    """One value of a report, as a reader writes it (pure): numbers with ``:g``, lists
    comma-separated, mappings as ``key value``, nothing shown as ``none`` (never a Python
    repr: no brackets, braces or quotes)."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {value_text(x)}" for k, x in v.items()) or "none"
    if isinstance(v, (list, tuple, set)):
        return ", ".join(value_text(x) for x in v) or "none"
    return str(v)


def code_text(text: str) -> Any:
    """``text`` for HTML, escaped, its Markdown code spans (```qualify run```) as
    ``<code>`` (pure): the sentences shared with report.md carry backticks."""
    from markupsafe import Markup, escape

    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: shown as written
        return escape(text)
    return Markup("").join(escape(p) if i % 2 == 0 else Markup("<code>") + escape(p) + Markup("</code>")
                           for i, p in enumerate(parts))


def evidence_text(evidence: dict[str, Any]) -> str:
    """A fault's evidence as ``key: value; ...`` (pure)."""
    return "; ".join(f"{k}: {value_text(v)}" for k, v in evidence.items()) or "none recorded"


def figure_text(figures: dict[str, Any], bounds: dict[str, str] | None = None) -> str:
    """A scenario's figures as ``name = value`` with the bound its check used, ``(bound
    <= 7 s)`` (pure); a negative figure is the catalog's "did not happen" (a takeover that
    never came), written as such."""
    return "; ".join(f"{k} = {shown}" for k, shown in figure_rows(figures, bounds))


def figure_rows(figures: dict[str, Any], bounds: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """``(name, value and bound)`` per figure (pure): ``figure_text``'s pieces."""
    def shown(v: Any) -> str:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            return "did not happen"
        return value_text(v)

    bounds = bounds or {}
    return [(k, shown(v) + (f" (bound {bounds[k]})" if k in bounds else "")) for k, v in figures.items()]


def scenario_doc(r: ScenarioResult, *, report_dir: Path, stack_kind: str) -> dict[str, Any]:
    """One scenario's entry in ``summary.json`` (JSON-safe)."""
    doc: dict[str, Any] = {
        "id": r.scenario.id,
        "title": r.scenario.title,
        "status": str(r.verdict),
        "duration_s": r.duration_s,
        "requirements": list(r.scenario.requirements),
        "faults": [_fault_line(f) for f in r.faults],
        "fault_evidence": [f.get("evidence", {}) for f in r.faults],
        "crash_points": r.crash_points,
        "crash_point_evidence": r.crash_point_evidence,
        "checks": [c.as_dict() for c in r.checks],
        "figures": r.figures,
        "figure_bounds": r.figure_bounds,
        "error": r.error,
        "history": str((r.out_dir / "history.jsonl").relative_to(report_dir)),
        "logs": [str((r.out_dir / p).relative_to(report_dir)) for p in r.logs],
        "repro": repro_line(r.scenario.id, r.seed, stack_kind, r.scenario.schedule_file),
        "spawn": r.spawn,
        "execd": r.execd,
        "spawned": r.spawned,
        "time_by_kind": r.time_by_kind,
        "temporal_timers": r.temporal_timers,
    }
    if r.scenario.exec_because:
        doc["exec_because"] = r.scenario.exec_because
    if r.scenario.default_timers_because:
        doc["default_timers_because"] = r.scenario.default_timers_because
    if r.scenario.schedule is not None:
        doc["schedule"] = json.loads(r.scenario.schedule)
    if r.reproduction:
        doc["reproduction"] = r.reproduction
    if r.tables:
        doc["tables"] = r.tables
    return doc


def build_summary(*, scenarios: Sequence[dict[str, Any]], seed: int, duration_s: float,
                  stack: dict[str, Any], provenance: dict[str, Any], report_dir: Path,
                  crash_catalog: Sequence[str] = ()) -> dict[str, Any]:
    """The ``qualify.summary/1`` document from the scenarios' documents."""
    verdict = merge([Verdict(s["status"]) for s in scenarios]) if scenarios else Verdict.CRASHED
    requirements: dict[str, dict[str, list[str]]] = {}
    for sc in scenarios:
        for req in sc["requirements"]:
            entry = requirements.setdefault(req, {"passed": [], "failed": []})
            entry["passed" if sc["status"] == Verdict.PASS else "failed"].append(sc["id"])
    crash_points = {p: sorted({sc["id"] for sc in scenarios if p in sc["crash_points"]})
                    for p in crash_catalog}
    return {
        "schema": SCHEMA,
        "verdict": str(verdict),
        "seed": seed,
        "duration_s": round(duration_s, 3),
        # Throughput of the session, wall clock (the soak's figure, R-Q-10).
        "scenarios_per_hour": round(len(scenarios) * 3600 / duration_s) if duration_s > 0 else 0,
        "git_sha": provenance.get("git_sha"),
        "git_dirty": provenance.get("git_dirty"),
        "provenance": provenance,
        "stack": stack,
        "report_dir": str(report_dir),
        "requirements": dict(sorted(requirements.items())),
        "crash_points": crash_points,
        "scenarios": list(scenarios),
    }


def render_junit(summary: dict[str, Any]) -> str:
    """JUnit XML: one testcase per scenario; fail and flaky -> <failure>, crashed/unknown ->
    <error>, vacuous -> <skipped> (it proved nothing); and a testcase ``session`` when the session
    itself failed (``summary.error``: a full run's gates, a crash), so that the file is
    never all passing for a verdict that is not."""
    scenarios = summary["scenarios"]
    suite = ET.Element("testsuite", name="qualify", tests=str(len(scenarios)),
                       time=str(summary["duration_s"]))
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    for s in scenarios:
        case = ET.SubElement(suite, "testcase", classname="qualify", name=s["id"], time=str(s["duration_s"]))
        bad = [c for c in s["checks"] if c["ok"] is not True]
        text = "\n".join(f"{c['name']}: {c['detail']}" for c in bad) or s["error"]
        if s["status"] in ("fail", "flaky"):
            # Flaky: a checker found a violation in some of its runs (the checks are the
            # failing run's); it is not a pass.
            counts["failures"] += 1
            flaky = " ".join(("flaky", str(s.get("reproduction") or ""))).strip()
            message = "invariant violated" if s["status"] == "fail" else f"{flaky}: invariant violated in some runs"
            ET.SubElement(case, "failure", message=message).text = f"{text}\nrepro: {s['repro']}"
        elif s["status"] in ("crashed", "unknown"):
            counts["errors"] += 1
            ET.SubElement(case, "error", message=s["status"]).text = f"{text}\nrepro: {s['repro']}"
        elif s["status"] == "vacuous":
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message="vacuous: a fault hit nothing")
        ET.SubElement(case, "system-out").text = "requirements: " + " ".join(s["requirements"])
    if summary.get("error"):
        # The session's own failure (a full run's gates, a crashed session): every scenario
        # may have passed, and the verdict is still not pass.
        case = ET.SubElement(suite, "testcase", classname="qualify", name="session",
                             time=str(summary["duration_s"]))
        tag = "failure" if summary["verdict"] == "fail" else "error"
        counts["failures" if tag == "failure" else "errors"] += 1
        ET.SubElement(case, tag, message=f"verdict {summary['verdict']}").text = str(summary["error"])
        suite.set("tests", str(len(scenarios) + 1))
    for k, v in counts.items():
        suite.set(k, str(v))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def worst_first(scenarios: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scenarios, those that did not pass first, worst first (fail, crashed, unknown,
    vacuous, flaky), then the passing ones; catalog order within each status (pure)."""
    def severity(sc: dict[str, Any]) -> int:
        try:
            return Verdict(sc["status"]).severity
        except ValueError:
            return Verdict.CRASHED.severity
    return sorted(scenarios, key=lambda sc: -severity(sc))


def failing_first(checks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A scenario's checks, failed ones first, then those that raised (unknown), then the
    passing ones; their own order within each (pure)."""
    return sorted(checks, key=lambda c: {False: 0, None: 1}.get(c.get("ok"), 2))


def not_passing(summary: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``[(status, [scenario ids])]`` of the scenarios that did not pass, worst status
    first (pure): what a failing report's banner and report.md's top name."""
    by: dict[str, list[str]] = {}
    for sc in worst_first(summary["scenarios"]):
        if sc["status"] != "pass":
            by.setdefault(sc["status"], []).append(sc["id"])
    return list(by.items())


def gate_line(summary: dict[str, Any]) -> str:
    """The requirement gate in one line (pure), as report.md's top and the banner say it."""
    judged, rows = requirement_rows(summary)
    counts = (f"{len(judged['covered'])} of {len(rows)} covered, {len(judged['waived'])} waived, "
              f"{len(judged['uncovered'])} uncovered")
    if partial_selection(summary):
        return f"requirement gate not applied (a selection): {counts}"
    return f"requirement gate {'PASS' if not judged['uncovered'] else 'FAIL'}: {counts}"


def _cell(text: object) -> str:
    return re.sub(r"[|\n]", " ", str(text))


def _anchor(scenario_id: str) -> str:
    """The anchor a markdown renderer (GitHub's) gives a scenario's heading "### id — status"."""
    return re.sub(r"[^a-z0-9 _-]", "", scenario_id.lower()).replace(" ", "-")


def render_markdown(summary: dict[str, Any]) -> str:
    st = summary["stack"]
    partial = partial_selection(summary)
    lines = [
        f"# Qualification report{' of a selection (not a sign-off)' if partial else ''} — "
        f"verdict: **{summary['verdict'].upper()}**",
        "",
        *([f"**{partial}**", ""] if partial else []),
        *([f"- **{summary['error']}**"] if summary.get("error") else []),
        *[f"- **{status}** ({len(ids)}): " + ", ".join(f"[{i}](#{_anchor(f'{i} — {status}')})" for i in ids)
          for status, ids in not_passing(summary)],
        f"- {gate_line(summary)} ([the gate](#requirement-coverage))",
        f"- seed: `{summary['seed']}`; duration: {summary['duration_s']} s",
        f"- git: `{summary['git_sha']}`{' (dirty)' if summary.get('git_dirty') else ''}",
        f"- stack: {st.get('kind')} — PostgreSQL {st.get('postgres_version')}, "
        f"Temporal {st.get('temporal_version')}, booted in {st.get('boot_s')} s",
        "",
        "## Scenarios",
        "",
        "| scenario | status | s | faults | requirements |",
        "|---|---|---|---|---|",
    ]
    ordered = worst_first(summary["scenarios"])
    for s in ordered:
        lines.append(f"| {s['id']} | {s['status']} | {s['duration_s']} | "
                     f"{_cell('; '.join(s['faults']) or '-')} | {' '.join(s['requirements'])} |")
    for s in ordered:
        lines += ["", f"### {s['id']} — {s['status']}", "", s["title"], ""]
        for c in failing_first(s["checks"]):
            mark = {True: "ok", False: "FAIL", None: "UNKNOWN"}[c["ok"]]
            lines.append(f"- [{mark}] {c['name']} ({_judged(c)}){': ' + c['detail'] if c['detail'] else ''}")
        if s["figures"]:
            lines.append(f"- figures: {figure_text(s['figures'], s.get('figure_bounds'))}")
        for name, table in s.get("tables", {}).items():
            lines += ["", f"{name}:", "", "| " + " | ".join(_cell(c) for c in table["columns"]) + " |",
                      "|" + "---|" * len(table["columns"])]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table["rows"]]
            lines.append("")
        if s["error"]:
            lines += ["", "```", s["error"], "```"]
        lines += ["", f"history: `{s['history']}`; logs: " + ", ".join(f"`{p}`" for p in s["logs"])
                  + "; timeline: report.html"]
        if s["status"] != "pass":
            lines.append(f"repro: `{s['repro']}`")
    judged, rows = requirement_rows(summary)
    lines += ["", "## Requirement coverage", "",
              f"{len(judged['covered'])} of the spec's {len(rows)} requirements have a passing check "
              f"that covers them (it cites them and judged at least one item; a check that restates "
              f"a database guard covers nothing, R-Q-12); {len(judged['waived'])} are waived (reason given); "
              f"{len(judged['uncovered'])} have neither"
              + (" (the gate is not applied to a selection; a full run applies it)." if partial else
                 " — a full run fails on these (R-Q-8)." if judged["uncovered"] else "."), "",
              "| requirement | passing checks | scenarios citing it (passed / failed) |", "|---|---|---|"]
    for r in rows:
        cited = f"{', '.join(r['passed']) or '-'} / {', '.join(r['failed']) or '-'}"
        if r["status"] == "covered":
            shown = f"{len(r['checks'])} (e.g. {_cell(r['checks'][0])})"
        elif r["status"] == "waived":
            shown = f"waived: {_cell(r['why'])}"
        else:
            shown = "**none**"
        lines.append(f"| {r['req']} | {shown} | {cited} |")
    lines += ["", f"## Scope of this {'report' if partial else 'sign-off'}", ""]
    lines += [f"**{partial}**", ""] if partial else []
    lines += [f"{'A full run qualifies' if partial else 'Qualifies'}: {QUALIFIES}.", "",
              f"Does not qualify: {DOES_NOT_QUALIFY}."]
    kinds = faults_by_kind(summary)
    if kinds:
        lines += ["", "## Faults by kind", "", faults_note(summary), "", "| fault | struck | scenarios |",
                  "|---|---|---|"]
        lines += [f"| {k['kind']} | {k['struck']} | {_cell(', '.join(k['scenarios']))} |" for k in kinds]
    total, slow = time_table(summary)
    lines += ["", "## Time per scenario", "",
              f"{total:.1f} s of scenario time in all (wall time {summary.get('duration_s')} s); the longest:", "",
              "| scenario | s | share |", "|---|---|---|"]
    lines += [f"| {r['id']} | {r['s']:.1f} | {r['share']:.0%} |" for r in slow]
    if summary.get("load"):
        lines += ["", load_line(summary["load"])]
    if judged.get("stale_waivers"):
        lines += ["", "Stale waivers (now covered; remove them): " + ", ".join(judged["stale_waivers"])]
    if summary.get("refused"):
        lines += ["", f"Refused (not run): {', '.join(summary['refused'])}"]
    for point, why in summary.get("waived_crash_points", {}).items():
        lines.append(f"- crash point {point} waived: {why}")
    if summary["crash_points"]:
        actions, matrix = crash_matrix(summary)
        lines += ["", "## Crash points", "", "| crash point | " + " | ".join(actions) + " |",
                  "|---|" + "---|" * len(actions)]
        for point, by_action in matrix.items():
            cells = [", ".join(by_action.get(a, [])) or "-" for a in actions]
            lines.append(f"| {point} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: What a passing qualification says, and what it does not (the sign-off's scope).
QUALIFIES = (
    "the durable-runs contract (the requirement gate below) on the stack recorded in the "
    "provenance: real API and worker processes, PostgreSQL and Temporal, struck at the named "
    "crash points and by the faults listed, with the synthetic provider and a fake "
    "OpenAI-compatible server")
DOES_NOT_QUALIFY = (
    "a live model provider's quality or behaviour, production throughput and latency under "
    "load (see bench/), a hosted rollout (managed PostgreSQL or Temporal, failover, "
    "multi-region), and whatever the gate lists as waived (each with its reason)")


def faults_by_kind(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """``{kind, struck, scenarios}`` per fault kind over the session (pure), most struck
    first: the kind is a fault's first word (``sigkill``, ``crash_point:kill``, ...)."""
    kinds: dict[str, dict[str, Any]] = {}
    for sc in summary["scenarios"]:
        for fault in sc.get("faults", []):
            kind = str(fault).split(" ", 1)[0]
            entry = kinds.setdefault(kind, {"kind": kind, "struck": 0, "scenarios": []})
            entry["struck"] += 1
            if sc["id"] not in entry["scenarios"]:
                entry["scenarios"].append(sc["id"])
    return sorted(kinds.values(), key=lambda e: (-e["struck"], e["kind"]))


def scheduling_strikes(summary: dict[str, Any]) -> tuple[int, list[str]]:
    """(crash-point strikes no fault recorded, the scenarios that made them) (pure): a point
    held or frozen only to order a race (the scenario's schedule, released by the harness)
    is in the crash-point matrix but is not a fault, so "Faults by kind" leaves it out and
    says how many it left out."""
    strikes, where = 0, []
    for sc in summary["scenarios"]:
        recorded = sum(1 for f in sc.get("faults", []) if str(f).startswith("crash_point:"))
        extra = len(sc.get("crash_point_evidence", [])) - recorded
        if extra > 0:
            strikes += extra
            where.append(sc["id"])
    return strikes, where


def faults_note(summary: dict[str, Any]) -> str:
    """The sentence under "Faults by kind" that reconciles it with the crash-point matrix."""
    strikes, where = scheduling_strikes(summary)
    said = "Faults the nemesis recorded, each with its evidence (did it land)."
    if strikes:
        said += (f" Not counted here: {strikes} crash-point strike(s) that only ordered a race "
                 f"(held or frozen, then released by the scenario: a schedule, not a fault) in "
                 f"{', '.join(where)}; the crash-point matrix lists them.")
    return said


def time_table(summary: dict[str, Any], top: int = 15) -> tuple[float, list[dict[str, Any]]]:
    """``(total scenario seconds, the ``top`` longest scenarios as {id, s, share, spawn,
    kinds: their three largest (kind, seconds)})`` (pure): where a run's time goes
    (issue 24, item 1)."""
    total = sum(float(sc.get("duration_s") or 0) for sc in summary["scenarios"])
    rows = sorted(({"id": sc["id"], "s": float(sc.get("duration_s") or 0), "spawn": sc.get("spawn", ""),
                    "kinds": sorted((sc.get("time_by_kind") or {}).items(), key=lambda kv: -kv[1])[:3]}
                   for sc in summary["scenarios"]),
                  key=lambda r: -r["s"])[:top]
    for r in rows:
        r["share"] = r["s"] / total if total else 0.0
    return total, rows


def load_line(load: dict[str, Any]) -> str:
    """One sentence on a run's CPU (pure; ``load``: a summary's ``qualify.timing.slice_load``)."""
    return (f"CPU: {load['cpu_s']} s over {load['wall_s']} s of wall time at {load['slices']} slice(s) on "
            f"{load['cpus']} CPU(s): {load['cores_busy']} cores busy, {load['cpu_per_slice']} per slice "
            f"({load['cpu_share']:.0%} of the machine).")


def requirement_rows(summary: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The requirement gate of a summary (R-Q-8, R-Q-12) and one row per spec requirement
    (pure): ``{req, status: covered|waived|uncovered, checks: [scenario: check, ...], why,
    passed: [scenario ids], failed: [scenario ids]}``. The gate is the summary's own
    (``requirement_gate``) or, for an older summary, recomputed."""
    from qualify.coverage import gate
    from qualify.spec_ids import REQUIREMENTS

    judged = summary.get("requirement_gate") or gate(summary["scenarios"], REQUIREMENTS)
    # A scenario cites a requirement when it lists it or one of its checks cites it: a check
    # may cover a requirement its scenario does not list, and the "covered by" column must
    # never name a scenario the "citing it" column leaves out.
    by_checks: dict[str, list[dict[str, Any]]] = {}
    for sc in summary["scenarios"]:
        for req in dict.fromkeys(r for c in sc.get("checks", []) for r in c.get("requirements", ())):
            by_checks.setdefault(req, []).append(sc)
    rows = []
    for req in REQUIREMENTS:
        entry = summary.get("requirements", {}).get(req, {"passed": [], "failed": []})
        status = ("covered" if req in judged["covered"] else
                  "waived" if req in judged["waived"] else "uncovered")
        checks = list(judged["covered"].get(req, []))
        passed, failed = list(entry.get("passed", [])), list(entry.get("failed", []))
        for sc in by_checks.get(req, []):
            into = passed if sc["status"] == "pass" else failed
            if sc["id"] not in passed + failed:
                into.append(sc["id"])
        # Those whose checks cover it first, in the order "covered by" names them.
        covering = list(dict.fromkeys(c.split(": ", 1)[0] for c in checks))
        passed = [i for i in covering if i in passed] + [i for i in passed if i not in covering]
        rows.append({"req": req, "status": status, "checks": checks,
                     "why": judged["waived"].get(req, ""), "passed": passed, "failed": failed})
    return judged, rows


def selection_words(summary: dict[str, Any]) -> str:
    """"a selection of 3 scenarios of the catalog's 100 and 2 random schedules" (pure): a
    random schedule (``random-<i>``) or a saved one is not one of the catalog's."""
    ids = [str(s["id"]) for s in summary["scenarios"]]
    drawn = sum(1 for i in ids if i == "schedule" or (i.startswith("random-") and i[7:].isdigit()))
    n = len(ids) - drawn
    of = f" of the catalog's {summary['catalog_size']}" if summary.get("catalog_size") else ""
    parts = [f"{n} scenario{'' if n == 1 else 's'}{of}"] if n or not drawn else []
    if drawn:
        parts.append(f"{drawn} random schedule{'' if drawn == 1 else 's'}")
    return "a selection of " + " and ".join(parts)


def partial_selection(summary: dict[str, Any]) -> str | None:
    """What a run of a selection (``-s``, ``--random``, a schedule, one shard) says in
    place of a sign-off; None for a full run, or a summary that does not say."""
    if summary.get("full_run", True):
        return None
    return (f"Not a release sign-off: {selection_words(summary)}. A full "
            "run's gates (every crash point struck, every requirement covered) were not applied; "
            "sign off on a full `qualify run`.")


def _judged(check: dict[str, Any]) -> str:
    """``judged N``, and why the check covers nothing when it does not (R-Q-12)."""
    if "judged" not in check:
        return "judged: not counted"
    if check.get("restates"):
        return f"judged {check['judged']}; restates {check['restates']}: covers nothing"
    if not check["judged"] and check.get("requirements"):
        return "judged 0: covers nothing"
    return f"judged {check['judged']}"


def crash_matrix(summary: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, list[str]]]]:
    """(actions, crash point -> action -> scenarios that struck it that way): a column for
    every action a crash point takes (``qimpl.crashpoints.ACTIONS``), and for any other an
    evidence line names, so no strike is left out of the table."""
    from qimpl.crashpoints import ACTIONS

    matrix: dict[str, dict[str, list[str]]] = {p: {} for p in summary["crash_points"]}
    for sc in summary["scenarios"]:
        for ev in sc.get("crash_point_evidence", []):
            cell = matrix.setdefault(ev["point"], {}).setdefault(ev["action"], [])
            if sc["id"] not in cell:
                cell.append(sc["id"])
    order = ["kill", "stop", "hold", "freeze"]
    seen = {a for by_action in matrix.values() for a in by_action}
    actions = [a for a in order if a in ACTIONS] + sorted((ACTIONS | seen) - set(order))
    return actions, matrix


def render_html(summary: dict[str, Any], histories: dict[str, list[dict[str, Any]]]) -> str:
    """A self-contained HTML report (no external assets)."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    from qualify.spec_ids import REQUIREMENTS
    from qualify.timeline import MAX_EVENTS, MAX_RUNS, svg_timeline

    env = Environment(loader=PackageLoader("qualify", "templates"), autoescape=select_autoescape(("html", "html.j2")))
    actions, matrix = crash_matrix(summary)
    timelines = {sc["id"]: svg_timeline(histories.get(sc["id"], [])) for sc in summary["scenarios"]}
    judged, rows = requirement_rows(summary)
    total_s, slow = time_table(summary)
    from qualify.timing import sum_by_kind

    by_kind = sum_by_kind(summary["scenarios"])
    execs = [{"id": sc["id"], "why": sc["exec_because"], "execd": sc.get("execd", [])}
             for sc in summary["scenarios"] if sc.get("exec_because")]
    return env.get_template("report.html.j2").render(
        s=summary, requirements=REQUIREMENTS, actions=actions, crash_matrix=matrix,
        timelines=timelines, max_events=MAX_EVENTS, max_runs=MAX_RUNS, gate=judged, req_rows=rows,
        qualifies=QUALIFIES, does_not_qualify=DOES_NOT_QUALIFY, partial=partial_selection(summary), fault_kinds=faults_by_kind(summary), faults_note=faults_note(summary),
        scenarios_in_order=worst_first(summary["scenarios"]), failing_first=failing_first,
        not_passing=not_passing(summary),
        scenario_s=total_s, slowest=slow, by_kind=by_kind, execs=execs, figure_rows=figure_rows,
        evidence_text=evidence_text, code_text=code_text,
        load_text=load_line(summary["load"]) if summary.get("load") else "")


def _histories(report_dir: Path, summary: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for sc in summary["scenarios"]:
        path = report_dir / sc["history"]
        lines = path.read_text().splitlines() if path.exists() else []
        out[sc["id"]] = [json.loads(line) for line in lines if line.strip()]
    return out


def write_report(report_dir: Path, summary: dict[str, Any]) -> None:
    """Write junit.xml, report.md and report.html, then summary.json last (its presence
    means the run finished)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "junit.xml").write_text(render_junit(summary))
    (report_dir / "report.md").write_text(render_markdown(summary))
    (report_dir / "report.html").write_text(render_html(summary, _histories(report_dir, summary)))
    tmp = report_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(report_dir / "summary.json")
