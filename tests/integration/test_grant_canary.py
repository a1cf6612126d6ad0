"""No grant leaks (R-READ-3): a recognisable canary planted in an authorisation grant
appears nowhere in the report: not in responses recorded in the history, events, process
logs, summary, JUnit, Markdown or HTML."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.scenarios.contract import canary_for
from qualify.session import SessionOptions, run_session


@pytest.mark.req("R-READ-3")
def test_the_planted_grant_appears_nowhere_in_the_report(tmp_path: Path) -> None:
    seed = 424242
    summary, report_dir, code = run_session(SessionOptions(
        scenario_ids=["tenant-isolation"], seed=seed, reports_root=tmp_path))
    assert code == 0, summary["scenarios"]
    files = [p for p in report_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files) and any(p.name == "history.jsonl" for p in files)
    canary = canary_for(seed)
    leaks = [str(p.relative_to(report_dir)) for p in files if canary in p.read_text(errors="replace")]
    assert leaks == []
