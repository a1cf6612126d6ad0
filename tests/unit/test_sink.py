"""The side-effect sink (a real subprocess) and the harness tools that call it (R-Q-5, R-TOOL-1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from qimpl.tool_journal.seam import (
    ToolContext,
    ToolFailed,
    ToolKind,
    ToolSpec,
    load_tools,
    schema_errors,
)
from qualify.fakes.tools import TIMEOUT_S
from qualify.processes import SinkProcess


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SinkProcess]:
    proc = SinkProcess(tmp_path / "sink", log_path=tmp_path / "logs" / "sink.log")
    try:
        yield proc.start()
    finally:
        proc.stop()
    assert proc.proc is not None and proc.proc.returncode is not None  # reaped


def lines(sink: SinkProcess, name: str) -> list[dict[str, Any]]:
    path = sink.dir / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def post(sink: SinkProcess, route: str, call_id: str, timeout: float = 5.0, **arguments: Any) -> httpx.Response:
    body = {"run_id": "run-1", "tool": "charge", "arguments": arguments, "attempt": 1, "pid": 1}
    return httpx.post(f"{sink.url}/{route}/{call_id}", json=body, timeout=timeout)


def call(spec: ToolSpec | None, context: ToolContext, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    """Run one tool invocation to its end, as the worker would."""
    assert spec is not None and spec.invoke is not None
    invoke = spec.invoke

    async def once() -> Mapping[str, Any]:
        return await invoke(context, arguments)

    return asyncio.run(once())


def ctx(call_id: str, attempt: int = 1) -> ToolContext:
    return ToolContext(call_id=call_id, run_id="run-1", tenant_id="t", generation=1, step=1,
                       attempt=attempt)


@pytest.mark.req("R-Q-5")
def test_ready_and_healthy(sink: SinkProcess) -> None:
    assert json.loads((sink.dir / "sink.ready").read_text())["port"] == sink.port
    assert httpx.get(f"{sink.url}/healthz", timeout=5).status_code == 200
    assert post(sink, "nowhere", "x").status_code == 404


@pytest.mark.req("R-Q-5")
def test_instrumented_calls_are_idempotent_per_call_id_and_every_request_is_recorded(
        sink: SinkProcess) -> None:
    first, again, other = post(sink, "calls", "tc-a"), post(sink, "calls", "tc-a"), post(sink, "calls", "tc-b")
    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json() == {"receipt": "tc-a", "executed": True}
    assert again.json() == {"receipt": "tc-a", "executed": False}
    assert [(e["call_id"], e["kind"]) for e in lines(sink, "executions.jsonl")] == [
        ("tc-a", "instrumented"), ("tc-b", "instrumented")]
    requests = lines(sink, "requests.jsonl")
    assert [(e["call_id"], e["repeat"]) for e in requests] == [("tc-a", False), ("tc-a", True), ("tc-b", False)]
    assert {"call_id", "run_id", "tool", "kind", "attempt", "pid", "t", "repeat"} <= set(requests[0])


@pytest.mark.req("R-Q-5")
def test_idempotency_survives_a_restart_on_the_same_directory(sink: SinkProcess) -> None:
    assert post(sink, "calls", "tc-a").json()["executed"] is True
    sink.stop()
    again = SinkProcess(sink.dir, log_path=sink.log_path)
    try:
        again.start()
        assert post(again, "calls", "tc-a").json() == {"receipt": "tc-a", "executed": False}
    finally:
        again.stop()
    assert len(lines(sink, "executions.jsonl")) == 1
    assert [e["repeat"] for e in lines(sink, "requests.jsonl")] == [False, True]


@pytest.mark.req("R-Q-5")
def test_uninstrumented_actions_execute_every_time(sink: SinkProcess) -> None:
    replies = [post(sink, "actions", "tc-u").json() for _ in range(3)]
    assert all(r["executed"] is True for r in replies)
    assert [e["kind"] for e in lines(sink, "executions.jsonl")] == ["uninstrumented"] * 3
    assert [e["repeat"] for e in lines(sink, "requests.jsonl")] == [False, True, True]


@pytest.mark.req("R-Q-5")
def test_a_held_reply_is_lost_but_the_effect_happened(sink: SinkProcess) -> None:
    with pytest.raises(httpx.TimeoutException):
        post(sink, "calls", "tc-h", timeout=0.3, sink_hold_s=5)
    # recorded before the hold: no waiting needed
    assert [e["call_id"] for e in lines(sink, "executions.jsonl")] == ["tc-h"]
    # a repeat while the first reply is still held answers at once, executing nothing
    repeat = post(sink, "calls", "tc-h", sink_hold_s=5)
    assert repeat.json() == {"receipt": "tc-h", "executed": False}
    assert len(lines(sink, "executions.jsonl")) == 1 and len(lines(sink, "requests.jsonl")) == 2


@pytest.mark.req("R-Q-5")
def test_a_refusal_executes_nothing(sink: SinkProcess) -> None:
    resp = post(sink, "calls", "tc-r", sink_refuse=True)
    assert resp.status_code == 422 and resp.json() == {"code": "refused"}
    assert lines(sink, "executions.jsonl") == []
    assert [e["call_id"] for e in lines(sink, "requests.jsonl")] == ["tc-r"]


@pytest.mark.req("R-TOOL-1")
def test_harness_tools_registry() -> None:
    reg = load_tools("qualify.fakes.tools:sink_tools", {"sink_url": "http://127.0.0.1:1"})
    assert reg.names() == ["charge", "lookup_customer", "merge_pull_request", "send_email", "shell"]
    charge, email, merge, shell, lookup = (reg.get(n) for n in
                                           ("charge", "send_email", "merge_pull_request", "shell",
                                            "lookup_customer"))
    assert charge and email and merge and shell and lookup
    assert charge.kind == ToolKind.INSTRUMENTED and not charge.needs_approval and charge.timeout_s == TIMEOUT_S
    assert email.kind == ToolKind.INSTRUMENTED and email.requires_approval
    assert merge.kind == ToolKind.INSTRUMENTED and merge.finalising and merge.needs_approval
    assert shell.kind == ToolKind.UNINSTRUMENTED
    assert lookup.kind == ToolKind.DEVELOPER_HOSTED and lookup.invoke is None
    assert schema_errors(charge.arguments_schema, {"amount": 5, "sink_hold_s": 2, "sink_refuse": False}) == []
    assert schema_errors(charge.arguments_schema, {"amount": 0}) == [{"field": "amount", "code": "minimum"}]
    assert schema_errors(charge.arguments_schema, {}) == [{"field": "amount", "code": "required"}]
    assert schema_errors(lookup.result_schema, {"name": "Ada", "tier": "pro"}) == []
    assert schema_errors(lookup.result_schema, {"name": "Ada", "tier": "gold", "x": 1})


@pytest.mark.req("R-TOOL-1")
def test_harness_tools_call_the_sink_with_the_journal_call_id(sink: SinkProcess) -> None:
    reg = load_tools("qualify.fakes.tools:sink_tools", {"sink_url": sink.url})
    charge, shell = reg.get("charge"), reg.get("shell")
    assert charge and charge.invoke and shell and shell.invoke
    assert call(charge, ctx("tc-1"), {"amount": 3}) == {"receipt": "tc-1", "executed": True}
    assert call(charge, ctx("tc-1", 2), {"amount": 3})["executed"] is False
    with pytest.raises(ToolFailed) as refused:
        call(charge, ctx("tc-2"), {"amount": 3, "sink_refuse": True})
    assert refused.value.code == "refused"
    with pytest.raises(httpx.TimeoutException):  # unknown outcome: it did happen
        call(charge, ctx("tc-3"), {"amount": 3, "sink_hold_s": TIMEOUT_S + 5})
    call(shell, ctx("tc-4"), {"cmd": "true"})
    call(shell, ctx("tc-4"), {"cmd": "true"})
    assert [(e["call_id"], e["tool"], e["kind"]) for e in lines(sink, "executions.jsonl")] == [
        ("tc-1", "charge", "instrumented"), ("tc-3", "charge", "instrumented"),
        ("tc-4", "shell", "uninstrumented"), ("tc-4", "shell", "uninstrumented")]
    requests = lines(sink, "requests.jsonl")
    assert [(e["call_id"], e["attempt"]) for e in requests][:2] == [("tc-1", 1), ("tc-1", 2)]
    assert all(e["run_id"] == "run-1" for e in requests)


@pytest.mark.req("R-TOOL-3")
def test_a_sink_that_is_gone_is_an_error_not_a_failure(tmp_path: Path) -> None:
    proc = SinkProcess(tmp_path / "sink", log_path=tmp_path / "sink.log")  # never started
    charge = load_tools("qualify.fakes.tools:sink_tools", {"sink_url": proc.url}).get("charge")
    assert charge and charge.invoke
    with pytest.raises(httpx.TransportError):
        call(charge, ctx("tc-1"), {"amount": 1})
