"""Identities of tool approvals (R-APPROVAL-1). Pure.

``action_version`` is a digest of exactly what would run — the tool, its arguments and the
plan it belongs to — so it changes whenever any of them changes, and a decision taken on
a stale version can be refused. ``approval_id`` names one request of one generation.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["action_version", "approval_id", "approval_request"]

_NS = uuid.UUID("0f0e6a52-3c1b-4a57-9d1e-6a1f4f3f2b10")


def action_version(tool: str, arguments: Mapping[str, Any], plan: Any = None) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of (tool, arguments, plan)."""
    doc = json.dumps({"tool": tool, "arguments": arguments, "plan": plan}, sort_keys=True,
                     separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def approval_id(run_id: str, generation: int, step: int) -> str:
    return f"ap-{uuid.uuid5(_NS, f'{run_id}:{generation}:{step}')}"


def approval_request(run_id: str, generation: int, step: int, pending: Mapping[str, Any]) -> dict[str, Any]:
    """The ``pending_approval`` projection of a provider's request: ``approval_id,
    action_version, tool, arguments`` (the plan stays inside the digest)."""
    tool = str(pending.get("tool", ""))
    arguments = dict(pending.get("arguments") or {})
    return {
        "kind": "approval",
        "approval_id": approval_id(run_id, generation, step),
        "action_version": action_version(tool, arguments, pending.get("plan")),
        "tool": tool,
        "arguments": arguments,
    }
