"""The provider seam (R-EXEC-1): one agent step at a time.

A provider is loaded by import path (``QIMPL_PROVIDER=module:factory``), exactly as a
third-party plugin would be; the factory is called with the ``QIMPL_PROVIDER_CONFIG``
mapping. A provider never runs tools itself: it asks for them (``StepResult.tool_calls``)
and sees their journaled results in the next step (``StepContext.tool_results``), so a
retry never repeats a side effect (R-TOOL-1/2, ``qimpl.tool_journal.seam``). The real implementation talks to a model; ``EchoProvider`` here is a
deterministic stand-in and the synthetic provider of the harness lives in
``qualify.fakes``.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qimpl.settings import ConfigError
from qimpl.tool_journal.seam import ToolCall

__all__ = ["EchoProvider", "Provider", "StepContext", "StepResult", "load_provider"]


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """What a step may see: the run's identity, its prompt(s), the checkpointed state, and
    the workspace the run reads with the principal's authorisation grant for it.

    ``grant_token`` is a credential: it is read by the worker from ``workspace_grants``
    (the run's principal and workspace, under the tenant's row-level security) at every
    attempt, is never stored in the run, its checkpoints, events or logs, and is left out
    of ``repr`` (R-READ-3). A provider must not put it into its ``StepResult``. ``None``:
    the grant was revoked since the run was accepted (or the legacy ``/v1/answer`` path,
    which has no run)."""

    run_id: str
    tenant_id: str
    generation: int
    attempt: int
    step: int
    prompt: str
    state: Mapping[str, Any]
    #: Inputs given by resumes, oldest first (R-RESUME-1).
    inputs: tuple[str, ...] = ()
    #: Approval decisions so far, oldest first: ``{approval_id, approved, tool, arguments,
    #: action_version}`` (R-APPROVAL-1).
    decisions: tuple[Mapping[str, Any], ...] = ()
    #: Settled tool calls so far, oldest first (R-TOOL-2): ``{call_id, id, tool, status,
    #: result}`` with ``status`` one of ``succeeded``, ``failed`` (``result.code`` says
    #: why), ``rejected`` (unknown tool or arguments off schema: nothing ran),
    #: ``denied`` (its approval was denied: nothing ran), ``not_executed`` and
    #: ``compensated`` (recorded by an operator). ``id`` is the provider's own id.
    tool_results: tuple[Mapping[str, Any], ...] = ()
    #: The tools the runtime can run, by name: ``{name, description, parameters}`` (the
    #: arguments' JSON Schema), from the worker's registry (``ToolRegistry.describe``).
    tools: tuple[Mapping[str, Any], ...] = ()
    #: The run's workspace (the request's ``workspace_id``, default ``"default"``, R-AUTH-2).
    workspace_id: str = "default"
    #: The principal's live authorisation grant for ``workspace_id`` (never projected, R-READ-3).
    grant_token: str | None = field(default=None, repr=False)
    #: Where a provider that streams its output hands each piece as it arrives (R-EVENT-1):
    #: ``await ctx.emit(text)`` appends an ``output`` delta event to the run's journal.
    #: Optional for a provider; None when nobody listens (the legacy path). Raises
    #: LostOwnership when the attempt no longer owns the run: let it propagate.
    emit: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """``state`` is checkpointed; ``answer`` set means the run is complete after this step;
    ``pending`` set parks the run for a human (R-READ-2): ``{"kind": "input", ...}`` for
    ``awaiting_input`` or ``{"kind": "approval", "approval_id", "action_version", "tool",
    "arguments"}`` for ``awaiting_approval``. ``tool_calls`` asks the runtime to run tools
    (R-TOOL-1): it runs them after this step's checkpoint and the next step sees their
    results in ``StepContext.tool_results``; a step with tool calls has no answer and
    nothing pending."""

    state: Mapping[str, Any]
    answer: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    pending: Mapping[str, Any] | None = None
    tool_calls: tuple[ToolCall, ...] = ()


class Provider(ABC):
    @abstractmethod
    async def step(self, ctx: StepContext) -> StepResult:
        """Run one step. Raise to fail the attempt (it is retried from the last checkpoint)."""


class EchoProvider(Provider):
    """Answers in ``steps`` steps (config ``{"steps": int}``, default 1) by echoing the prompt."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.steps = int((config or {}).get("steps", 1))

    async def step(self, ctx: StepContext) -> StepResult:
        notes = [*ctx.state.get("notes", []), f"step {ctx.step}"]
        done = ctx.step >= self.steps
        return StepResult(
            state={"notes": notes},
            answer=f"echo: {ctx.prompt}" if done else None,
            usage={"provider_calls": 1, "input_tokens": len(ctx.prompt.split()), "output_tokens": 2},
        )


def load_provider(path: str, config: Mapping[str, Any]) -> Provider:
    """Instantiate ``module:attribute`` with ``config``. Raises ValueError with a message
    fit for an operator (no traceback, no config value) when the path is malformed, the
    module or attribute does not exist, the factory raises, or it returns no Provider;
    the API and the worker turn it into exit code 64 at start."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"must be 'module:factory', got {path!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise ValueError(f"{path!r}: cannot import module {exc.name or module_name!r}") from None
    except AttributeError:
        raise ValueError(f"{path!r}: module {module_name!r} has no {attr!r}") from None
    try:
        provider = factory(config)
    except ConfigError as exc:  # names the variable and why, never its value
        raise ValueError(f"{path!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - reported by type: a message may echo the config
        raise ValueError(f"{path!r}: the factory raised {type(exc).__name__} "
                         "(check QIMPL_PROVIDER_CONFIG)") from None
    if not isinstance(provider, Provider):
        raise ValueError(f"{path!r} did not produce a Provider")
    return provider
