"""Issue 59, item 6: what the report and the command say, said plainly — fault evidence
and figures without Python reprs and with the bound each figure's check used, no literal
backticks in the HTML (which escapes what scenarios wrote), no ``failed None`` in a
check's detail, the gate table's two columns agreeing."""

from __future__ import annotations

import random
import re
from pathlib import Path

from qualify.checkers import Check
from qualify.report import (
    build_summary,
    render_html,
    render_markdown,
    requirement_rows,
    scenario_doc,
)
from qualify.runner import ScenarioResult
from qualify.scenarios import Scenario
from qualify.scenarios.base import ScenarioContext, outcome
from qualify.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]


def _doc(tmp: Path, sid: str, checks: list[Check], *, requirements: tuple[str, ...] = ("R-EXEC-4",),
         verdict: Verdict = Verdict.PASS, evidence: dict[str, object] | None = None,
         figures: dict[str, float] | None = None, bounds: dict[str, str] | None = None) -> dict[str, object]:
    out = tmp / "scenarios" / sid
    (out / "logs").mkdir(parents=True, exist_ok=True)
    sc = Scenario(sid, f"title {sid}", requirements, lambda ctx: None, ("sigkill",))
    r = ScenarioResult(scenario=sc, seed=5, verdict=verdict, duration_s=1.0, checks=checks,
                       faults=[{"fault": "sigkill", "target": "worker-1", "landed": True,
                                "evidence": evidence or {"pid": 9}}],
                       crash_points=[], figures=figures or {}, figure_bounds=bounds or {}, out_dir=out)
    return scenario_doc(r, report_dir=tmp, stack_kind="embedded")


def _summary(tmp: Path, docs: list[dict[str, object]], **extra: object) -> dict[str, object]:
    summary = build_summary(scenarios=docs, seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp, crash_catalog=[])
    summary.update(extra)
    return summary


def test_fault_evidence_and_figures_are_written_as_a_reader_writes_them_with_their_bounds(tmp_path: Path) -> None:
    ctx = ScenarioContext(deployment=None, processes=None, history=None, nemesis=None,  # type: ignore[arg-type]
                          rng=random.Random(1))
    ctx.figure("takeover_after_sigkill_s", 2.95, at_most=7, unit="s")
    ctx.figures["runs_listed"] = 3
    doc = _doc(tmp_path, "a", [Check("x", True)], figures=ctx.figures, bounds=ctx.figure_bounds,
               evidence={"pid": 9, "backend_pids": [101, 102], "point": "worker.before_commit", "note": None})
    summary = _summary(tmp_path, [doc])
    html, md = render_html(summary, {}), render_markdown(summary)
    assert "pid: 9; backend_pids: 101, 102; point: worker.before_commit; note: none" in html
    assert "backend_pids 101, 102" in md and "[101, 102]" not in md
    for text in (html, md):
        assert "{&#39;" not in text and "{'" not in text and "[101" not in text, text
    assert "2.95 (bound &lt;= 7 s)" in html and "takeover_after_sigkill_s = 2.95 (bound <= 7 s)" in md
    assert "runs_listed = 3;" not in md and "runs_listed = 3" in md   # no bound: none said


def test_the_html_shows_code_spans_not_backticks(tmp_path: Path) -> None:
    summary = _summary(tmp_path, [_doc(tmp_path, "a", [Check("x", True)])], full_run=False)
    html = render_html(summary, {})
    scope = html[html.index("<h2>Scope of this"):html.index("<h2>Provenance")]
    assert "`" not in scope and "<code>qualify run</code>" in scope, scope
    assert "`" not in html[:html.index("<main>")]   # nor in the banner


def test_a_check_detail_never_says_none_for_a_missing_error_code() -> None:
    assert outcome({"state": "failed", "error_code": None}) == "failed, no error_code"
    assert outcome({"state": "failed", "error_code": "workflow_vanished"}) == "failed, error_code workflow_vanished"
    assert outcome(None) == "no run read"
    # No scenario formats a run's error code into a detail by hand ("failed None").
    raw = re.compile(r"\{\w+(\[['\"]error_code['\"]\]|\.get\(['\"]error_code['\"]\))\}")
    found = [f"{p.name}:{n}" for p in sorted((ROOT / "qualify" / "scenarios").glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert not found, found


def test_the_gate_table_cites_every_scenario_it_says_covers_a_requirement(tmp_path: Path) -> None:
    # "b" does not list R-EXEC-4, but its check cites it and covers it; "c"..."g" list it.
    listing = [_doc(tmp_path, sid, [Check("x", True)]) for sid in "cdefg"]
    covering = _doc(tmp_path, "b", [Check("the run completed", True, "", ("R-EXEC-4",), judged=1)],
                    requirements=("R-EXEC-1",))
    summary = _summary(tmp_path, [*listing, covering])
    _, rows = requirement_rows(summary)
    row = next(r for r in rows if r["req"] == "R-EXEC-4")
    assert row["checks"] == ["b: the run completed"]
    assert row["passed"][0] == "b" and set(row["passed"]) == set("bcdefg"), row
    html = render_html(summary, {})
    cells = re.search(r'<td class="mono">R-EXEC-4</td>.*?</tr>', html, re.S)
    assert cells is not None
    cited = re.findall(r"<td>(.*?)</td>", cells.group(0), re.S)[-1]
    assert cited.startswith("b, "), cited   # shown, not among the "and N more"


def test_the_html_escapes_what_scenarios_wrote(tmp_path: Path) -> None:
    # The template is report.html.j2: select_autoescape() left it unescaped (a figure's
    # "<= 7 s" and any check detail went into the page as markup).
    doc = _doc(tmp_path, "a", [Check("x", False, "<b>raw</b> <= 7 s")], verdict=Verdict.FAIL)
    html = render_html(_summary(tmp_path, [doc]), {})
    assert "<b>raw</b>" not in html and "&lt;b&gt;raw&lt;/b&gt; &lt;= 7 s" in html
