"""The harness tools (R-TOOL-1..5), loaded into the real worker by configuration::

    QIMPL_TOOLS=qualify.fakes.tools:sink_tools
    QIMPL_TOOLS_CONFIG={"sink_url": "http://127.0.0.1:P"}

Each tool with an effect calls the side-effect sink (``qualify.fakes.sink``), which
records every request and every execution, so the harness can count what really
happened in the owning system:

- ``charge`` (instrumented, ``{"amount": int >= 1}``): ``POST /calls/{call_id}``, the
  journal's call id being the idempotency key; a 422 is ``ToolFailed("refused")``.
- ``send_email`` (instrumented, needs an approval) and ``merge_pull_request``
  (instrumented, finalising): ``POST /calls/{call_id}``.
- ``shell`` (uninstrumented): ``POST /actions/{call_id}``, which the sink does not
  deduplicate.
- ``lookup_customer`` (developer-hosted): run by the API client, never by the worker.

Any argument object may carry the sink's fault controls ``sink_hold_s`` (the effect
happens, the reply is held past the tool's timeout) and ``sink_refuse`` (a 422, nothing
happens). A transport error or a timeout propagates: the runtime treats it as an unknown
outcome (R-TOOL-3).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from qimpl.tool_journal.seam import Invoke, ToolContext, ToolFailed, ToolKind, ToolSpec
from qualify import http

__all__ = ["TIMEOUT_S", "sink_tools"]

#: A tool's bound (seconds): well above a local request, well below a scenario's patience.
TIMEOUT_S = 1.0

_CONTROLS: dict[str, Any] = {
    "sink_hold_s": {"type": "number", "minimum": 0},
    "sink_refuse": {"type": "boolean"},
}


def _invoker(base_url: str, route: str, tool: str, timeout_s: float) -> Invoke:
    async def invoke(ctx: ToolContext, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        body = {"run_id": ctx.run_id, "tool": tool, "arguments": dict(arguments),
                "attempt": ctx.attempt, "pid": os.getpid()}
        async with http.async_client(base_url=base_url, timeout=timeout_s) as client:
            resp = await client.post(f"/{route}/{ctx.call_id}", json=body)
        if resp.status_code == 422:
            raise ToolFailed(str(resp.json().get("code", "refused")))
        resp.raise_for_status()  # anything else: the outcome is unknown
        doc = resp.json()
        if not isinstance(doc, dict):
            raise ValueError(f"sink answered {doc!r}")
        return doc

    invoke.__name__ = f"invoke_{tool}"
    return invoke


def sink_tools(config: Mapping[str, Any]) -> list[ToolSpec]:
    """The harness tools calling the sink at ``config["sink_url"]``."""
    url = str(config["sink_url"]).rstrip("/")

    def effect(name: str, route: str = "calls") -> Invoke:
        return _invoker(url, route, name, TIMEOUT_S)

    return [
        ToolSpec(
            name="charge", kind=ToolKind.INSTRUMENTED, invoke=effect("charge"), timeout_s=TIMEOUT_S,
            arguments_schema={"type": "object",
                              "properties": {"amount": {"type": "integer", "minimum": 1}, **_CONTROLS},
                              "required": ["amount"]},
        ),
        ToolSpec(name="send_email", kind=ToolKind.INSTRUMENTED, invoke=effect("send_email"),
                 requires_approval=True, timeout_s=TIMEOUT_S),
        ToolSpec(name="merge_pull_request", kind=ToolKind.INSTRUMENTED,
                 invoke=effect("merge_pull_request"), finalising=True, timeout_s=TIMEOUT_S),
        ToolSpec(name="shell", kind=ToolKind.UNINSTRUMENTED, invoke=effect("shell", "actions"),
                 timeout_s=TIMEOUT_S),
        ToolSpec(
            name="lookup_customer", kind=ToolKind.DEVELOPER_HOSTED,
            arguments_schema={"type": "object", "properties": {"customer": {"type": "string"}},
                              "required": ["customer"]},
            result_schema={"type": "object",
                           "properties": {"name": {"type": "string"},
                                          "tier": {"enum": ["free", "pro"]}},
                           "required": ["name", "tier"], "additionalProperties": False},
        ),
    ]
