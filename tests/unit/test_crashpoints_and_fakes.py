from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from qimpl.crashpoints import CrashPoint, parse_directive
from qimpl.provider import StepContext
from qimpl.tool_journal.seam import ToolCall
from qualify.fakes.synthetic import Script, SyntheticProvider, make_prompt


@pytest.mark.req("R-Q-4")
def test_parse_directive() -> None:
    d = parse_directive("a.b:kill, c:hold@3")
    assert d["a.b"].action == "kill" and d["a.b"].nth == 1
    assert d["c"].action == "hold" and d["c"].nth == 3
    assert parse_directive("") == {}
    with pytest.raises(ValueError):
        parse_directive("a:explode")
    with pytest.raises(ValueError):
        parse_directive("a:kill@0")


@pytest.mark.req("R-Q-4")
def test_unarmed_crash_point_is_inert() -> None:
    point = CrashPoint("unit.test", "doc")
    point.reach(x=1)
    assert point.reached == 1


def test_stream_keys_are_redacted_from_check_details() -> None:
    from qualify.scenarios.base import redact

    text = '{"run_id": "r", "stream_key": "9FqacdIMu9lJON6ZrXxO3mYiC1GFBpJA"}'
    assert "9Fqac" not in redact(text) and '"stream_key": "<redacted>"' in redact(text)


@pytest.mark.req("R-Q-3")
def test_script_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError):
        make_prompt(stepz=3)
    s = Script.from_prompt(make_prompt(steps=2, fail={"steps": [2], "attempts": [1]}))
    assert s.fails(2, 1) and not s.fails(2, 2) and not s.fails(1, 1)
    assert Script.from_prompt("plain text").steps == 3


@pytest.mark.req("R-Q-3")
def test_synthetic_provider_records_every_call(tmp_path: Path) -> None:
    p = SyntheticProvider({"control_dir": str(tmp_path)})
    prompt = make_prompt(steps=2, answer="A")

    def ctx(step: int, state: dict) -> StepContext:  # type: ignore[type-arg]
        return StepContext(run_id="r", tenant_id="t", generation=1, attempt=1, step=step,
                           prompt=prompt, state=state)

    r1 = asyncio.run(p.step(ctx(1, {})))
    r2 = asyncio.run(p.step(ctx(2, dict(r1.state))))
    assert r1.answer is None and r2.answer == "A" and r2.state == {"trail": [1, 2]}
    assert len((tmp_path / "provider_calls.jsonl").read_text().splitlines()) == 2


def _ctx(prompt: str, step: int, state: dict, **more: Any) -> StepContext:  # type: ignore[type-arg]
    return StepContext(run_id="r", tenant_id="t", generation=1, attempt=1, step=step,
                       prompt=prompt, state=state, **more)


@pytest.mark.req("R-Q-3")
def test_script_tools_are_checked() -> None:
    make_prompt(steps=3, tools={"2": [{"tool": "charge", "arguments": {"amount": 1}}]})
    bad: object
    for bad in ({"3": [{"tool": "charge"}]}, {"0": [{"tool": "charge"}]}, {"1": []},
                {"1": [{"tool": "charge", "args": {}}]}, {"1": [{"arguments": {}}]}, ["charge"]):
        with pytest.raises(ValueError):
            make_prompt(steps=3, tools=bad)


@pytest.mark.req("R-TOOL-1")
def test_synthetic_provider_asks_for_tool_calls_at_its_step(tmp_path: Path) -> None:
    p = SyntheticProvider({"control_dir": str(tmp_path)})
    calls = [{"tool": "charge", "arguments": {"amount": 5}}, {"tool": "shell"}]
    prompt = make_prompt(steps=3, answer="A", tools={"2": calls})
    r1 = asyncio.run(p.step(_ctx(prompt, 1, {})))
    r2 = asyncio.run(p.step(_ctx(prompt, 2, dict(r1.state))))
    assert r1.tool_calls == () and r2.answer is None and r2.pending is None
    assert r2.tool_calls == (ToolCall(tool="charge", arguments={"amount": 5}, id="p2-0"),
                             ToolCall(tool="shell", arguments={}, id="p2-1"))
    # a pure function of the step: the same calls in a later attempt or generation
    again = asyncio.run(p.step(StepContext(run_id="r", tenant_id="t", generation=2, attempt=3, step=2,
                                           prompt=prompt, state=dict(r1.state))))
    assert again.tool_calls == r2.tool_calls
    fed = ({"call_id": "tc-1", "id": "p2-0", "tool": "charge", "status": "succeeded", "result": {}},
           {"call_id": "tc-2", "id": "p2-1", "tool": "shell", "status": "failed", "result": {"code": "x"}})
    r3 = asyncio.run(p.step(_ctx(prompt, 3, dict(r2.state), tool_results=fed)))
    assert r3.answer == "A [charge:succeeded shell:failed]" and r3.tool_calls == ()
    recorded = [json.loads(line) for line in (tmp_path / "provider_calls.jsonl").read_text().splitlines()]
    assert [c["tool_results"] for c in recorded] == [0, 0, 0, 2]


@pytest.mark.req("R-APPROVAL-1")
def test_synthetic_provider_asks_for_the_approved_call_then_answers(tmp_path: Path) -> None:
    p = SyntheticProvider({"control_dir": str(tmp_path)})
    prompt = make_prompt(steps=3, answer="A", park={"step": 1, "kind": "approval"})
    parked = asyncio.run(p.step(_ctx(prompt, 1, {})))
    assert parked.pending and parked.pending["tool"] == "send_email"
    decision = {"approval_id": "ap-1", "approved": True, "tool": "send_email",
                "arguments": parked.pending["arguments"], "action_version": 1}

    def step(n: int, **more: Any) -> Any:
        return asyncio.run(p.step(StepContext(run_id="r", tenant_id="t", generation=2, attempt=1,
                                              step=n, prompt=prompt, state={},
                                              decisions=(decision,), **more)))

    ask = step(2)
    assert ask.answer is None and ask.tool_calls == (
        ToolCall(tool="send_email", arguments=decision["arguments"], id="approved-ap-1"),)
    result = {"call_id": "tc-1", "id": "approved-ap-1", "tool": "send_email", "status": "succeeded",
              "result": {"receipt": "tc-1"}}
    done = step(3, tool_results=(result,))
    assert done.answer == "A (tool ran: send_email)" and "tool_calls" not in done.usage  # the runtime counts
    failed = step(3, tool_results=({**result, "status": "failed"},))
    assert failed.answer == "A (tool failed: send_email)"
    assert not (tmp_path / "side_effects.jsonl").exists()
    denied = asyncio.run(p.step(StepContext(run_id="r", tenant_id="t", generation=2, attempt=1, step=2,
                                            prompt=prompt, state={},
                                            decisions=({**decision, "approved": False},))))
    assert denied.pending and denied.pending["arguments"]["revision"] == 1 and not denied.tool_calls


@pytest.mark.req("R-Q-4")
def test_a_hold_suspends_only_its_coroutine_and_a_freeze_the_whole_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hold`` leaves the event loop running (heartbeats and lease touches go on); ``freeze``
    stalls it. Measured by a ticker task while the point waits for its release."""
    import qimpl.crashpoints as cp

    async def ticks_while_held(action: str) -> int:
        monkeypatch.setenv("QIMPL_CONTROL_DIR", str(tmp_path))
        monkeypatch.setattr(cp, "_directives", cp.parse_directive(f"t.{action}:{action}"))
        point = cp.CrashPoint(f"t.{action}", "test")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        async def release_later() -> None:
            await asyncio.sleep(0.2)
            (tmp_path / f"crash.t.{action}.release").touch()

        loop = asyncio.get_running_loop()
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        releaser = None
        if action == "freeze":  # nothing on this loop can release it: a thread does
            loop.call_soon(lambda: __import__("threading").Timer(
                0.2, (tmp_path / f"crash.t.{action}.release").touch).start())
            await asyncio.sleep(0)
        else:
            releaser = asyncio.create_task(release_later())
        await point.areach(run_id="r")
        tick.cancel()
        if releaser is not None:
            await releaser
        return ticks - before

    assert asyncio.run(ticks_while_held("hold")) >= 5
    assert asyncio.run(ticks_while_held("freeze")) <= 2


@pytest.mark.req("R-Q-4", "R-Q-10")
def test_an_armed_point_strikes_once_only_for_the_context_the_harness_armed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``?armed``: inert without the arm file; with it, a reach of another run or step does
    not strike, the matching reach does and claims the file, and no later reach (here or in
    another process given the same directive) strikes again."""
    import qimpl.crashpoints as cp

    d = cp.parse_directive("p.x:stop?armed")
    assert d["p.x"].armed and d["p.x"].action == "stop"
    assert not cp.parse_directive("p.x:stop")["p.x"].armed
    for bad in ("p.x:stop?sometimes", "p.x:stop@2?armed"):
        with pytest.raises(ValueError):
            cp.parse_directive(bad)
    monkeypatch.setenv("QIMPL_CONTROL_DIR", str(tmp_path))
    # ``hold`` instead of ``stop`` so the test process is not stopped: the same gate decides.
    monkeypatch.setattr(cp, "_directives", cp.parse_directive("t.armed:hold?armed"))
    point = cp.CrashPoint("t.armed", "test")
    evidence = tmp_path / "crash_points.jsonl"
    assert point._strike({"run_id": "r1", "step": 2}) == (None, False)  # not armed yet
    cp.arm_path(tmp_path, "t.armed").write_text(json.dumps({"run_id": "r1", "step": 2}))
    assert point._strike({"run_id": "r2", "step": 2}) == (None, False)  # another run
    assert point._strike({"run_id": "r1", "step": 1}) == (None, False)  # another step
    assert not evidence.exists()
    release, freeze = point._strike({"run_id": "r1", "step": 2, "attempt": 3})
    lines = [json.loads(line) for line in evidence.read_text().splitlines()]
    assert [ln["context"] for ln in lines] == [{"run_id": "r1", "step": "2", "attempt": "3"}]
    # The hold waits for this arming's own release file, which the evidence names.
    assert release == Path(lines[0]["release"]) and release.parent == tmp_path and not freeze
    assert not cp.arm_path(tmp_path, "t.armed").exists()  # claimed: strikes once
    assert point._strike({"run_id": "r1", "step": 2}) == (None, False)
    release.touch()
    cp.arm_path(tmp_path, "t.armed").write_text(json.dumps({"run_id": "r1"}))  # armed again
    again, _ = point._strike({"run_id": "r1", "step": 3})
    assert again is not None and again != release and not again.exists()  # not released by the first
    cp.arm_path(tmp_path, "t.armed").unlink(missing_ok=True)
