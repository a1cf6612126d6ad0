"""Observed usage (R-Q34-2): the checker over a history recorded from a real run of
``kill-at-every-commit-boundary`` (a SIGKILL before and after each checkpoint: every step
asked twice), edited into the bad histories a broken record would produce; and the pure
projection of the run's usage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qimpl.usage import reported_tokens, run_usage
from qualify import checkers as ck

RECORDED = Path(__file__).parents[1] / "data" / "kill_boundary_usage_history.jsonl"


def recorded() -> list[dict[str, Any]]:
    return [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]


def _edit(history: list[dict[str, Any]], type_: str, change: Any) -> list[dict[str, Any]]:
    out = []
    for e in history:
        if e["type"] == type_:
            e = change(dict(e))
            if e is None:
                continue
        out.append(e)
    return out


@pytest.mark.req("R-Q34-2", "R-Q-5")
def test_the_recorded_kill_history_passes() -> None:
    check = ck.provider_calls_recorded(recorded())
    assert check.ok is True, check.detail
    assert check.detail == "10 calls asked, 10 recorded, 1 terminal reads"


@pytest.mark.req("R-Q34-2", "R-Q-5")
def test_catches_calls_of_attempts_that_died_left_uncounted() -> None:
    """The old counting: only calls whose checkpoint committed (one attempt per step)."""
    h = recorded()
    first = {}
    for e in h:
        if e["type"] == "provider_call_record":
            first.setdefault(e["step"], e["attempt"])
    h = _edit(h, "provider_call_record", lambda e: e if first[e["step"]] != e["attempt"] else None)
    h = _edit(h, "client", lambda e: {**e, "usage": {**e["usage"], "provider_calls": 5}})
    check = ck.provider_calls_recorded(h)
    assert check.ok is False
    assert "asked 1 times, recorded 0" in check.detail


@pytest.mark.req("R-Q34-2", "R-Q-5")
def test_catches_a_call_recorded_after_it_was_made() -> None:
    h = _edit(recorded(), "provider_call_record", lambda e: {**e, "t": e["t"] + 0.2})
    check = ck.provider_calls_recorded(h)
    assert check.ok is False and "s after it was asked" in check.detail


@pytest.mark.req("R-Q34-2", "R-READ-1")
def test_catches_a_read_that_reports_fewer_calls_than_recorded() -> None:
    h = _edit(recorded(), "client", lambda e: {**e, "usage": {**e["usage"], "provider_calls": 5}})
    check = ck.provider_calls_recorded(h)
    assert check.ok is False and "read reports provider_calls 5, 10 recorded" in check.detail


@pytest.mark.req("R-Q34-2")
def test_a_record_without_an_outcome_may_lack_its_call_but_a_settled_one_may_not() -> None:
    h = recorded()
    last = next(e for e in reversed(h) if e["type"] == "provider_call_record")
    orphan = {**last, "id": 99, "attempt": 12, "t": last["t"] + 1, "status": "started", "ended_t": None,
              "input_tokens": None, "output_tokens": None}
    reads = [e for e in h if e["type"] == "client"]
    bumped = [{**e, "usage": {**e["usage"], "provider_calls": 11}} for e in reads]
    base = [e for e in h if e["type"] != "client"]
    assert ck.provider_calls_recorded([*base, orphan, *bumped]).ok is True
    settled = ck.provider_calls_recorded([*base, {**orphan, "status": "succeeded"}, *bumped])
    assert settled.ok is False and "recorded with an outcome 1 times, asked 0" in settled.detail


@pytest.mark.req("R-Q34-2")
def test_legacy_runs_are_not_checked() -> None:
    h = _edit(recorded(), "run", lambda e: {**e, "lifecycle_version": 1})
    h = [e for e in h if e["type"] != "provider_call_record"]
    assert ck.provider_calls_recorded(h).ok is True


@pytest.mark.req("R-Q34-2")
def test_reported_tokens_keep_only_counts() -> None:
    assert reported_tokens({"input_tokens": 7, "output_tokens": 3}) == (7, 3)
    assert reported_tokens({"input_tokens": -1, "output_tokens": True}) == (None, None)
    assert reported_tokens({}) == (None, None)


@pytest.mark.req("R-Q34-2", "R-READ-1")
def test_run_usage_adds_keys_and_counts_the_record_for_durable_runs() -> None:
    committed = {"provider_calls": 5, "input_tokens": 50, "output_tokens": 25, "tool_calls": 1}
    observed = {"provider_calls": 10, "provider_calls_no_outcome": 1, "input_tokens": 90,
                "output_tokens": 45, "wall_time_s": 38.1666, "wall_s": 36.5}
    assert run_usage(committed, observed, durable=True) == {
        "provider_calls": 10, "provider_calls_no_outcome": 1, "input_tokens": 90,
        "output_tokens": 45, "tool_calls": 1, "wall_time_s": 38.167, "wall_s": 36.5}
    legacy = run_usage(committed, {**observed, "wall_s": None}, durable=False)
    assert legacy == {**committed, "wall_time_s": 38.167}
    assert run_usage({}, observed, durable=True)["tool_calls"] == 0


@pytest.mark.req("R-Q34-2")
def test_tokens_no_provider_reported_are_unknown_not_zero() -> None:
    observed = {"provider_calls": 2, "input_tokens": 20, "output_tokens": None}
    usage = run_usage({"output_tokens": 0}, observed, durable=True)
    assert usage["output_tokens"] is None and usage["input_tokens"] == 20
    calls = [{"status": "succeeded", "input_tokens": 10, "output_tokens": None},
             {"status": "failed", "input_tokens": None, "output_tokens": None},
             {"status": "succeeded", "input_tokens": 10, "output_tokens": None}]
    assert ck.token_total(calls, "input_tokens") == 20   # a failed call reports nothing, adds nothing
    assert ck.token_total(calls, "output_tokens") is None
    assert ck.token_total([], "input_tokens") == 0


def test_a_count_the_provider_did_not_report_is_stored_as_nothing() -> None:
    from qimpl.workflows.activities import _merge_usage

    assert _merge_usage({"input_tokens": 10}, {"input_tokens": 5, "output_tokens": None}) == {"input_tokens": 15}
    with pytest.raises(ValueError):
        _merge_usage({}, {"input_tokens": -1})


@pytest.mark.req("R-Q34-2")
def test_a_read_reporting_zero_for_unreported_tokens_fails_the_usage_check() -> None:
    h = recorded()
    run = next(str(e["run_id"]) for e in h if e["type"] == "provider_call_record")
    for e in h:
        if e["type"] == "provider_call_record" and str(e["run_id"]) == run:
            e["output_tokens"] = None
    reads = [e for e in h if e["type"] == "client" and e.get("op") == "read" and str(e.get("run_id")) == run
             and isinstance(e.get("usage"), dict)]
    assert reads, "the recorded history reads its run"
    for e in reads:
        e["usage"] = {**e["usage"], "output_tokens": 0}
    check = ck.provider_calls_recorded(h)
    assert check.ok is False and "output_tokens 0" in check.detail, check.detail
    for e in reads:
        e["usage"] = {**e["usage"], "output_tokens": None}
    assert ck.provider_calls_recorded(h).ok is True


@pytest.mark.req("R-Q34-2")
def test_without_the_synthetic_record_only_the_reads_are_checked() -> None:
    h = [e for e in recorded() if e["type"] != "provider_call"]
    check = ck.provider_calls_recorded(h)
    assert check.ok is True and check.detail.startswith("no provider's own record")
    short = _edit(h, "client", lambda e: {**e, "usage": {**e["usage"], "provider_calls": 9}})
    assert ck.provider_calls_recorded(short).ok is False
