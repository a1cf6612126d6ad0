"""The report's per-scenario timeline picture (issue 25, item 3): faults, owners and
transitions on the database's clock."""

from __future__ import annotations

import re

from qualify.history import Event
from qualify.timeline import MAX_EVENTS, MAX_RUNS, STATE_COLOURS, svg_timeline


def _transition(run: str, i: int, state: str, owner: int | None, step: int = 0) -> Event:
    return {"type": "transition", "t": 100.0 + i, "commit_t": 100.5 + i, "id": i, "run_id": run,
            "new_state": state, "owner_attempt": owner, "checkpoint_step": step}


def test_a_run_band_shows_each_state_span_its_owner_takeovers_and_checkpoints() -> None:
    rows = [_transition("run-a", 0, "accepted", None), _transition("run-a", 1, "queued", None),
            _transition("run-a", 2, "running", 1), _transition("run-a", 3, "running", 2),
            _transition("run-a", 4, "running", 2, step=1), _transition("run-a", 5, "completed", 2, step=1)]
    svg, capped = svg_timeline([*rows, {"type": "fault", "t": 102.7, "fault": "crash_point:kill",
                                        "target": "worker-1"}])
    assert not capped
    spans = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="14" fill="(#\w+)"', svg)
    assert spans == [STATE_COLOURS[s] for s in
                     ("accepted", "queued", "running", "running", "running", "completed")]
    assert ">a1</text>" in svg and ">a2</text>" in svg
    assert svg.count("takeover: attempt 1 → 2") == 1
    assert svg.count("checkpoint step 1") == 1
    assert svg.count('stroke="#dc2626"') == 1 and ">kill</text>" in svg


def test_spans_start_at_the_commit_time_on_the_database_clock() -> None:
    """Two runs: the second's only transition committed 1 s after its ``t``; its span
    starts where the commit is, not where ``t`` is."""
    a = {"type": "transition", "t": 0.0, "commit_t": 0.0, "id": 1, "run_id": "a", "new_state": "queued"}
    b = {"type": "transition", "t": 1.0, "commit_t": 2.0, "id": 2, "run_id": "b", "new_state": "queued"}
    end = {"type": "client", "t": 4.0, "op": "read"}
    svg, _ = svg_timeline([a, b, end])
    xs = [float(v) for v in re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="[\d.]+" height="14"', svg)]
    assert xs[1] - xs[0] == (900 - 110 - 14) * 2.0 / 4.0


def test_timeline_caps_runs_and_dots_and_says_so() -> None:
    many_runs = [_transition(f"run-{i:02d}", i, "queued", None) for i in range(MAX_RUNS + 2)]
    svg, capped = svg_timeline(many_runs)
    assert capped and "2 more runs, not drawn" in svg and svg.count("</title>run ") == MAX_RUNS
    dots = [{"type": "client", "t": float(i), "op": "read"} for i in range(MAX_EVENTS + 3)]
    svg, capped = svg_timeline(dots)
    assert capped and svg.count("<circle") == MAX_EVENTS


def test_timeline_escapes_event_text_and_ignores_unknown_kinds() -> None:
    svg, _ = svg_timeline([{"type": "client", "t": 1.0, "op": "<script>"}, {"type": "odd", "t": 2.0}])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and svg.count("<circle") == 1
