"""The sign-off page read in a real browser at 1,280 px (issue 25, item 2; R-Q-6): with a
full catalog's worth of scenarios (90, long names) and every spec requirement, nothing is
wider than the window — no requirement or scenario column is off-screen — and the
requirement rows a release manager looks for (R-PROV-1, R-TOOL-*) are on the page with
their status. Headless Chromium renders the file and takes a screenshot (kept in the
test's temporary directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.checkers import Check
from qualify.report import build_summary, scenario_doc, write_report
from qualify.runner import ScenarioResult
from qualify.scenarios import Scenario
from qualify.spec_ids import REQUIREMENTS
from qualify.verdict import Verdict
from tests.integration.browser import CHROMIUM, CHROMIUM_ARGS, browser_or_skip


def _summary(tmp: Path) -> dict[str, object]:
    docs = []
    for i in range(90):
        sid = f"scenario-with-a-long-descriptive-name-number-{i:02d}"
        reqs = tuple(REQUIREMENTS[(i * 3 + k) % len(REQUIREMENTS)] for k in range(3))
        sc = Scenario(sid, f"title of {sid}", reqs, lambda ctx: None, ("sigkill",))
        out = tmp / "scenarios" / sid
        (out / "logs").mkdir(parents=True)
        # Details as long as real ones: JSON without spaces, a trail of ids.
        detail = '{"listed":{"agent-run-2017db0f-b52c-453c-8a56-d96769aad3b3-g1":{"generation":1}}}' * 3
        checks = [Check(f"the check {j} of {sid} that judged its items", True, detail if j == 0 else "",
                        (req,), judged=2) for j, req in enumerate(reqs)]
        # A table as wide as the contract matrix's: a route and nine credential kinds.
        tables = {"contract matrix": {
            "columns": ["route", *[f"credential-kind-{k}" for k in range(9)]],
            "rows": [[f"POST /v1/agents/{{agent_id}}/runs/{{run_id}}/route-{r}",
                      *["403 tenant_not_assigned (wanted 403 or 404 not_found)"] * 9] for r in range(3)]}}
        result = ScenarioResult(scenario=sc, seed=5, verdict=Verdict.PASS, duration_s=3.0 + i % 7, checks=checks,
                                faults=[{"fault": "sigkill", "target": "worker-1", "landed": True, "evidence": {}}],
                                crash_points=[], figures={}, out_dir=out, logs=[],
                                tables=tables if i % 10 == 0 else {})
        docs.append(scenario_doc(result, report_dir=tmp, stack_kind="embedded"))
    summary = build_summary(scenarios=docs, seed=5, duration_s=300.0, stack={"kind": "embedded", "boot_s": 0.5},
                            provenance={"git_sha": "abc"}, report_dir=tmp, crash_catalog=[])
    # A staging run's refusals and waivers, as long as real ones.
    refused = [f"a-scenario-that-restarts-postgres-or-temporal-number-{i:02d}" for i in range(12)]
    summary["refused"] = refused
    summary["waived_crash_points"] = {f"activity.a_long_crash_point_name_number_{i:02d}":
                                      "refused on a stack the harness did not boot (it restarts or stops "
                                      "PostgreSQL or Temporal): " + ", ".join(refused) for i in range(3)}
    return summary


@pytest.mark.req("R-Q-6")
def test_the_report_fits_1280_px_and_shows_every_requirement(tmp_path: Path) -> None:
    sync_playwright = browser_or_skip()
    write_report(tmp_path, _summary(tmp_path))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((tmp_path / "report.html").as_uri())
            page.screenshot(path=str(tmp_path / "report-1280.png"), full_page=False)
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
            # Every scenario opened: its checks, tables and timeline fit too.
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
            widest = page.evaluate(
                "Math.max(...[...document.querySelectorAll('main table, main svg')]"
                ".map(t => t.getBoundingClientRect().right))")
            assert widest <= 1280, f"a table or picture reaches {widest} px"
            for req in ("R-PROV-1", "R-TOOL-1", "R-TOOL-5"):
                row = page.locator("table.reqs tr", has_text=req).first
                box = row.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 1280, (req, box)
                assert row.inner_text().split("\t")[1].split()[0] in ("covered", "waived", "uncovered")
            banner = page.locator(".banner").inner_text()
            assert "requirement gate" in banner and "covered" in banner
        finally:
            browser.close()
    assert (tmp_path / "report-1280.png").stat().st_size > 10_000
