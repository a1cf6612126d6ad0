"""The tool seam (R-TOOL-1..5): what a provider may ask to run, and how the runtime runs it.

A provider step returns tool calls (``StepResult.tool_calls``) instead of running tools
itself; the activity runs them through this registry and journals each one
(``qimpl.tool_journal.steps``), so a retried attempt reuses what is known and parks what
is not. Three kinds:

- ``instrumented``: the runtime commits an intent before calling the tool and an outcome
  after it; the tool receives the journal's ``call_id`` as its idempotency key toward
  the owning system (so an operator can look the call up there).
- ``uninstrumented``: an action the runtime cannot make idempotent (a shell command, a
  legacy API); journaled the same way, but any error during it is an unknown outcome,
  since a partial effect cannot be ruled out.
- ``developer_hosted``: run by the API client, not the worker; the run parks in
  ``awaiting_input`` with ``pending_input.kind = "tool_result_required"`` (R-TOOL-4).

A tool marked ``finalising`` (merging a pull request, say) is never run in a durable run
without a matching approval (R-TOOL-5); ``requires_approval`` asks the same of any tool.

Tools are loaded by import path, like providers: ``QIMPL_TOOLS=module:factory`` with
``QIMPL_TOOLS_CONFIG`` (a JSON object); the factory returns an iterable of ``ToolSpec``.
Pure apart from ``load_tools`` (an import).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import jsonschema

__all__ = [
    "ToolCall",
    "ToolContext",
    "ToolFailed",
    "ToolKind",
    "ToolRegistry",
    "ToolSpec",
    "arguments_digest",
    "call_id",
    "load_tools",
    "schema_errors",
]

_NS = uuid.UUID("5b7c2a8e-1f0d-4c3b-9a6e-2d8f7e1c0b94")
_ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


class ToolKind(StrEnum):
    INSTRUMENTED = "instrumented"
    UNINSTRUMENTED = "uninstrumented"
    DEVELOPER_HOSTED = "developer_hosted"


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call a provider step asks for: ``tool`` by name, its JSON ``arguments`` and the
    provider's own id for it (a model's tool-call id), fed back with the result."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool invocation may see. ``call_id`` is the journal's identity of the call
    and the idempotency key toward the owning system (R-TOOL-1)."""

    call_id: str
    run_id: str
    tenant_id: str
    generation: int
    step: int
    attempt: int


class ToolFailed(Exception):
    """Raised by a tool that knows its effect did not happen (the owning system refused the
    request): the outcome is ``failed`` and the provider sees ``code``. Any other
    exception, a timeout included, leaves the outcome unknown (R-TOOL-3)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


Invoke = Callable[[ToolContext, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A registered tool. ``invoke`` is required except for developer-hosted tools;
    ``timeout_s`` (seconds) bounds one invocation (past it the outcome is unknown).
    ``result_schema`` validates developer-hosted results (422 on a mismatch).
    ``description`` tells a model what the tool does (R-PROV-1)."""

    name: str
    kind: ToolKind
    description: str = ""
    invoke: Invoke | None = None
    arguments_schema: Mapping[str, Any] = field(default_factory=lambda: dict(_ANY_OBJECT))
    result_schema: Mapping[str, Any] = field(default_factory=lambda: dict(_ANY_OBJECT))
    requires_approval: bool = False
    finalising: bool = False
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if (self.invoke is None) != (self.kind == ToolKind.DEVELOPER_HOSTED):
            raise ValueError(f"tool {self.name!r}: only developer-hosted tools have no invoke")
        jsonschema.Draft202012Validator.check_schema(self.arguments_schema)
        jsonschema.Draft202012Validator.check_schema(self.result_schema)

    @property
    def needs_approval(self) -> bool:
        """True when a durable run may call it only with a matching approval (R-TOOL-5)."""
        return self.requires_approval or self.finalising


class ToolRegistry:
    """The tools a worker may run, by name."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise ValueError(f"tool {spec.name!r} registered twice")
            self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def describe(self) -> tuple[dict[str, Any], ...]:
        """What a provider may ask for (``StepContext.tools``), by name:
        ``{name, description, parameters}`` with ``parameters`` the arguments' JSON Schema."""
        return tuple({"name": s.name, "description": s.description,
                      "parameters": dict(s.arguments_schema)}
                     for s in sorted(self._specs.values(), key=lambda s: s.name))


def schema_errors(schema: Mapping[str, Any], value: Any) -> list[dict[str, str]]:
    """Every way ``value`` breaks ``schema``: ``[{"field": "a.b", "code": "type"}, ...]``
    (``field`` is the JSON path inside the value, ``code`` the failed keyword); empty
    when it conforms."""
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        path = [str(p) for p in err.absolute_path]
        # ``required`` and ``additionalProperties`` fail on the object: name the property.
        named = re.findall(r"'([^']+)' (?:is a required property|was unexpected)", err.message)
        if err.validator == "additionalProperties" and not named:
            named = re.findall(r"'([^']+)'", err.message.partition("(")[2])
        for name in named or [None]:
            out.append({"field": ".".join(path + ([name] if name else [])) or "$",
                        "code": str(err.validator)})
    return out


def arguments_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of (tool, arguments): the journal's record of
    exactly what was asked (R-TOOL-1)."""
    doc = json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def call_id(run_id: str, step: int, position: int) -> str:
    """The journal identity of the ``position``-th call (from 0) asked at ``step`` of a run:
    deterministic, so a retried attempt that restores the step's checkpoint finds the same
    ids in the journal. Steps only go forward across generations, so ids never repeat."""
    return f"tc-{uuid.uuid5(_NS, f'{run_id}:{step}:{position}')}"


def load_tools(path: str, config: Mapping[str, Any]) -> ToolRegistry:
    """``module:factory`` called with ``config`` -> a registry; an empty ``path`` is no
    tools. ValueError on a bad path or a factory that returns something else."""
    if not path:
        return ToolRegistry()
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"tools must be 'module:factory', got {path!r}")
    specs = list(getattr(importlib.import_module(module_name), attr)(config))
    if not all(isinstance(s, ToolSpec) for s in specs):
        raise ValueError(f"{path} did not produce ToolSpecs")
    return ToolRegistry(specs)
