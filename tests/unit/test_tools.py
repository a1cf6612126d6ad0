"""The tool seam and the journal's pure rules (R-TOOL-1..5)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qimpl.api.events import event_of
from qimpl.tool_journal.rules import matching_decision, summary, tool_results
from qimpl.tool_journal.seam import (
    ToolKind,
    ToolRegistry,
    ToolSpec,
    arguments_digest,
    call_id,
    schema_errors,
)


async def _noop(ctx: Any, arguments: Any) -> dict[str, Any]:
    return {}


@pytest.mark.req("R-TOOL-2")
def test_call_ids_are_deterministic_and_distinct() -> None:
    assert call_id("r", 3, 0) == call_id("r", 3, 0)
    assert len({call_id("r", s, p) for s in range(1, 4) for p in range(3)} | {call_id("q", 1, 0)}) == 10


@pytest.mark.req("R-TOOL-1")
def test_arguments_digest_is_canonical() -> None:
    assert arguments_digest("t", {"a": 1, "b": 2}) == arguments_digest("t", {"b": 2, "a": 1})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("u", {"a": 1})


@pytest.mark.req("R-TOOL-4")
def test_schema_errors_name_each_field_and_keyword() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tier": {"enum": ["a"]}},
              "required": ["name"]}
    assert schema_errors(schema, {"name": "x", "tier": "a"}) == []
    assert schema_errors(schema, {"name": 1, "tier": "b"}) == [
        {"field": "name", "code": "type"}, {"field": "tier", "code": "enum"}]
    assert schema_errors(schema, {}) == [{"field": "name", "code": "required"}]
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert schema_errors(closed, {"a": 1, "zz": 2}) == [{"field": "zz", "code": "additionalProperties"}]


@pytest.mark.req("R-TOOL-4")
def test_specs_are_checked_when_registered() -> None:
    with pytest.raises(ValueError):
        ToolSpec(name="x", kind=ToolKind.INSTRUMENTED)  # no invoke
    with pytest.raises(ValueError):
        ToolSpec(name="x", kind=ToolKind.DEVELOPER_HOSTED, invoke=_noop)
    spec = ToolSpec(name="x", kind=ToolKind.INSTRUMENTED, invoke=_noop, finalising=True)
    assert spec.needs_approval
    with pytest.raises(ValueError):
        ToolRegistry([spec, spec])


@pytest.mark.req("R-TOOL-5")
def test_one_approval_runs_one_call_of_exactly_that_tool_and_arguments() -> None:
    decisions = [{"approval_id": "a1", "approved": True, "tool": "merge", "arguments": {"pr": 1}},
                 {"approval_id": "a2", "approved": False, "tool": "merge", "arguments": {"pr": 2}}]
    assert matching_decision(decisions, "merge", {"pr": 1}, used=[])["approval_id"] == "a1"
    assert matching_decision(decisions, "merge", {"pr": 1}, used=["a1"]) is None
    assert matching_decision(decisions, "merge", {"pr": 3}, used=[]) is None
    assert matching_decision(decisions, "other", {"pr": 1}, used=[]) is None
    assert matching_decision(decisions, "merge", {"pr": 2}, used=[])["approved"] is False


@pytest.mark.req("R-TOOL-5")
@pytest.mark.req("R-APPROVAL-1")
def test_an_approval_parked_for_a_call_serves_that_call_only() -> None:
    """Two identical calls (same tool, same arguments) of one run: the approval the journal
    parked the first for names its call and action version, and never serves the second
    (issue 22, item 5)."""
    given = {"approval_id": "a1", "approved": True, "tool": "merge", "arguments": {"pr": 1},
             "action_version": "v-1", "call_id": "c-1"}
    assert matching_decision([given], "merge", {"pr": 1}, [], call_id="c-1", version="v-1") == given
    assert matching_decision([given], "merge", {"pr": 1}, [], call_id="c-2", version="v-2") is None
    assert matching_decision([given], "merge", {"pr": 1}, [], call_id="c-1", version="v-stale") is None
    # Without a call (a provider-raised approval): tool and arguments, as before.
    raised = {k: v for k, v in given.items() if k != "call_id"}
    assert matching_decision([raised], "merge", {"pr": 1}, [], call_id="c-2", version="v-2") == raised


def _row(step: int, position: int, status: str, kind: str = "instrumented") -> dict[str, Any]:
    return {"call_id": f"c{step}{position}", "provider_call_id": None, "tool": "t", "kind": kind,
            "step": step, "position": position, "status": status, "result": {"n": step},
            "settled_by": "worker" if status not in ("intent", "requested") else None}


@pytest.mark.req("R-TOOL-2", "R-Q34-3")
def test_results_are_settled_calls_in_order_and_the_summary_shows_unknowns() -> None:
    rows = [_row(2, 0, "succeeded"), _row(1, 1, "failed"), _row(1, 0, "intent"),
            _row(3, 0, "requested", "developer_hosted")]
    assert [r["call_id"] for r in tool_results(rows)] == ["c11", "c20"]
    view = {v["call_id"]: v for v in summary(rows)}
    assert view["c10"]["outcome"] == "unknown" and view["c10"]["sent"] and not view["c10"]["settled"]
    assert view["c30"]["sent"] is False and view["c30"]["outcome"] == "requested"
    assert view["c20"]["settled_by"] == "worker"


@pytest.mark.req("R-TOOL-1", "R-EVENT-1")
def test_journal_rows_are_sse_events_with_the_runs_own_sequence_number() -> None:
    """The kinds come from the journal (its trigger classifies tool writes, tested in
    tests/integration/test_event_journal.py); the SSE event carries them unchanged."""
    row = {"seq": 7, "kind": "tool_result", "data": {"call_id": "c", "tool": "t", "status": "succeeded"}}
    event = event_of(row)
    assert event["id"] == "7" and event["event"] == "tool_result"
    assert json.loads(event["data"]) == row["data"]
