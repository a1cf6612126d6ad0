"""The synthetic provider (R-Q-3), loaded into the real worker by configuration:

    QIMPL_PROVIDER=qualify.fakes.synthetic:SyntheticProvider
    QIMPL_PROVIDER_CONFIG={"control_dir": "/path"}

The run's prompt is its script, a JSON object (a plain-text prompt means the default)::

    {"steps": 5, "answer": "42", "delay_ms": 0,
     "barrier": {"step": 3, "name": "b1"},       # hold at the start of step 3, once (poll_ms: 10)
     "fail": "always" | {"steps": [2], "attempts": [1], "error": "timeout",
              "error_at": {"3": "unreachable"}},  # another error at attempt 3
     "answer_bytes": 3000000,                    # an answer of that many bytes
     "usage": {"input_tokens": -1},              # merged into every step's usage
     "state": {"x": NaN},                        # merged into every step's state
     "park": {"step": 2, "kind": "approval"},    # park at step 2 of generation 1
     "tools": {"2": [{"tool": "charge", "arguments": {"amount": 5}}]},
     "deltas": 4,                                # stream 4 output pieces per step
     "churn": true}                              # the state also sets and drops keys

``tools`` maps a step (< ``steps``) to the tool calls that step asks for (R-TOOL-1): at that
step, in every generation and attempt (a pure function of the step), the step returns
``StepResult(tool_calls=(ToolCall(tool, arguments, id="p<step>-<i>"), ...))`` and no
answer; the runtime runs them through its journal and the next step sees their results
in ``ctx.tool_results``. The final answer then ends with a digest of what the provider was
fed, e.g. ``"synthetic answer [charge:succeeded]"``.

``park`` ``kind: "approval"`` asks for ``send_email``; after an approved decision the
provider asks for that call (``id="approved-<approval_id>"``, the runtime matches it to
the approval and journals it) and, once its result is fed back, answers
``"<answer> (tool ran: send_email)"`` (``(tool <status>: ...)`` if it did not succeed).
After a denial it re-plans and asks again, at most twice, then gives up; with
``"stubborn": true`` in ``park`` it asks for the denied call anyway (``id="denied-<approval_id>"``,
a model that ignores the denial: the runtime must journal it ``denied`` and never run it) and,
fed that call's result, answers ``"<answer> (tool denied: send_email)"``.

``fail.error`` ``"timeout"`` raises ``TimeoutError`` (a provider's own HTTP read
timeout, R-EXEC-12), ``"unreachable"`` ``ProviderFailed("provider_unreachable")`` (a
model server that is down), ``"rate_limited"`` ``ProviderFailed("provider_http_429")``
with ``fail.retry_after_s`` (its ``Retry-After``); the default raises
``SyntheticFailure``. ``fail.while_file: NAME`` fails every call while
``<control_dir>/NAME`` exists (an outage the harness starts and ends), whatever the step
and attempt.

Every call is recorded *before* anything else as one JSON line in
``<control_dir>/provider_calls.jsonl`` — the harness's independent count of what was
asked of the provider (with ``tool_results``, how many settled tool results it was fed,
``fed``, each one's call id, status and result digest (``qualify.digests``), ``state_sha256``,
the digest of the state it was handed, and ``workspace_id`` and ``grant_sha256``, the digest of the authorisation grant it was
given: never the grant itself).
The provider runs no tool itself: the side-effect sink (``qualify.fakes.sink``) is the
record of what the tools did. A call cancelled before it returned (the owner lost its lease,
R-EXEC-11, the deadline) is recorded in ``provider_call_ends.jsonl`` with ``"how": "cancelled"``,
and so is every other call's end (``"answered"``, ``"failed"``): a call still running past
its run's deadline is what ``deadline respected`` finds there (R-EXEC-8). At a barrier the worker writes ``barrier.<name>.reached`` (pid,
run, step, attempt) and holds, still heartbeating, until ``barrier.<name>.release``
appears or the process is struck. A barrier holds once: a later attempt passes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qimpl.errors import ProviderFailed
from qimpl.provider import Provider, StepContext, StepResult
from qimpl.tool_journal.seam import ToolCall
from qualify.digests import canonical_sha256
from qualify.fakes.clock import true_time

__all__ = ["ENDS_FILE", "Script", "SyntheticProvider", "delta_piece", "grant_digest", "make_prompt"]

#: Where each call's end is recorded (relative to the control directory): one JSON line
#: with ``how`` ``answered``, ``failed`` or ``cancelled`` (returned, raised, or cancelled
#: before it returned) and ``t``, the host's true time (epoch s).
ENDS_FILE = "provider_call_ends.jsonl"
BARRIER_POLL_S = 0.01
BARRIER_MAX_S = 600.0


class Script:
    """A parsed script; unknown keys are refused so a typo cannot make a vacuous test."""

    KEYS = frozenset({"steps", "answer", "barrier", "fail", "delay_ms", "park", "answer_bytes",
                      "usage", "state", "tools", "deltas", "churn"})

    def __init__(self, doc: Mapping[str, Any]) -> None:
        unknown = set(doc) - self.KEYS
        if unknown:
            raise ValueError(f"unknown script keys: {sorted(unknown)}")
        self.steps = int(doc.get("steps", 3))
        self.answer = str(doc.get("answer", "synthetic answer"))
        #: Extra usage and state of every step: values the runtime must refuse to store
        #: (a negative count, a NaN) are counted failures (R-EXEC-6).
        self.usage: Mapping[str, Any] = doc.get("usage") or {}
        self.state: Mapping[str, Any] = doc.get("state") or {}
        if doc.get("answer_bytes"):
            self.answer = "x" * int(doc["answer_bytes"])
        self.delay_ms = int(doc.get("delay_ms", 0))
        #: Stream this many output pieces per step (``s<step>a<attempt>.<i> ``) through
        #: ``ctx.emit`` before the step returns (R-EVENT-1), each after ``delay_ms / deltas``.
        self.deltas = int(doc.get("deltas", 0))
        #: Every step also replaces a counter (``n``) and adds or drops a key (``odd``, on odd
        #: steps only): a delta chain with ``set`` and ``unset``, not only ``append``.
        self.churn = bool(doc.get("churn", False))
        self.barrier: Mapping[str, Any] | None = doc.get("barrier")
        self.fail: Any = doc.get("fail")
        #: ``{"step": n, "kind": "input" | "approval"}``: park the run at step n of
        #: generation 1. After a resume the run goes on to the answer; after an approval
        #: decision it runs the tool (approved) or re-plans and asks again (denied).
        self.park: Mapping[str, Any] | None = doc.get("park")
        #: ``{step: [{"tool", "arguments"}, ...]}``: the tool calls asked at that step.
        self.tools: dict[int, tuple[ToolCall, ...]] = {}
        tools = doc.get("tools") or {}
        if not isinstance(tools, Mapping):
            raise ValueError("tools must map a step to its calls")
        for key, calls in tools.items():
            step = int(key)
            if not 1 <= step < self.steps:
                raise ValueError(f"tools at step {step}: must be in 1..{self.steps - 1}")
            if not isinstance(calls, list) or not calls:
                raise ValueError(f"tools at step {step}: a non-empty list of calls")
            for call in calls:
                if not isinstance(call, Mapping) or not isinstance(call.get("tool"), str) \
                        or set(call) - {"tool", "arguments"}:
                    raise ValueError(f"tools at step {step}: {call!r} is not {{tool, arguments}}")
            self.tools[step] = tuple(
                ToolCall(tool=c["tool"], arguments=dict(c.get("arguments") or {}), id=f"p{step}-{i}")
                for i, c in enumerate(calls))

    @classmethod
    def from_prompt(cls, prompt: str) -> Script:
        try:
            doc = json.loads(prompt)
        except ValueError:
            return cls({})
        return cls(doc if isinstance(doc, dict) else {})

    def error(self, attempt: int = 1) -> Exception:
        """The exception a scripted failure raises at ``attempt`` (``fail.error_at``, by
        attempt, overrides ``fail.error``)."""
        kind = None
        if isinstance(self.fail, Mapping):
            kind = (self.fail.get("error_at") or {}).get(str(attempt), self.fail.get("error"))
        if kind == "timeout":
            return TimeoutError("synthetic provider read timeout")
        if kind == "unreachable":
            return ProviderFailed("provider_unreachable")
        if kind == "rate_limited":
            wait = self.fail.get("retry_after_s")
            return ProviderFailed("provider_http_429", retry_after_s=float(wait) if wait is not None else None)
        return SyntheticFailure("scripted failure")

    def fails(self, step: int, attempt: int, control: Path | None = None) -> bool:
        if self.fail == "always":
            return True
        if isinstance(self.fail, Mapping) and self.fail.get("while_file"):
            return control is not None and (control / str(self.fail["while_file"])).exists()
        if isinstance(self.fail, Mapping):
            steps = self.fail.get("steps")
            attempts = self.fail.get("attempts")
            return (steps is None or step in steps) and (attempts is None or attempt in attempts)
        return False


def delta_piece(step: int, attempt: int, i: int) -> str:
    """The ``i``-th output piece the synthetic provider streams at ``step`` of ``attempt``."""
    return f"s{step}a{attempt}.{i} "


def make_prompt(**script: Any) -> str:
    """The prompt that carries ``script`` (validated)."""
    Script(script)
    return json.dumps(script, sort_keys=True)


def grant_digest(grant: str | None) -> str | None:
    """What the provider records of the grant it was given: its SHA-256 (hex), never the
    grant itself (R-READ-3: the record is a report file)."""
    return hashlib.sha256(grant.encode()).hexdigest() if grant is not None else None


class SyntheticFailure(RuntimeError):
    pass


def _digest(results: Sequence[Mapping[str, Any]]) -> str:
    """`` [charge:succeeded shell:failed]`` of the tool results fed so far ('' for none)."""
    if not results:
        return ""
    return " [" + " ".join(f"{r.get('tool')}:{r.get('status')}" for r in results) + "]"


class SyntheticProvider(Provider):
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.control = Path(config["control_dir"])

    def _record(self, ctx: StepContext) -> None:
        line = json.dumps({"run_id": ctx.run_id, "step": ctx.step, "attempt": ctx.attempt,
                           "generation": ctx.generation, "tool_results": len(ctx.tool_results),
                           "fed": [{"call_id": r.get("call_id"), "status": r.get("status"),
                                    "result_sha256": canonical_sha256(r.get("result"))}
                                   for r in ctx.tool_results],
                           "workspace_id": ctx.workspace_id, "grant_sha256": grant_digest(ctx.grant_token),
                           "trail_seen": ctx.state.get("trail", []),
                           "state_sha256": canonical_sha256(ctx.state),
                           "pid": os.getpid(), "t": true_time()})
        with open(self.control / "provider_calls.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    async def _barrier(self, name: str, ctx: StepContext, poll_s: float = BARRIER_POLL_S) -> None:
        reached = self.control / f"barrier.{name}.reached"
        if reached.exists():
            return  # holds once
        # ``t`` on the host's clock like every record; ``wall_t`` this process's own (skewed
        # in a skew-worker-clock schedule: the nemesis reads the offset from it).
        doc = {"pid": os.getpid(), "run_id": ctx.run_id, "step": ctx.step, "attempt": ctx.attempt,
               "t": true_time(), "wall_t": time.time()}
        tmp = reached.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.rename(reached)
        release = self.control / f"barrier.{name}.release"
        deadline = time.monotonic() + BARRIER_MAX_S
        while not release.exists() and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)

    def _record_end(self, ctx: StepContext, how: str) -> None:
        line = json.dumps({"run_id": ctx.run_id, "step": ctx.step, "attempt": ctx.attempt,
                           "how": how, "pid": os.getpid(), "t": true_time()})
        with open(self.control / ENDS_FILE, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    async def step(self, ctx: StepContext) -> StepResult:
        self._record(ctx)
        how = "failed"
        try:
            result = await self._step(ctx, Script.from_prompt(ctx.prompt))
            how = "answered"
            return result
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        finally:
            self._record_end(ctx, how)

    async def _step(self, ctx: StepContext, script: Script) -> StepResult:
        if script.barrier and int(script.barrier["step"]) == ctx.step:
            # ``poll_ms``: how often the barrier looks for its release (10 ms unless given):
            # hundreds of runs held at barriers at once poll less, or the polling alone
            # starves the worker's event loop (model-bound scenarios).
            await self._barrier(str(script.barrier["name"]), ctx,
                                float(script.barrier.get("poll_ms", BARRIER_POLL_S * 1000)) / 1000)
        if script.deltas and ctx.emit is not None:
            for i in range(script.deltas):
                await asyncio.sleep(script.delay_ms / 1000 / script.deltas)
                await ctx.emit(delta_piece(ctx.step, ctx.attempt, i))
        elif script.delay_ms:
            await asyncio.sleep(script.delay_ms / 1000)
        if script.fails(ctx.step, ctx.attempt, self.control):
            raise script.error(ctx.attempt)
        trail = [*ctx.state.get("trail", []), ctx.step]
        usage = {"provider_calls": 1, "input_tokens": 10, "output_tokens": 5, **script.usage}
        if script.churn:
            churned = {"trail": trail, "n": ctx.step, **({"odd": ctx.step} if ctx.step % 2 else {})}
            return StepResult(state=churned, usage=usage,
                              answer=script.answer if ctx.step >= script.steps else None)
        if ctx.step in script.tools:
            return StepResult(state={"trail": trail, **script.state}, usage=usage,
                              tool_calls=script.tools[ctx.step])
        answer = script.answer + _digest(ctx.tool_results)
        if script.state:
            return StepResult(state={"trail": trail, **script.state}, usage=usage,
                              answer=answer if ctx.step >= script.steps else None)
        if script.park and int(script.park["step"]) == ctx.step and ctx.generation == 1:
            kind = str(script.park.get("kind", "input"))
            if kind == "approval":
                return StepResult(state={"trail": trail}, usage=usage,
                                  pending=self._approval_request(0))
            return StepResult(state={"trail": trail}, usage=usage, pending={"kind": kind})
        if ctx.decisions and script.park and script.park.get("kind") == "approval":
            return self._after_decision(ctx, script, trail, usage)
        done = ctx.step >= script.steps
        return StepResult(state={"trail": trail}, answer=answer if done else None, usage=usage)

    @staticmethod
    def _approval_request(revision: int) -> dict[str, Any]:
        """Revision 0 is the first plan; each denial re-plans with other arguments."""
        arguments: dict[str, Any] = {"to": "ops@example.invalid"}
        if revision:
            arguments["revision"] = revision
        return {"kind": "approval", "tool": "send_email", "arguments": arguments,
                "plan": f"plan-{revision}"}

    def _after_decision(self, ctx: StepContext, script: Script, trail: list[int],
                        usage: dict[str, int]) -> StepResult:
        """Approved: ask the runtime for the approved call (it matches the approval, runs
        the tool through its journal and the sink) and, once its result is fed back,
        answer. Denied: re-plan and ask again, at most twice; then give up."""
        last = ctx.decisions[-1]
        if last.get("approved"):
            tool = str(last.get("tool"))
            call = f"approved-{last.get('approval_id')}"
            result = next((r for r in ctx.tool_results if r.get("id") == call), None)
            if result is None:
                return StepResult(state={"trail": trail}, usage=usage, tool_calls=(
                    ToolCall(tool=tool, arguments=dict(last.get("arguments") or {}), id=call),))
            status = result.get("status")
            outcome = "ran" if status == "succeeded" else str(status)
            # The runtime counts the call it ran (usage ``tool_calls``), not the provider.
            return StepResult(state={"trail": trail}, usage=usage,
                              answer=f"{script.answer} (tool {outcome}: {tool})")
        if script.park and script.park.get("stubborn"):
            call = f"denied-{last.get('approval_id')}"
            result = next((r for r in ctx.tool_results if r.get("id") == call), None)
            if result is None:
                return StepResult(state={"trail": trail}, usage=usage, tool_calls=(
                    ToolCall(tool=str(last.get("tool")), arguments=dict(last.get("arguments") or {}), id=call),))
            return StepResult(state={"trail": trail}, usage=usage,
                              answer=f"{script.answer} (tool {result.get('status')}: {last.get('tool')})")
        denials = sum(1 for d in ctx.decisions if not d.get("approved"))
        if denials <= 2:
            return StepResult(state={"trail": trail}, usage=usage,
                              pending=self._approval_request(denials))
        return StepResult(state={"trail": trail}, usage=usage, answer="denied: nothing ran")
