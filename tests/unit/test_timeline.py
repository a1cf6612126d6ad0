from qualify.timeline import MAX_EVENTS, svg_timeline


def test_timeline_draws_each_event_and_says_when_capped() -> None:
    events = [{"type": "transition", "t": float(i), "new_state": "running", "run_id": "r"} for i in range(5)]
    svg, capped = svg_timeline([*events, {"type": "unknown-kind", "t": 9.0}])
    assert svg.count("<circle") == 5 and not capped
    many = [{"type": "fault", "t": float(i), "fault": "sigkill"} for i in range(MAX_EVENTS + 3)]
    svg, capped = svg_timeline(many)
    assert capped and svg.count("<circle") == MAX_EVENTS


def test_timeline_escapes_event_text() -> None:
    svg, _ = svg_timeline([{"type": "client", "t": 1.0, "op": "<script>"}])
    assert "<script>" not in svg and "&lt;script&gt;" in svg
