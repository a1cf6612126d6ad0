"""report.md of a failing run (issue 59, item 2): the verdict, what did not pass and the
requirement gate at its top; the scenarios that did not pass first; in each, the failing
checks first."""

from __future__ import annotations

from pathlib import Path

from qualify.checkers import Check
from qualify.report import build_summary, render_markdown, scenario_doc
from qualify.runner import ScenarioResult
from qualify.scenarios import Scenario
from qualify.verdict import Verdict


def _doc(tmp: Path, sid: str, verdict: Verdict, checks: list[Check]) -> dict[str, object]:
    out = tmp / "scenarios" / sid
    (out / "logs").mkdir(parents=True)
    sc = Scenario(sid, f"title {sid}", ("R-EXEC-4",), lambda ctx: None, ("sigkill",))
    return scenario_doc(ScenarioResult(scenario=sc, seed=5, verdict=verdict, duration_s=1.0, checks=checks,
                                       faults=[], crash_points=[], figures={}, out_dir=out),
                        report_dir=tmp, stack_kind="embedded")


def test_report_md_puts_the_verdict_what_failed_and_the_gate_at_its_top(tmp_path: Path) -> None:
    ok = [Check(f"holds {j}", True, "", ("R-EXEC-4",), judged=1) for j in range(30)]
    docs = [_doc(tmp_path, "a-passes", Verdict.PASS, ok),
            _doc(tmp_path, "b-fails", Verdict.FAIL, [*ok, Check("broke", False, "took 9.8 s")]),
            _doc(tmp_path, "c-flaky", Verdict.FLAKY, [*ok, Check("broke once", False, "1 of 2")]),
            _doc(tmp_path, "d-crashed", Verdict.CRASHED, ok)]
    md = render_markdown(build_summary(scenarios=docs, seed=5, duration_s=3.0, stack={"kind": "embedded"},
                                       provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[]))
    top = md.splitlines()[:8]
    assert "verdict: **FAIL**" in top[0]
    assert "- **fail** (1): [b-fails](#b-fails--fail)" in top, top
    assert "- **crashed** (1): [d-crashed](#d-crashed--crashed)" in top and "- **flaky** (1): [c-flaky](#c-flaky--flaky)" in top
    assert any(line.startswith("- requirement gate FAIL: 1 of ") for line in top), top
    table = [line.split(" | ")[0].strip("| ") for line in md.splitlines() if line.startswith("| ") and " | " in line]
    assert table[1:5] == ["b-fails", "d-crashed", "c-flaky", "a-passes"], table[:5]
    section = md[md.index("### b-fails — fail"):]
    first_check = next(line for line in section.splitlines() if line.startswith("- ["))
    assert first_check.startswith("- [FAIL] broke (judged ") and first_check.endswith("took 9.8 s"), first_check
