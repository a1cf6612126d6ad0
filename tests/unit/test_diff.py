"""``qualify diff`` (issue 25, item 3): what changed between two sign-offs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qualify.cli import app
from qualify.diff import diff_summaries, render_diff


def _summary(*scenarios: dict[str, Any], verdict: str = "pass") -> dict[str, Any]:
    return {"verdict": verdict, "scenarios": list(scenarios)}


def _sc(sid: str, status: str = "pass", **checks: tuple[bool, str]) -> dict[str, Any]:
    return {"id": sid, "status": status,
            "checks": [{"name": n, "ok": ok, "requirements": [req], "judged": 1} for n, (ok, req) in checks.items()]}


@pytest.mark.req("R-Q-6", "R-Q-8")
def test_a_diff_names_scenarios_checks_and_lost_coverage() -> None:
    old = _summary(_sc("a", x=(True, "R-EXEC-1")), _sc("gone", y=(True, "R-TOOL-1")))
    new = _summary(_sc("a", "fail", x=(False, "R-EXEC-1"), z=(True, "R-EXEC-3")),
                   _sc("fresh", z=(True, "R-EXEC-2")), verdict="fail")
    d = diff_summaries(old, new)
    assert d["scenarios_added"] == ["fresh"] and d["scenarios_removed"] == ["gone"]
    assert d["status_changed"] == {"a": ["pass", "fail"]}
    assert d["checks_added"] == {"a": ["z"]} and d["checks_changed"] == {"a": {"x": [True, False]}}
    # a failed scenario's checks cover nothing (R-EXEC-3 is not gained)
    assert d["coverage_lost"] == ["R-EXEC-1", "R-TOOL-1"] and d["coverage_gained"] == ["R-EXEC-2"]
    text = render_diff(d)
    assert "**requirements that lost coverage (2)**:\n  R-EXEC-1, R-TOOL-1\n" in text and "- a: x: True -> False" in text


def test_no_change_says_so_and_the_command_exits_on_lost_coverage(tmp_path: Path) -> None:
    same = _summary(_sc("a", x=(True, "R-EXEC-1")))
    assert "no change" in render_diff(diff_summaries(same, same))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps(same))
    (tmp_path / "new.json").write_text(json.dumps(_summary(_sc("a"))))
    runner = CliRunner()
    assert runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "old")]).exit_code == 0
    lost = runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "new.json")])
    assert lost.exit_code == 1 and "R-EXEC-1" in lost.output
    assert runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "missing")]).exit_code == 64


@pytest.mark.req("R-Q-12")
def test_a_check_that_now_judges_nothing_or_disappears_is_a_regression(tmp_path: Path) -> None:
    """A reviewer's edit of a real summary: a scenario whose checks all came to judge
    nothing was not reported, and two deleted checks exited 0."""
    old = _summary(_sc("a", x=(True, "R-EXEC-1"), y=(True, "R-EXEC-2")), _sc("b", z=(True, "R-EXEC-3")))
    new = json.loads(json.dumps(old))
    new["scenarios"][0]["checks"] = [{**new["scenarios"][0]["checks"][0], "judged": 0}]  # x vacuous, y gone
    d = diff_summaries(old, new)
    assert d["checks_vacuous"] == {"a": ["x"]} and d["checks_removed"] == {"a": ["y"]}
    assert "a: check judged nothing: x" in d["regressions"] and "a: check removed: y" in d["regressions"]
    assert "**checks that judged something before and nothing now**:\n- a: x\n" in render_diff(d)
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert CliRunner().invoke(app, ["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")]).exit_code == 1


def test_a_name_repeated_in_a_scenario_is_one_check() -> None:
    """An ``expect`` in a retry loop names its check once per round: one check, ok when
    every round is, judging the sum; a run with one round fewer changes nothing."""
    two = _summary({"id": "a", "status": "pass", "checks": [
        {"name": "x", "ok": True, "requirements": ["R-EXEC-1"], "judged": 1},
        {"name": "x", "ok": True, "requirements": ["R-EXEC-1"], "judged": 1}]})
    one = _summary(_sc("a", x=(True, "R-EXEC-1")))
    d = diff_summaries(two, one)
    assert not d["regressions"] and "no change" in render_diff(d)


def test_a_selection_says_so() -> None:
    full = {**_summary(_sc("a", x=(True, "R-EXEC-1")), _sc("b", y=(True, "R-EXEC-2"))), "full_run": True}
    part = {**_summary(_sc("a", x=(True, "R-EXEC-1"))), "full_run": False}
    d = diff_summaries(full, part)
    assert d["selection"] == [False, True] and "scenario removed: b" in d["regressions"]
    assert "NEW is a selection of the catalog" in render_diff(d)


def _timed(sid: str, duration_s: float, **figures: float) -> dict[str, Any]:
    return {**_sc(sid, x=(True, "R-EXEC-1")), "duration_s": duration_s, "figures": figures,
            "figure_bounds": {"takeover_after_sigkill_s": "<= 7 s"}}


@pytest.mark.req("R-Q-6")
def test_a_diff_shows_every_figure_that_changed_and_durations_beyond_the_threshold() -> None:
    """Issue 59, item 5: a takeover figure that went from 2.95 s to 4.10 s did not show."""
    old = _summary(_timed("a", 10.0, takeover_after_sigkill_s=2.95, runs_listed=3.0), _timed("b", 10.0),
                   _timed("c", 2.0), _timed("d", 0.4))
    new = _summary(_timed("a", 10.9, takeover_after_sigkill_s=4.10, runs_listed=3.0), _timed("b", 14.0),
                   _timed("c", 2.9), _timed("d", 1.2))
    d = diff_summaries(old, new)
    assert d["figures_changed"] == {"a": {"takeover_after_sigkill_s": {"old": 2.95, "new": 4.1, "bound": "<= 7 s"}}}
    # beyond 1 s and 25 %: b (+4 s, 40 %); not a (0.9 s), c (0.9 s, 45 %) nor d (0.8 s, 200 %)
    assert d["durations_changed"] == {"b": [10.0, 14.0]}
    text = render_diff(d)
    assert "- a: takeover_after_sigkill_s: 2.95 -> 4.1 (+39 %) (bound <= 7 s)" in text
    assert "- b: 10 -> 14 (+40 %)" in text and "more than 1 s and 25 %" in text
    assert not d["regressions"]   # figures and durations inform; they do not fail the diff


def test_the_terminal_rendering_wraps_lists_and_shows_no_markdown(tmp_path: Path) -> None:
    ids = [f"scenario-number-{i}" for i in range(100)]
    old = _summary(_sc("a", x=(True, "R-EXEC-1")), *(_sc(i) for i in ids))
    new = _summary(_sc("a", x=(True, "R-EXEC-1")))
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    done = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")])
    assert done.exit_code == 1
    lines = done.output.splitlines()
    assert "**" not in done.output and "scenarios removed (100)" in done.output
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    listed = [w.strip(",") for line in lines if line.startswith("  ") for w in line.split()]
    assert listed == sorted(ids)
    # On a terminal: styled (ANSI), still no markdown.
    import io

    from rich.console import Console

    from qualify.diff import print_diff

    out = io.StringIO()
    print_diff(diff_summaries(old, new), Console(file=out, force_terminal=True, width=80))
    assert "\x1b[" in out.getvalue() and "**" not in out.getvalue()
    markdown = CliRunner().invoke(app, ["diff", "--markdown", str(tmp_path / "old.json"), str(tmp_path / "new.json")])
    assert "**scenarios removed (100)**:" in markdown.output
    assert max(len(line) for line in markdown.output.splitlines()) <= 100
