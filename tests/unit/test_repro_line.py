"""``qualify repro --schedule`` (issue 59): the repro line it prints replays the same
schedule under the same seed, ``--shrink`` says when there is nothing to shrink, and a
schedule's size names its unit."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qualify import cli, session
from qualify.console import nothing_to_shrink, shrunk_line
from qualify.report import scenario_doc
from qualify.runner import ScenarioResult, sub_seed
from qualify.schedule import FaultPlan, RunPlan, Schedule, generate
from qualify.session import SessionOptions, resolve, session_seed
from qualify.verdict import Verdict


def _opts_of(args: list[str], monkeypatch: pytest.MonkeyPatch, status: str = "fail") -> tuple[SessionOptions, str]:
    """The options ``qualify ARGS`` runs its session with (the session itself faked), and
    what it printed."""
    seen: list[SessionOptions] = []

    def fake(opts: SessionOptions, on_event: Any = None) -> tuple[dict[str, Any], Path, int]:
        seen.append(opts)
        summary = {"verdict": status, "duration_s": 1.0, "seed": session_seed(opts),
                   "scenarios": [{"id": "random-0", "status": status, "repro": "-", "checks": []}]}
        return summary, Path("/tmp/qualify-fake"), 0 if status == "pass" else 1

    monkeypatch.setattr(session, "run_session", fake)
    done = CliRunner().invoke(cli.app, args)
    assert seen, done.output
    return seen[0], done.output


def _repro_of(opts: SessionOptions, tmp: Path) -> tuple[str, str, int]:
    """The repro line the session of ``opts`` writes for its one scenario, and that
    scenario's schedule and seed."""
    seed = session_seed(opts)
    (sc,) = resolve(opts.scenario_ids, seed=seed, schedule_path=opts.schedule_path)
    out = tmp / "scenarios" / sc.id
    (out / "logs").mkdir(parents=True, exist_ok=True)
    result = ScenarioResult(scenario=sc, seed=seed, verdict=Verdict.FAIL, duration_s=1.0, checks=[],
                            faults=[], crash_points=[], figures={}, out_dir=out)
    doc = scenario_doc(result, report_dir=tmp, stack_kind="embedded")
    assert sc.schedule is not None
    return doc["repro"], sc.schedule, seed


@pytest.mark.req("R-Q-6")
def test_repro_line_of_a_saved_schedule_replays_that_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The file repro --shrink writes: found under session seed 42 as random-0, shrunk.
    shrunk = Schedule(seed=generate(sub_seed(42, "random-0")).seed, runs=(RunPlan(steps=2, delay_ms=0),),
                      faults=(FaultPlan(run=0, step=1, action="sigkill-worker"),))
    saved = tmp_path / "saved dir" / "repro.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({"scenario": "random-0", "seed": 42, "schedule": json.loads(shrunk.to_json())}))

    opts, _ = _opts_of(["repro", "--schedule", str(saved)], monkeypatch)
    line, schedule, seed = _repro_of(opts, tmp_path / "first")
    assert seed == 42 and json.loads(schedule) == json.loads(shrunk.to_json())
    # What the line says is what runs again: the same schedule under the same seed (the old
    # line, "qualify repro random-0 --seed 0", re-derived another schedule from seed 0).
    words = shlex.split(line)
    assert words[:2] == ["qualify", "repro"], line
    again, _ = _opts_of(words[1:], monkeypatch)
    line2, schedule2, seed2 = _repro_of(again, tmp_path / "second")
    assert (schedule2, seed2) == (schedule, seed), line
    assert line2 == line


def test_shrink_of_a_passing_schedule_says_there_is_nothing_to_shrink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tmp_path / "repro.json"
    saved.write_text(json.dumps({"scenario": "random-0", "seed": 42,
                                 "schedule": json.loads(generate(7).to_json())}))
    _, printed = _opts_of(["repro", "--schedule", str(saved), "--shrink"], monkeypatch, status="pass")
    assert "nothing to shrink" in printed and "random-0 passed" in printed, printed
    assert "ended crashed" in nothing_to_shrink([{"id": "x", "status": "crashed"}])


def test_a_shrunk_schedule_names_its_size_unit() -> None:
    start = Schedule(seed=1, runs=(RunPlan(3, 20), RunPlan(2, 0)),
                     faults=(FaultPlan(0, 1, "sigkill-worker"), FaultPlan(1, 2, "sigstop-worker")))
    minimal = Schedule(seed=1, runs=(RunPlan(2, 0),), faults=(FaultPlan(0, 1, "sigkill-worker"),))
    assert start.shape == "2 runs, 2 faults, 5 steps, 1 delayed start" and start.size == 10
    line = shrunk_line(minimal, start, 12)
    assert "1 run, 1 fault, 2 steps (size 4, from 10, counting runs + faults + steps + delayed starts" in line
    assert "no smaller schedule fails" in shrunk_line(start, start, 3)
