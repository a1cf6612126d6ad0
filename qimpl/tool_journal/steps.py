"""Running one step's tool calls through the journal (R-TOOL-1..5, R-RESUME-3).

The provider asks for tool calls; the step's checkpoint stores them (the pre-tool
checkpoint) and the owner then runs them in order, each one:

1. already settled in the journal: reused, never run again (R-TOOL-2);
2. an ``intent`` with no outcome: *unknown* — the run parks in ``awaiting_input`` with
   ``error_message: "side_effect_outcome_unknown"`` and nothing more runs (R-TOOL-3);
3. unknown tool or arguments off its schema: journaled ``rejected``, nothing runs;
4. needs an approval (``finalising`` or ``requires_approval``, R-TOOL-5): without a
   matching decision the run parks in ``awaiting_approval``; a denial is journaled
   ``denied`` and nothing runs; an approval is used by exactly one call;
5. developer-hosted: journaled ``requested``; after the step's other calls the run parks
   with ``pending_input.kind = "tool_result_required"`` (R-TOOL-4);
6. otherwise: ``intent`` committed (fenced), the tool invoked with the call id as its
   idempotency key, bounded by the tool's timeout and the deadline, then the outcome
   committed (fenced). A reply that does not come (timeout, connection lost) or any error
   of an uninstrumented action (``ToolFailed`` included) leaves the outcome unknown: the
   run parks.

Every journal write is an owner write: a superseded attempt cannot commit an intent, so
it never reaches a tool (R-EXEC-7, R-EXEC-11). Crash points mark each commit boundary.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qimpl.approvals import approval_request
from qimpl.crashpoints import declare
from qimpl.db.owner import RunOwner
from qimpl.tool_journal import store as journal_db
from qimpl.tool_journal.rules import matching_decision, reconciliation_pending
from qimpl.tool_journal.seam import (
    ToolCall,
    ToolContext,
    ToolFailed,
    ToolKind,
    ToolRegistry,
    ToolSpec,
    arguments_digest,
    call_id,
    schema_errors,
)

__all__ = ["UNKNOWN_OUTCOME", "Park", "ToolSteps"]

log = logging.getLogger("qimpl.tools")

#: ``error_code`` and ``error_message`` of a run parked for an unknown outcome (R-TOOL-3).
UNKNOWN_OUTCOME = "side_effect_outcome_unknown"

BEFORE_INTENT = declare("tool.before_intent_commit",
                        "a step's tool calls are checkpointed, a call's intent not yet committed")
AFTER_INTENT = declare("tool.after_intent_commit",
                       "a call's intent is committed, its request not yet sent")
AFTER_REPLY = declare("tool.after_reply", "the tool replied, its outcome not yet committed")
AFTER_OUTCOME = declare("tool.after_outcome_commit",
                        "a call's outcome is committed, the next step not yet checkpointed")


@dataclass(frozen=True)
class Park:
    """Why the run parks after its tool calls: ``pending`` (``pending_input`` or an
    approval request) and, for an unknown outcome, its error code and message."""

    pending: dict[str, Any]
    error_code: str | None = None
    error_message: str | None = None


class ToolSteps:
    """The tool calls of one worker's activities, run through ``registry``."""

    def __init__(self, registry: ToolRegistry) -> None:
        self.registry = registry

    @staticmethod
    def plan(run_id: str, step: int, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
        """The journal form of a step's calls, stored in its checkpoint: ``[{call_id, id,
        tool, arguments}]`` with deterministic call ids. ValueError/TypeError when the
        provider's calls are not JSON (a counted failure, R-EXEC-6)."""
        out = []
        for position, call in enumerate(calls):
            arguments = json.loads(json.dumps(dict(call.arguments), allow_nan=False))
            out.append({"call_id": call_id(run_id, step, position), "id": call.id,
                        "tool": str(call.tool), "arguments": arguments})
        return out

    async def run(self, owner: RunOwner, *, tenant_id: str, step: int,
                  calls: Sequence[Mapping[str, Any]], decisions: Sequence[Mapping[str, Any]],
                  usage: dict[str, Any]) -> tuple[Park | None, dict[str, Any]]:
        """Run ``step``'s ``calls`` in order (see the module docstring); returns the park,
        if any, and the run's usage (``tool_calls`` counts invocations sent)."""
        rows = {r["call_id"]: r for r in await journal_db.invocations(owner.conn, owner.run_id)}
        used = {str(r["approval_id"]) for r in rows.values() if r["approval_id"]}
        requested: list[dict[str, Any]] = []
        for position, call in enumerate(calls):
            row = rows.get(call["call_id"])
            spec = self.registry.get(call["tool"])
            if row is not None:
                if row["status"] == "intent":
                    log.warning("tool call %s of run %s has no outcome: parking", call["call_id"],
                                owner.run_id, extra={"run_id": owner.run_id, "event": "tool.unknown"})
                    return _unknown(call["call_id"]), usage
                if row["status"] == "requested":
                    requested.append(_request(call, spec))
                continue
            invocation = {**call, "step": step, "position": position,
                          "kind": str(spec.kind) if spec else str(ToolKind.INSTRUMENTED),
                          "digest": arguments_digest(call["tool"], call["arguments"])}
            if spec is None:
                await owner.journal(invocation, status="rejected", result={"code": "unknown_tool"})
                continue
            errors = schema_errors(spec.arguments_schema, call["arguments"])
            if errors:
                await owner.journal(invocation, status="rejected",
                                    result={"code": "arguments_invalid", "errors": errors})
                continue
            if spec.needs_approval:
                request = {**approval_request(owner.run_id, owner.generation, step, {
                    "tool": spec.name, "arguments": call["arguments"], "plan": call["call_id"]}),
                    "call_id": call["call_id"]}
                decision = matching_decision(decisions, spec.name, call["arguments"], used,
                                             call_id=call["call_id"], version=request["action_version"])
                if decision is None:
                    return Park(request), usage
                invocation["approval_id"] = str(decision["approval_id"])
                used.add(invocation["approval_id"])
                if not decision.get("approved"):
                    await owner.journal(invocation, status="denied", result={"code": "approval_denied"})
                    continue
            if spec.kind == ToolKind.DEVELOPER_HOSTED:
                await owner.journal(invocation, status="requested")
                requested.append(_request(call, spec))
                continue
            await BEFORE_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)
            usage = {**usage, "tool_calls": int(usage.get("tool_calls", 0)) + 1}
            await owner.journal(invocation, status="intent", usage=usage)
            await AFTER_INTENT.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)
            await owner.before_call()  # paused since the intent? then the lease may be gone
            outcome = await self._invoke(owner, spec, invocation, tenant_id=tenant_id)
            if outcome is None:
                return _unknown(call["call_id"]), usage
            await AFTER_REPLY.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)
            await owner.tool_outcome(call["call_id"], status=outcome[0], result=outcome[1])
            await AFTER_OUTCOME.areach(run_id=owner.run_id, step=step, attempt=owner.attempt)
        if requested:
            return Park({"kind": "tool_result_required", "calls": requested}), usage
        return None, usage

    @staticmethod
    async def _invoke(owner: RunOwner, spec: ToolSpec, invocation: Mapping[str, Any], *,
                      tenant_id: str) -> tuple[str, dict[str, Any]] | None:
        """Invoke once, bounded by the tool's timeout and the deadline; ``(status, result)``
        or None when the outcome is unknown. A lost lease cancels this call like any other
        (the intent then stays unknown for the next attempt)."""
        assert spec.invoke is not None
        ctx = ToolContext(call_id=invocation["call_id"], run_id=owner.run_id, tenant_id=tenant_id,
                          generation=owner.generation, step=int(invocation["step"]),
                          attempt=owner.attempt)
        try:
            async with asyncio.timeout(max(0.0, min(spec.timeout_s, owner.seconds_left()))):
                result = await spec.invoke(ctx, invocation["arguments"])
        except ToolFailed as failed:
            if spec.kind == ToolKind.UNINSTRUMENTED:
                # An action the runtime cannot make idempotent may have half happened
                # whatever it says: only an operator can tell (R-TOOL-3).
                log.warning("uninstrumented action %s (call %s) failed: outcome unknown", spec.name,
                            ctx.call_id, extra={"run_id": owner.run_id, "event": "tool.no_outcome"})
                return None
            return "failed", {"code": failed.code}
        except Exception as exc:  # noqa: BLE001 - no definite answer: the outcome is unknown
            log.warning("tool %s (call %s) gave no outcome: %s", spec.name, ctx.call_id,
                        type(exc).__name__, extra={"run_id": owner.run_id, "event": "tool.no_outcome"})
            return None
        try:
            return "succeeded", json.loads(json.dumps(dict(result), allow_nan=False))
        except (TypeError, ValueError):
            return "succeeded", {"code": "result_not_json"}


def _unknown(call_id_: str) -> Park:
    return Park(reconciliation_pending([call_id_]), UNKNOWN_OUTCOME, UNKNOWN_OUTCOME)


def _request(call: Mapping[str, Any], spec: ToolSpec | None) -> dict[str, Any]:
    """One entry of ``pending_input.calls`` for a developer-hosted call (R-TOOL-4)."""
    return {"call_id": call["call_id"], "id": call.get("id"), "tool": call["tool"],
            "arguments": call["arguments"],
            "arguments_schema": dict(spec.arguments_schema) if spec else {},
            "result_schema": dict(spec.result_schema) if spec else {}}
