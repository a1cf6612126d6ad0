"""The tool journal's pure rules (R-TOOL-1..5): what a journal row means, which approval a
call may use, what the provider is fed and how a park is described. No I/O.

Statuses of ``tool_invocations.status``:

- ``intent``: committed before the side effect; with no outcome it is *unknown*: the
  call may or may not have happened (R-TOOL-3).
- ``requested``: a developer-hosted call waiting for the client's result (R-TOOL-4).
- ``succeeded`` / ``failed``: the worker's outcome; ``rejected`` (unknown tool, arguments
  off schema) and ``denied`` (approval denied): nothing ran.
- ``not_executed`` / ``compensated``: recorded by an operator's reconciliation (an
  operator may also record ``succeeded`` with the result seen in the owning system).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "OPERATOR_OUTCOMES",
    "SETTLED",
    "UNSETTLED",
    "matching_decision",
    "reconciliation_pending",
    "summary",
    "tool_results",
]

UNSETTLED = frozenset({"intent", "requested"})
SETTLED = frozenset({"succeeded", "failed", "rejected", "denied", "not_executed", "compensated"})
#: What an operator may record for an unknown outcome (R-TOOL-3).
OPERATOR_OUTCOMES = frozenset({"succeeded", "not_executed", "compensated"})


def tool_results(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The settled invocations as a provider sees them (``StepContext.tool_results``),
    in the order they were asked: ``{call_id, id, tool, status, result, step, position}``
    (``id`` is the model's own call id, which servers reuse across turns; ``step`` and
    ``position`` say which turn asked it)."""
    ordered = sorted(rows, key=lambda r: (int(r["step"]), int(r["position"])))
    return tuple({"call_id": r["call_id"], "id": r["provider_call_id"], "tool": r["tool"],
                  "status": r["status"], "result": r["result"], "step": int(r["step"]),
                  "position": int(r["position"])}
                 for r in ordered if r["status"] in SETTLED)


def matching_decision(decisions: Sequence[Mapping[str, Any]], tool: str,
                      arguments: Mapping[str, Any], used: Iterable[str], *,
                      call_id: str | None = None, version: str | None = None) -> Mapping[str, Any] | None:
    """The latest approval decision for this call that no journaled call has used yet (one
    approval runs one call, R-TOOL-5), or None. A decision given on a request the tool
    journal parked for a call (it names that ``call_id``) serves that call only, at the
    ``action_version`` it was decided on (R-APPROVAL-1): never an identical call elsewhere
    in the run. A decision without a call (a provider-raised approval, or one decided
    before decisions named their call) serves a call of exactly its tool and arguments."""
    taken = set(used)
    for decision in reversed(decisions):
        if decision.get("approval_id") in taken:
            continue
        if decision.get("call_id") is not None:
            if decision["call_id"] == call_id and decision.get("action_version") == version:
                return decision
        elif decision.get("tool") == tool and decision.get("arguments") == dict(arguments):
            return decision
    return None


def reconciliation_pending(call_ids: Sequence[str]) -> dict[str, Any]:
    """``pending_input`` of a run parked for unknown outcomes (R-TOOL-3)."""
    return {"kind": "reconciliation_required", "call_ids": list(call_ids)}


def summary(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run record's view of its journal (R-Q34-3): each call's id, tool, kind, step
    and ``sent`` (an intent was committed: the call may have reached the tool),
    ``settled`` and ``outcome`` (``unknown`` for an intent with no outcome)."""
    out = []
    for r in sorted(rows, key=lambda r: (int(r["step"]), int(r["position"]))):
        status = str(r["status"])
        out.append({
            "call_id": r["call_id"], "tool": r["tool"], "kind": r["kind"], "step": r["step"],
            "sent": r["kind"] != "developer_hosted" and status not in ("rejected", "denied"),
            "settled": status in SETTLED,
            "outcome": "unknown" if status == "intent" else status,
            "settled_by": (str(r["settled_by"]).split(":")[0] if r["settled_by"] else None),
        })
    return out
