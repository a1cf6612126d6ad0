"""Sign-off reports (R-Q-6): ``summary.json`` (schema ``qualify.summary/1``), ``junit.xml``
and ``report.md`` in ``reports/<UTC timestamp>-<short sha>/``.

``summary.json`` fields are stable for CI consumers: later versions only add fields.
Building the documents is pure (``build_summary``, ``render_junit``, ``render_markdown``);
``write_report`` does the file I/O.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qualify.runner import ScenarioResult
from qualify.verdict import Verdict, merge

__all__ = ["SCHEMA", "build_summary", "render_junit", "render_markdown", "repro_line", "write_report"]

SCHEMA = "qualify.summary/1"


def repro_line(scenario_id: str, seed: int, stack_kind: str) -> str:
    """The one-line command that re-runs one scenario with its seed."""
    extra = "" if stack_kind == "embedded" else f" --stack {stack_kind}"
    return f"qualify repro {scenario_id} --seed {seed}{extra}"


def _fault_line(f: dict[str, Any]) -> str:
    ev = f.get("evidence", {})
    where = ", ".join(f"{k}={ev[k]}" for k in ("pid", "barrier", "step", "attempt") if k in ev)
    return f"{f['fault']} {f['target']} ({where}){'' if f['landed'] else ' [did not land]'}"


def build_summary(*, results: Sequence[ScenarioResult], seed: int, duration_s: float,
                  stack: dict[str, Any], provenance: dict[str, Any], report_dir: Path,
                  crash_catalog: Sequence[str] = ()) -> dict[str, Any]:
    """The ``qualify.summary/1`` document."""
    verdict = merge([r.verdict for r in results]) if results else Verdict.CRASHED
    requirements: dict[str, dict[str, list[str]]] = {}
    for r in results:
        for req in r.scenario.requirements:
            entry = requirements.setdefault(req, {"passed": [], "failed": []})
            entry["passed" if r.verdict == Verdict.PASS else "failed"].append(r.scenario.id)
    crash_points = {p: sorted({r.scenario.id for r in results if p in r.crash_points})
                    for p in crash_catalog}
    return {
        "schema": SCHEMA,
        "verdict": str(verdict),
        "seed": seed,
        "duration_s": round(duration_s, 3),
        "git_sha": provenance.get("git_sha"),
        "git_dirty": provenance.get("git_dirty"),
        "provenance": provenance,
        "stack": stack,
        "report_dir": str(report_dir),
        "requirements": dict(sorted(requirements.items())),
        "crash_points": crash_points,
        "scenarios": [
            {
                "id": r.scenario.id,
                "title": r.scenario.title,
                "status": str(r.verdict),
                "duration_s": r.duration_s,
                "requirements": list(r.scenario.requirements),
                "faults": [_fault_line(f) for f in r.faults],
                "fault_evidence": [f.get("evidence", {}) for f in r.faults],
                "crash_points": r.crash_points,
                "checks": [c.as_dict() for c in r.checks],
                "figures": r.figures,
                "error": r.error,
                "history": str((r.out_dir / "history.jsonl").relative_to(report_dir)),
                "logs": [str((r.out_dir / p).relative_to(report_dir)) for p in r.logs],
                "repro": repro_line(r.scenario.id, r.seed, stack.get("kind", "embedded")),
            }
            for r in results
        ],
    }


def render_junit(summary: dict[str, Any]) -> str:
    """JUnit XML: one testcase per scenario; fail -> <failure>, crashed/unknown -> <error>,
    vacuous -> <skipped> (it proved nothing)."""
    scenarios = summary["scenarios"]
    suite = ET.Element("testsuite", name="qualify", tests=str(len(scenarios)),
                       time=str(summary["duration_s"]))
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    for s in scenarios:
        case = ET.SubElement(suite, "testcase", classname="qualify", name=s["id"], time=str(s["duration_s"]))
        bad = [c for c in s["checks"] if c["ok"] is not True]
        text = "\n".join(f"{c['name']}: {c['detail']}" for c in bad) or s["error"]
        if s["status"] == "fail":
            counts["failures"] += 1
            ET.SubElement(case, "failure", message="invariant violated").text = f"{text}\nrepro: {s['repro']}"
        elif s["status"] in ("crashed", "unknown"):
            counts["errors"] += 1
            ET.SubElement(case, "error", message=s["status"]).text = f"{text}\nrepro: {s['repro']}"
        elif s["status"] == "vacuous":
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message="vacuous: a fault hit nothing")
        ET.SubElement(case, "system-out").text = "requirements: " + " ".join(s["requirements"])
    for k, v in counts.items():
        suite.set(k, str(v))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def _cell(text: object) -> str:
    return re.sub(r"[|\n]", " ", str(text))


def render_markdown(summary: dict[str, Any]) -> str:
    st = summary["stack"]
    lines = [
        f"# Qualification report — verdict: **{summary['verdict'].upper()}**",
        "",
        *([f"- **{summary['error']}**"] if summary.get("error") else []),
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
    for s in summary["scenarios"]:
        lines.append(f"| {s['id']} | {s['status']} | {s['duration_s']} | "
                     f"{_cell('; '.join(s['faults']) or '-')} | {' '.join(s['requirements'])} |")
    for s in summary["scenarios"]:
        lines += ["", f"### {s['id']} — {s['status']}", "", s["title"], ""]
        for c in s["checks"]:
            mark = {True: "ok", False: "FAIL", None: "UNKNOWN"}[c["ok"]]
            lines.append(f"- [{mark}] {c['name']}{': ' + c['detail'] if c['detail'] else ''}")
        if s["figures"]:
            lines.append(f"- figures: {json.dumps(s['figures'])}")
        if s["error"]:
            lines += ["", "```", s["error"], "```"]
        lines += ["", f"history: `{s['history']}`; logs: " + ", ".join(f"`{p}`" for p in s["logs"])]
        if s["status"] != "pass":
            lines.append(f"repro: `{s['repro']}`")
    lines += ["", "## Requirement coverage", "", "| requirement | passed in | failed in |", "|---|---|---|"]
    for req, entry in summary["requirements"].items():
        lines.append(f"| {req} | {', '.join(entry['passed']) or '-'} | {', '.join(entry['failed']) or '-'} |")
    if summary["crash_points"]:
        lines += ["", "## Crash points", "", "| crash point | struck by |", "|---|---|"]
        for point, by in summary["crash_points"].items():
            lines.append(f"| {point} | {', '.join(by) or 'never struck'} |")
    return "\n".join(lines) + "\n"


def write_report(report_dir: Path, summary: dict[str, Any]) -> None:
    """Write junit.xml and report.md, then summary.json last (its presence means complete)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "junit.xml").write_text(render_junit(summary))
    (report_dir / "report.md").write_text(render_markdown(summary))
    tmp = report_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(report_dir / "summary.json")
