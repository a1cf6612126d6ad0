"""The chat-completions protocol's pure half (R-PROV-1): the request a step sends and what
its streamed answer means. No I/O.

**The conversation is rebuilt from the step's context, never kept in memory**, so a
retried step (another attempt, another worker) sends exactly the same messages:

1. the system prompt (if configured), then the run's prompt as the first user message;
2. for each earlier assistant turn, in order — kept in the checkpointed state as
   ``state["turns"]``: ``{"inputs_seen": n, "message": {...}}`` — first the resume inputs
   that came before it, then the assistant message itself, then, for each tool call it
   made, a ``tool`` message with the journaled result of that call
   (``StepContext.tool_results``, matched by the turn's step and the call's position in
   it, R-TOOL-2: servers reuse call ids across turns, ``call_0`` in every one; a turn
   stored before turns carried their step is matched by the model's call id);
3. the inputs no turn has seen yet (a resume since the last turn).

A streamed answer is folded by ``Accumulator``: content deltas are concatenated, tool-call
deltas are merged by their ``index`` (id and name arrive first, arguments in pieces), the
final usage chunk gives the token counts. An answer is complete only when a choice says
how it finished (``finish_reason``): a stream that ends cleanly without one (a cut
connection the server closed politely, a proxy's timeout) is a counted failure,
``provider_truncated_stream``, never a short answer taken as whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qimpl.errors import ProviderFailed
from qimpl.provider import StepContext
from qimpl.tool_journal.seam import ToolCall

__all__ = ["Accumulator", "Turn", "conversation", "tool_definitions"]


def tool_definitions(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``StepContext.tools`` as chat-completions ``tools``: ``[{"type": "function",
    "function": {name, description, parameters}}]``, in the order given."""
    return [{"type": "function",
             "function": {"name": str(t["name"]), "description": str(t.get("description") or ""),
                          "parameters": dict(t.get("parameters") or {"type": "object"})}}
            for t in tools]


def _tool_message(call_id: str, result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``tool`` message answering ``call_id``: the journaled status and result as JSON
    (``no_result`` if the journal has none, so the protocol's pairing still holds)."""
    doc = ({"status": "no_result"} if result is None
           else {"status": result.get("status"), "result": result.get("result")})
    return {"role": "tool", "tool_call_id": call_id,
            "content": json.dumps(doc, sort_keys=True, separators=(",", ":"))}


def conversation(ctx: StepContext, *, system_prompt: str = "") -> list[dict[str, Any]]:
    """The messages of step ``ctx.step`` (see the module docstring): a pure function of
    ``ctx.prompt``, ``ctx.inputs``, ``ctx.tool_results`` and ``ctx.state``. ValueError when
    ``state["turns"]`` is not what this module wrote."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": ctx.prompt})
    results = {str(r["id"]): r for r in ctx.tool_results if r.get("id") is not None}
    by_slot = {(int(r["step"]), int(r["position"])): r for r in ctx.tool_results
               if r.get("step") is not None and r.get("position") is not None}
    seen = 0
    turns = ctx.state.get("turns", [])
    if not isinstance(turns, list):
        raise ValueError("state.turns is not a list")
    for turn in turns:
        if not isinstance(turn, Mapping) or not isinstance(turn.get("message"), Mapping):
            raise ValueError("a turn of state.turns is not {inputs_seen, message}")
        upto = int(turn.get("inputs_seen", 0))
        messages += [{"role": "user", "content": text} for text in ctx.inputs[seen:upto]]
        seen = max(seen, upto)
        message = dict(turn["message"])
        messages.append(message)
        asked_at = turn.get("step")
        for position, call in enumerate(message.get("tool_calls") or []):
            result = (by_slot.get((int(asked_at), position)) if asked_at is not None
                      else results.get(str(call["id"])))
            messages.append(_tool_message(str(call["id"]), result))
    messages += [{"role": "user", "content": text} for text in ctx.inputs[seen:]]
    return messages


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Turn:
    """One folded answer: ``text`` (all content deltas), ``tool_calls`` (parsed), the
    assistant ``message`` to keep in the state, and the token counts (None: not reported)."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    message: dict[str, Any]
    input_tokens: int | None
    output_tokens: int | None


@dataclass
class Accumulator:
    """Folds streamed ``chat.completion.chunk`` objects (as dicts, ``model_dump()``) of one
    step. ``add`` returns the content delta of the chunk ('' for none)."""

    step: int
    text: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    usage: Mapping[str, Any] | None = None
    #: The ``finish_reason`` of the answer once a choice gave one (None: not finished).
    finished: str | None = None

    def add(self, chunk: Mapping[str, Any]) -> str:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        delta_text = ""
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                self.finished = str(choice["finish_reason"])
            delta = choice.get("delta") or {}
            if delta.get("content"):
                delta_text += str(delta["content"])
            for part in delta.get("tool_calls") or []:
                call = self.calls.setdefault(int(part.get("index") or 0), _Call())
                call.id = part.get("id") or call.id
                function = part.get("function") or {}
                call.name += str(function.get("name") or "")
                call.arguments += str(function.get("arguments") or "")
        if delta_text:
            self.text.append(delta_text)
        return delta_text

    def turn(self) -> Turn:
        """The folded answer. ProviderFailed ``provider_truncated_stream`` when no choice
        said how the answer finished, ``provider_malformed_tool_call`` when a tool call
        has no name or its arguments are not a JSON object. A call without an id gets
        ``call-<step>-<index>`` (deterministic, so a retry matches its result)."""
        if self.finished is None:
            raise ProviderFailed("provider_truncated_stream")
        calls, wire = [], []
        for index in sorted(self.calls):
            call = self.calls[index]
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError:
                raise ProviderFailed("provider_malformed_tool_call") from None
            if not call.name or not isinstance(arguments, dict):
                raise ProviderFailed("provider_malformed_tool_call")
            call_id = call.id or f"call-{self.step}-{index}"
            calls.append(ToolCall(tool=call.name, arguments=arguments, id=call_id))
            wire.append({"id": call_id, "type": "function",
                         "function": {"name": call.name, "arguments": call.arguments or "{}"}})
        text = "".join(self.text)
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if wire:
            message["tool_calls"] = wire
        usage = self.usage or {}
        return Turn(text=text, tool_calls=tuple(calls), message=message,
                    input_tokens=_count(usage.get("prompt_tokens")),
                    output_tokens=_count(usage.get("completion_tokens")))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
