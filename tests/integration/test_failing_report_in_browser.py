"""A failing report says what failed (issue 59, item 2; R-Q-6), read in a real browser at
1,280 px: the banner names the failing, flaky and crashed scenarios with links to them,
the scenario table lists them first, each such scenario shows its failing checks first
with their detail (among some 35 passing ones), and no result cell wraps ("FAI/L").
Rendered from a synthetic failing summary: 40 scenarios with long names, the failing ones
in the middle of the catalog, their failing check among the last."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.checkers import Check
from qualify.report import build_summary, scenario_doc, write_report
from qualify.runner import ScenarioResult
from qualify.scenarios import Scenario
from qualify.verdict import Verdict
from tests.integration.browser import CHROMIUM, CHROMIUM_ARGS, browser_or_skip

BAD = {17: Verdict.FAIL, 23: Verdict.FLAKY, 31: Verdict.CRASHED, 9: Verdict.FAIL}


def _sid(i: int) -> str:
    return f"a-scenario-with-a-long-descriptive-name-number-{i:02d}"


def _summary(tmp: Path) -> dict[str, object]:
    docs = []
    for i in range(40):
        sid, verdict = _sid(i), BAD.get(i, Verdict.PASS)
        sc = Scenario(sid, f"title of {sid}", ("R-EXEC-4",), lambda ctx: None, ("sigkill",))
        out = tmp / "scenarios" / sid
        (out / "logs").mkdir(parents=True)
        checks = [Check(f"the check {j} of the scenario, named as long as real ones are named", True,
                        '{"listed":{"agent-run-2017db0f-b52c-453c-8a56-d96769aad3b3-g1":{"generation":1}}}' * 3,
                        ("R-EXEC-4",), judged=2) for j in range(35)]
        if verdict in (Verdict.FAIL, Verdict.FLAKY):
            checks[30] = Check("the survivor committed the next checkpoint within the lease", False,
                               f"checkpoint 2 after 9.81 s in {sid}; transitions " + "running->running," * 12,
                               ("R-EXEC-4",), judged=1)
        result = ScenarioResult(scenario=sc, seed=5, verdict=verdict, duration_s=3.0, checks=checks,
                                faults=[{"fault": "sigkill", "target": "worker-1", "landed": True, "evidence": {"pid": 7}}],
                                crash_points=[], figures={}, out_dir=out, logs=[],
                                error="HarnessError: the worker did not start" if verdict is Verdict.CRASHED else "",
                                reproduction="1/2" if verdict is Verdict.FLAKY else "")
        docs.append(scenario_doc(result, report_dir=tmp, stack_kind="embedded"))
    return build_summary(scenarios=docs, seed=5, duration_s=120.0, stack={"kind": "embedded", "boot_s": 0.5},
                         provenance={"git_sha": "abc"}, report_dir=tmp, crash_catalog=[])


@pytest.mark.req("R-Q-6")
def test_a_failing_report_names_and_lists_what_failed_first_at_1280_px(tmp_path: Path) -> None:
    sync_playwright = browser_or_skip()
    write_report(tmp_path, _summary(tmp_path))
    failing, flaky, crashed = [_sid(9), _sid(17)], [_sid(23)], [_sid(31)]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((tmp_path / "report.html").as_uri())
            page.screenshot(path=str(tmp_path / "failing-1280.png"), full_page=False)
            # The banner names each with a link to its details.
            for status, ids in (("fail", failing), ("flaky", flaky), ("crashed", crashed)):
                line = page.locator(f".banner .failing[data-status={status}]")
                assert line.count() == 1, status
                assert [a.get_attribute("href") for a in line.locator("a").all()] == [f"#{i}" for i in ids]
            assert page.locator(".banner a[href='#" + _sid(0) + "']").count() == 0
            page.locator(f".banner a[href='#{_sid(17)}']").click()
            assert page.evaluate(f"document.getElementById('{_sid(17)}').getBoundingClientRect().top") < 100
            # The table: worst first, the passing after.
            rows = page.locator("table.scenarios tr").all()[1:]
            firsts = [r.locator("td").first.inner_text().strip() for r in rows[:4]]
            assert firsts == [*failing, *crashed, *flaky], firsts
            assert rows[4].locator("td").first.inner_text().strip() == _sid(0)
            # Inside a failing scenario: its failing check first, with its detail.
            first = page.locator(f"details[id='{_sid(17)}'] table.checks tr").nth(1)
            cells = first.locator("td").all_inner_texts()
            assert cells[1] == "FAIL" and "9.81 s" in cells[3], cells
            assert "1 of 35 checks did not hold" in page.locator(f"details[id='{_sid(17)}']").inner_text()
            # Every scenario opened: no result cell wraps, nothing wider than the window.
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            wrapped = page.evaluate("""[...document.querySelectorAll('td.result')].filter(td => {
                const r = document.createRange(); r.selectNodeContents(td);
                return r.getClientRects().length > 1; }).map(td => td.innerText)""")
            assert not wrapped, wrapped
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        finally:
            browser.close()
