from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from qualify.checkers import Check
from qualify.report import (
    SCHEMA,
    build_summary,
    render_junit,
    render_markdown,
    scenario_doc,
    write_report,
)
from qualify.runner import ScenarioResult, judge, sub_seed
from qualify.scenarios import Scenario
from qualify.verdict import EXIT_CODES, Verdict, merge


def test_merge_is_worst_first() -> None:
    V = Verdict
    assert merge([]) is V.PASS
    assert merge([V.PASS, V.VACUOUS]) is V.VACUOUS
    assert merge([V.VACUOUS, V.UNKNOWN, V.PASS]) is V.UNKNOWN
    assert merge([V.UNKNOWN, V.CRASHED]) is V.CRASHED
    assert merge([V.CRASHED, V.FAIL, V.PASS]) is V.FAIL
    assert len(set(EXIT_CODES.values())) == len(Verdict)
    assert EXIT_CODES[V.PASS] == 0


def test_judge() -> None:
    ok, bad, raised = Check("a", True), Check("b", False), Check("c", None)
    landed, missed = {"landed": True}, {"landed": False}
    assert judge([ok], [landed], expected_faults=1) is Verdict.PASS
    assert judge([ok, bad], [landed], expected_faults=1) is Verdict.FAIL
    assert judge([ok, raised], [landed], expected_faults=1) is Verdict.UNKNOWN
    assert judge([ok], [missed], expected_faults=1) is Verdict.VACUOUS
    assert judge([ok], [], expected_faults=1) is Verdict.VACUOUS
    assert judge([ok], [], expected_faults=1, error=Verdict.CRASHED) is Verdict.CRASHED
    assert judge([ok, bad], [], expected_faults=1, error=Verdict.CRASHED) is Verdict.FAIL
    # a scenario that accepted no run (and does not say why) exercised nothing
    assert judge([ok], [], expected_faults=0, exercised=False) is Verdict.VACUOUS
    assert judge([ok, bad], [], expected_faults=0, exercised=False) is Verdict.FAIL


@pytest.mark.req("R-Q-7")
def test_sub_seeds_are_stable_and_distinct() -> None:
    assert sub_seed(7, "a") == sub_seed(7, "a")
    assert sub_seed(7, "a") != sub_seed(7, "b") != sub_seed(8, "a")
    assert sub_seed(7, "a") == 9428802777907886192  # fixed across Python runs (no hash randomisation)


def _result(tmp: Path, sid: str, verdict: Verdict, checks: list[Check]) -> ScenarioResult:
    sc = Scenario(sid, f"title {sid}", ("R-EXEC-4",), lambda ctx: None, ("sigkill",))
    out = tmp / "scenarios" / sid
    (out / "logs").mkdir(parents=True)
    return ScenarioResult(scenario=sc, seed=5, verdict=verdict, duration_s=1.0, checks=checks,
                          faults=[{"fault": "sigkill", "target": "worker-1", "landed": True,
                                   "evidence": {"pid": 9}}],
                          crash_points=[], figures={}, out_dir=out, logs=["logs/worker-1.log"])


@pytest.mark.req("R-Q-6")
def test_summary_junit_and_markdown(tmp_path: Path) -> None:
    results = [_result(tmp_path, "a", Verdict.PASS, [Check("x", True)]),
               _result(tmp_path, "b", Verdict.FAIL, [Check("y", False, "broke")])]
    docs = [scenario_doc(r, report_dir=tmp_path, stack_kind="embedded") for r in results]
    summary = build_summary(scenarios=docs, seed=5, duration_s=3.2,
                            stack={"kind": "embedded", "boot_s": 0.5}, provenance={"git_sha": "abc"},
                            report_dir=tmp_path, crash_catalog=["p1"])
    assert summary["schema"] == SCHEMA and summary["verdict"] == "fail"
    for key in ("verdict", "seed", "duration_s", "git_sha", "stack", "scenarios"):
        assert key in summary
    s = summary["scenarios"][1]
    assert set(s) >= {"id", "status", "duration_s", "requirements", "faults", "checks", "repro"}
    assert s["repro"] == "qualify repro b --seed 5"
    assert summary["requirements"]["R-EXEC-4"] == {"passed": ["a"], "failed": ["b"]}
    assert summary["crash_points"] == {"p1": []}
    suite = ET.fromstring(render_junit(summary))
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    md = render_markdown(summary)
    assert "FAIL" in md and "qualify repro b --seed 5" in md
    write_report(tmp_path, summary)
    assert json.loads((tmp_path / "summary.json").read_text())["verdict"] == "fail"
    html = (tmp_path / "report.html").read_text()
    assert "Verdict: FAIL" in html and "qualify repro b --seed 5" in html
    assert "R-APPROVAL-1" in html  # the matrix spans every spec ID, exercised or not
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained


def test_a_scenarios_tables_reach_the_markdown_and_the_html(tmp_path: Path) -> None:
    r = _result(tmp_path, "m", Verdict.PASS, [Check("x", True)])
    r.tables = {"contract matrix": {"columns": ["route", "owner"], "rows": [["GET /x|y", "200 ok"]]}}
    doc = scenario_doc(r, report_dir=tmp_path, stack_kind="embedded")
    assert doc["tables"] == r.tables
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    md = render_markdown(summary)
    assert "| route | owner |" in md and "| GET /x y | 200 ok |" in md  # a pipe cannot break the row
    write_report(tmp_path, summary)
    html = (tmp_path / "report.html").read_text()
    assert "contract matrix" in html and "<th>owner</th>" in html and "GET /x|y" in html
    bare = scenario_doc(_result(tmp_path, "n", Verdict.PASS, [Check("x", True)]), report_dir=tmp_path,
                        stack_kind="embedded")
    assert "tables" not in bare


@pytest.mark.req("R-Q-6", "R-Q-8")
def test_the_html_shows_the_gate_and_each_requirement_with_what_covers_it_or_why_not(tmp_path: Path) -> None:
    """Issue 25, items 1-2: the gate's verdict and counts, each waiver's reason, and each
    requirement's covering checks by name (no numbered scenario columns to scroll)."""
    from qualify.coverage import WAIVED
    from qualify.spec_ids import REQUIREMENTS

    r = _result(tmp_path, "a", Verdict.PASS, [Check("the run completed", True, "", ("R-EXEC-4",), judged=1),
                                              Check("nothing judged", True, "", ("R-EXEC-1",), judged=0)])
    doc = scenario_doc(r, report_dir=tmp_path, stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    write_report(tmp_path, summary)
    html = (tmp_path / "report.html").read_text()
    uncovered = len(REQUIREMENTS) - 1 - len(WAIVED)
    assert f"1 of {len(REQUIREMENTS)} requirements covered" in html
    assert f"{len(WAIVED)} waived" in html and f"{uncovered} uncovered" in html
    assert "gate FAIL" in html
    assert "a: the run completed" in html                       # R-EXEC-4, by its check
    _, why = next(iter(WAIVED.items()))
    assert f"waived: {why}" in html.replace("&#39;", "'").replace("&amp;", "&")
    assert html.count("no passing check covers it") == uncovered  # R-EXEC-1 among them: judged nothing
    assert "<th title=" not in html                              # no numbered scenario columns


@pytest.mark.req("R-Q-6")
def test_the_sign_off_says_its_scope_faults_by_kind_and_where_the_time_went(tmp_path: Path) -> None:
    from qualify.report import faults_by_kind, time_table

    fast = _result(tmp_path, "fast", Verdict.PASS, [Check("x", True)])
    fast.duration_s = 1.0
    slow = _result(tmp_path, "slow", Verdict.PASS, [Check("x", True)])
    slow.duration_s = 3.0
    docs = [scenario_doc(r, report_dir=tmp_path, stack_kind="embedded") for r in (fast, slow)]
    summary = build_summary(scenarios=docs, seed=5, duration_s=4.5, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    total, rows = time_table(summary)
    assert total == 4.0 and [r["id"] for r in rows] == ["slow", "fast"] and rows[0]["share"] == 0.75
    kinds = faults_by_kind(summary)
    assert kinds == [{"kind": "sigkill", "struck": 2, "scenarios": ["fast", "slow"]}]
    write_report(tmp_path, summary)
    for text in ((tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()):
        assert "Does not qualify" in text and "live model provider" in text
        assert "Faults by kind" in text and "Time per scenario" in text and "75%" in text


@pytest.mark.req("R-Q-4", "R-Q-6")
def test_every_crash_point_action_has_a_column_so_no_strike_is_left_out(tmp_path: Path) -> None:
    """A ``freeze`` strike shows under its own column (a tester saw ``- - -`` for a crash
    point a passing run had frozen)."""
    from qualify.report import crash_matrix

    doc = scenario_doc(_result(tmp_path, "late", Verdict.PASS, [Check("x", True)]), report_dir=tmp_path,
                       stack_kind="embedded")
    doc["crash_point_evidence"] = [{"point": "p.freeze", "action": "freeze"},
                                   {"point": "p.kill", "action": "kill"}]
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=["p.freeze", "p.kill"])
    actions, matrix = crash_matrix(summary)
    assert actions == ["kill", "stop", "hold", "freeze"]
    assert matrix == {"p.freeze": {"freeze": ["late"]}, "p.kill": {"kill": ["late"]}}
    assert "| p.freeze | - | - | - | late |" in render_markdown(summary)


@pytest.mark.req("R-Q-6")
@pytest.mark.parametrize("full", [True, False])
def test_a_selections_report_says_it_is_not_a_sign_off(tmp_path: Path, full: bool) -> None:
    doc = scenario_doc(_result(tmp_path, "one", Verdict.PASS, [Check("x", True)]), report_dir=tmp_path,
                       stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    summary.update(full_run=full, catalog_size=98)
    write_report(tmp_path, summary)
    for text in ((tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()):
        said = "Not a release sign-off: a selection of 1 scenario of the catalog&#39;s 98" in text.replace("'", "&#39;")
        assert said is not full
        # Said at the top, before anything reads like a verdict on the release (a reviewer
        # found it 130 lines down, after the requirements table).
        assert (text.find("Not a release sign-off") < text.find("## Scenarios") if not full
                and "## Scenarios" in text else True)
        assert ("A full run qualifies" in text) is not full
    md = (tmp_path / "report.md").read_text().splitlines()
    assert ("a selection (not a sign-off)" in md[0]) is not full
    html = (tmp_path / "report.html").read_text()
    assert ("a selection, not a sign-off" in html) is not full
    title = html.split("<title>", 1)[1].split("</title>", 1)[0]
    assert ("selection" in title) is not full  # a second tester's finding: the title said PASS only
    assert ("requirement gate FAIL" in html) is full  # a selection's gate is not applied: no FAIL beside PASS
    assert "1 scenarios" not in html and ("Scope of this sign-off" in html) is full


@pytest.mark.req("R-Q-8")
def test_a_selections_summary_carries_its_gate_not_applied(tmp_path: Path) -> None:
    """The page showed a selection's requirement gate; its summary.json had none. Now both
    say what it covers, and the JSON that the gate was not applied."""
    from qualify.session import full_run_gates, mark_selection

    doc = scenario_doc(_result(tmp_path, "one", Verdict.PASS, [Check("x", True, requirements=("R-EXEC-1",), judged=1)]),
                       report_dir=tmp_path, stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    mark_selection(summary, [doc])
    assert summary["full_run"] is False and summary["requirement_gate"]["applied"] is False
    assert "R-EXEC-1" in summary["requirement_gate"]["covered"] and summary["verdict"] == "pass"
    full_run_gates(summary, [doc])
    assert summary["full_run"] is True and summary["requirement_gate"]["applied"] is True
    assert summary["verdict"] == "fail"  # a full run's gate fails on every uncovered requirement


@pytest.mark.req("R-Q-6")
def test_faults_by_kind_names_the_holds_it_leaves_to_the_crash_matrix(tmp_path: Path) -> None:
    """A reviewer saw two holds in the crash-point matrix for cancel-vs-completion and no
    fault for it in "Faults by kind": a hold that only orders a race is a schedule, not a
    fault, and the page now says how many it left out and where."""
    from qualify.report import faults_note, scheduling_strikes

    doc = scenario_doc(_result(tmp_path, "race", Verdict.PASS, [Check("x", True)]), report_dir=tmp_path,
                       stack_kind="embedded")
    doc["crash_point_evidence"] = [{"point": "p", "action": "hold"}, {"point": "q", "action": "hold"}]
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=["p", "q"])
    assert scheduling_strikes(summary) == (2, ["race"])
    assert "2 crash-point strike(s) that only ordered a race" in faults_note(summary)
    doc["faults"] = ["crash_point:hold worker-1 (landed)", "crash_point:hold worker-1 (landed)"]
    assert scheduling_strikes(summary) == (0, [])


def test_figures_read_as_figures_and_a_negative_one_as_did_not_happen() -> None:
    """They were a Python dict's repr, and -1.0 stood for a takeover that never came."""
    from qualify.report import figure_text

    assert figure_text({"takeover_s": 2.973, "takeover_after_sigkill_s": -1.0, "n": 3}) == (
        "takeover_s = 2.973; takeover_after_sigkill_s = did not happen; n = 3")


def test_a_random_schedule_is_not_called_one_of_the_catalogs_scenarios() -> None:
    """A tester's finding: ``qualify run --random 1`` said "a selection of 1 of the
    catalog's 100 scenarios"; a random schedule is not one of them."""
    from qualify.report import selection_words

    assert selection_words({"scenarios": [{"id": "random-0"}], "catalog_size": 100}) == \
        "a selection of 1 random schedule"
    both = {"scenarios": [{"id": "happy-path"}, {"id": "random-3"}, {"id": "schedule"}], "catalog_size": 100}
    assert selection_words(both) == "a selection of 1 scenario of the catalog's 100 and 2 random schedules"


@pytest.mark.req("R-Q-6", "R-Q-8")
@pytest.mark.parametrize("full", [True, False])
def test_a_selections_gate_section_says_not_applied_not_fail(tmp_path: Path, full: bool) -> None:
    """A new user's finding: a passing selection's page said, under "Requirement gate", in
    red, "gate FAIL ... uncovered — a full run fails on these", while its banner said the
    gate is not applied to a selection. A selection's page says what it covers, no FAIL."""
    doc = scenario_doc(_result(tmp_path, "one", Verdict.PASS, [Check("x", True, requirements=("R-EXEC-1",), judged=1)]),
                       report_dir=tmp_path, stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    summary.update(full_run=full, catalog_size=98)
    write_report(tmp_path, summary)
    html = (tmp_path / "report.html").read_text()
    gate = html.split('<h2 id="gate">', 1)[1].split("<table", 1)[0]
    assert ("gate FAIL" in gate) is full
    assert ("a full run fails on these" in gate) is full
    assert ("not applied" in gate) is not full
    md = (tmp_path / "report.md").read_text().split("## Requirement coverage", 1)[1].split("|", 1)[0]
    assert ("a full run fails on these" in md) is full and ("not applied" in md) is not full


@pytest.mark.req("R-Q-6", "R-Q-8")
def test_junit_fails_when_the_full_runs_gates_fail_though_every_scenario_passed(tmp_path: Path) -> None:
    """A new user's finding: a full run whose requirement gate failed (verdict fail, exit 1,
    ``summary.error`` naming the uncovered requirements) wrote a junit.xml of passing
    testcases only, so a CI dashboard that reads it showed the release green. The session's
    own failure is a testcase of its own, with the reason."""
    from qualify.session import full_run_gates

    doc = scenario_doc(_result(tmp_path, "one", Verdict.PASS, [Check("x", True, requirements=("R-EXEC-1",), judged=1)]),
                       report_dir=tmp_path, stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    full_run_gates(summary, [doc])
    assert summary["verdict"] == "fail" and "requirement without a passing check" in summary["error"]
    suite = ET.fromstring(render_junit(summary))
    assert int(suite.get("failures", "0")) + int(suite.get("errors", "0")) >= 1
    reasons = [el.text or "" for case in suite.iter("testcase") for el in case if el.tag in ("failure", "error")]
    assert any("requirement without a passing check" in text for text in reasons), reasons
    assert suite.get("tests") == str(len(list(suite.iter("testcase"))))
    crashed = dict(summary, verdict="crashed", error="the stack did not boot", scenarios=[])
    suite = ET.fromstring(render_junit(crashed))
    assert suite.get("errors") == "1" and "the stack did not boot" in ET.tostring(suite, encoding="unicode")


@pytest.mark.req("R-Q-6")
def test_junit_does_not_pass_a_flaky_scenario(tmp_path: Path) -> None:
    """A flaky scenario's checker found a violation in some of its runs (its checks are the
    failing run's, verdict flaky, exit 5), and junit.xml showed it as a passing testcase."""
    r = _result(tmp_path, "wobbly", Verdict.FLAKY, [Check("no write after terminal", False, "run r written")])
    r.reproduction = "1/2"
    doc = scenario_doc(r, report_dir=tmp_path, stack_kind="embedded")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=[])
    assert summary["verdict"] == "flaky"
    suite = ET.fromstring(render_junit(summary))
    case = next(suite.iter("testcase"))
    failure = case.find("failure")
    assert suite.get("failures") == "1" and failure is not None
    assert "flaky 1/2" in failure.get("message", "") and "run r written" in (failure.text or "")


@pytest.mark.req("R-Q-6", "R-Q-12")
def test_the_html_names_refused_scenarios_and_waived_crash_points(tmp_path: Path) -> None:
    """A new user's finding: a staging run (``--stack existing``) refuses the scenarios that
    restart PostgreSQL or Temporal and waives the crash points only they strike; report.md
    said so ("Refused (not run)", "crash point … waived"), report.html, the page a reviewer
    reads, said neither: its crash-point matrix showed such a point as never struck, with
    no reason, and the refused scenarios appeared nowhere."""
    doc = scenario_doc(_result(tmp_path, "one", Verdict.PASS, [Check("x", True)]), report_dir=tmp_path,
                       stack_kind="existing")
    summary = build_summary(scenarios=[doc], seed=5, duration_s=1.0, stack={"kind": "existing", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp_path, crash_catalog=["p.only_restarts"])
    summary["refused"] = ["postgres-restart-mid-run"]
    summary["waived_crash_points"] = {"p.only_restarts": "refused on a stack the harness did not boot: "
                                                         "postgres-restart-mid-run"}
    write_report(tmp_path, summary)
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "Refused (not run): postgres-restart-mid-run" in md and "crash point p.only_restarts waived" in md
    assert "Refused (not run)" in html and "postgres-restart-mid-run" in html
    assert "p.only_restarts" in html and "waived: refused on a stack the harness did not boot" in html
