"""The OpenAI-compatible provider adapter in the real worker (R-PROV-1): a fake
chat-completions server (``qualify.fakes.chat_server``) answers over HTTP; the run goes
through a server error, the adapter's own timeout, a tool call run through the journal,
and an answer built from the journaled result."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from qualify.fakes.chat_server import ChatServer, chat_prompt
from qualify.fakes.tools import sink_tools
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted

#: A canary API key: it must reach the server as the bearer token and nothing else.
API_KEY_CANARY = "sk-canary-7f3a9c1e5b2d8f40a6c3e1b9d7f5a2c4"
REQUEST_TIMEOUT_S = 0.5


def _requests(control: Path) -> list[dict[str, Any]]:
    path = control / "chat_requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _counted(ctx: ScenarioContext, run_id: str) -> int:
    """The run's counted provider failures (``runs.provider_failures``, R-EXEC-6)."""
    return int(ctx.sql("SELECT provider_failures FROM runs WHERE run_id = %s", run_id)[0][0])


def _tool_content(ctx: ScenarioContext, run_id: str) -> str | None:
    """The content of the ``tool`` message that feeds the run's one journaled call back to
    the model, computed here from the journal row (its status and result as canonical
    JSON, ``qimpl.providers.chat``'s documented form); None unless the run has one call."""
    rows = ctx.sql("SELECT status, result FROM tool_invocations WHERE run_id = %s", run_id)
    if len(rows) != 1:
        return None
    return json.dumps({"result": rows[0][1], "status": rows[0][0]}, sort_keys=True, separators=(",", ":"))


def _streamed_answer(ctx: ScenarioContext, run_id: str, answer: str) -> tuple[bool, str]:
    """Whether the attempt whose provider call gave the answer (the run's last succeeded
    call) streamed exactly that text as output deltas into the run's event journal
    (R-PROV-1: streaming output deltas; R-EVENT-1), and what was judged."""
    last = ctx.sql("SELECT step, attempt FROM provider_calls WHERE run_id = %s AND status = 'succeeded'"
                   " ORDER BY id DESC LIMIT 1", run_id)
    rows = ctx.sql("SELECT (data->>'step')::int, (data->>'attempt')::int, data->>'delta' FROM run_events"
                   " WHERE run_id = %s AND kind = 'output' AND (data->>'partial')::boolean ORDER BY seq", run_id)
    streamed: dict[tuple[int, int], str] = {}
    for step, attempt, delta in rows:
        streamed[(step, attempt)] = streamed.get((step, attempt), "") + str(delta)
    got = streamed.get(tuple(last[0])) if last else None  # type: ignore[arg-type]
    return (bool(answer) and got == answer,
            f"answered by {tuple(last[0]) if last else None}; streamed "
            + ", ".join(f"step {k[0]} attempt {k[1]}: {len(v)} chars" for k, v in sorted(streamed.items()))
            + f"; the answer {len(answer)} chars")


@scenario(
    "openai-provider-through-the-lifecycle",
    exec_because="the worker's entry point with the real OpenAI adapter", exec_kinds=("worker",),
    title="The OpenAI-compatible adapter against a fake chat-completions server: a 500 at "
          "step 1 and the adapter's own timeout at step 2 are counted failures and retried; "
          "the model's tool call runs once through the journal and its result comes back as a "
          "tool message; usage counts all four requests; the API key never leaks",
    requirements=("R-PROV-1", "R-EXEC-6", "R-EXEC-12", "R-TOOL-1", "R-Q34-2"),
)
def openai_provider_through_the_lifecycle(ctx: ScenarioContext) -> None:
    server = ChatServer(ctx.control, hold_s=REQUEST_TIMEOUT_S * 6).start()
    try:
        env = {"QIMPL_PROVIDER": "openai", "QIMPL_PROVIDER_CONFIG": "{}",
               "QIMPL_OPENAI_BASE_URL": f"{server.url}/v1", "QIMPL_OPENAI_MODEL": "fake-1",
               "QIMPL_OPENAI_API_KEY": API_KEY_CANARY,
               "QIMPL_OPENAI_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
               "QIMPL_PROVIDER_MAX_FAILURES": "5"}
        api = ctx.processes.api(**env)
        ctx.processes.worker(**env)
        run_id = accepted(ctx, api, prompt=chat_prompt(
            tool={"name": "charge", "arguments": {"amount": 5}}, fail={"1": 500, "2": "timeout"},
            answer="charged"))
        run = ctx.wait_terminal(api, run_id, timeout_s=60)
    finally:
        server.stop()
    asked = _requests(ctx.control)
    outcomes = [(r["step"], r["outcome"]) for r in asked]
    ctx.expect("the server was asked: step 1 (500, then the tool call), step 2 (held past the "
               "timeout, then the answer)",
               outcomes == [(1, "http_500"), (1, "tool_call"), (2, "held"), (2, "answer")],
               str(outcomes), "R-PROV-1", "R-EXEC-6", "R-EXEC-12")
    answer = (run.get("result_json") or {}).get("answer", "")
    content = _tool_content(ctx, run_id)
    ctx.expect("the run completed with the answer built from the journaled tool result",
               run["state"] == "completed" and content is not None and '"status":"succeeded"' in content
               and answer == f"charged {content}",
               f"{run['state']}: {answer[:200]!r}; the journal's result as fed {content!r}", "R-PROV-1", "R-TOOL-1")
    streamed, judged = _streamed_answer(ctx, run_id, answer)
    ctx.expect("the answer was streamed as output deltas by the attempt that gave it", streamed, judged,
               "R-PROV-1", "R-EVENT-1")
    bodies = [r["body"] for r in asked]
    # The configured key itself, as the bearer token (compared by its digest): any other
    # credential is not "the key".
    bearer_sha = hashlib.sha256(f"Bearer {API_KEY_CANARY}".encode()).hexdigest()
    keyed = sum(1 for r in asked if r["authorized"] and r.get("authorization_sha256") == bearer_sha)
    # The tool is offered with its arguments' schema (the harness's own definition of it),
    # so the model can know what to send.
    schema = next(dict(t.arguments_schema) for t in sink_tools({"sink_url": "http://127.0.0.1:9"})
                  if t.name == "charge")
    offered = [{t["function"]["name"]: t["function"].get("parameters") for t in b.get("tools", [])}
               for b in bodies]
    ctx.expect("every request streamed with usage, offered the tools and carried the key",
               all(b.get("stream") is True and b.get("stream_options") == {"include_usage": True}
                   for b in bodies) and all(o.get("charge") == schema for o in offered)
               and keyed == len(asked),
               f"{len(bodies)} requests, {keyed} with the configured key as bearer;"
               f" charge offered with its schema in {sum(o.get('charge') == schema for o in offered)}",
               "R-PROV-1")
    same = len(bodies) == 4 and bodies[0] == bodies[1] and bodies[2] == bodies[3]
    fed = bodies[3]["messages"][-1] if len(bodies) == 4 else {}
    # The tool message carries the journal's status and result (the sink's receipt), not
    # only a status: what the model is fed is what the journal holds (R-TOOL-2).
    ctx.expect("a retried step sent the same request; step 2 fed the tool result as a tool "
               "message for the model's call id",
               same and fed.get("role") == "tool" and fed.get("tool_call_id") == "call_1"
               and content is not None and '"receipt"' in content and fed.get("content") == content,
               f"{json.dumps(fed)[:300]}; the journal's {content!r}", "R-PROV-1", "R-EXEC-4", "R-TOOL-2")
    records = ctx.sql("SELECT step, status, outcome_code, input_tokens FROM provider_calls"
                      " WHERE run_id = %s ORDER BY id", run_id)
    counted = _counted(ctx, run_id)
    ctx.expect("the provider-call record: both failures counted under safe codes",
               [(r[0], r[1], r[2]) for r in records] == [
                   (1, "failed", "provider_error:provider_http_500"), (1, "succeeded", None),
                   (2, "failed", "provider_timeout"), (2, "succeeded", None)] and counted == 2,
               f"{records}; the run counted {counted} failures", "R-EXEC-6", "R-EXEC-12", "R-Q34-2")
    usage = run.get("usage") or {}
    tokens = sum(r["usage"]["prompt_tokens"] for r in asked if r["outcome"] in ("tool_call", "answer"))
    ctx.expect("usage counts every request the server saw, and the tokens of those answered",
               usage.get("provider_calls") == len(asked) == 4 and usage.get("input_tokens") == tokens
               and usage.get("output_tokens") == 6 and usage.get("tool_calls") == 1,
               str(usage), "R-Q34-2", "R-PROV-1")
    leaks = [p.name for p in sorted(ctx.deployment.logs_dir.glob("*.log"))
             if API_KEY_CANARY in p.read_text(errors="replace")]
    record = json.dumps(run)
    ctx.expect("the API key is in no log and not in the run record (the 500's body quoted it)",
               not leaks and API_KEY_CANARY not in record, ", ".join(leaks), "R-PROV-1", "R-READ-3")


@scenario(
    "openai-provider-truncated-stream",
    title="The fake chat-completions server ends its first answer cleanly after two thirds "
          "of the text, with no finish_reason and no [DONE]: the adapter counts a failure "
          "(provider_truncated_stream) instead of taking the short answer, and the retry's "
          "whole answer completes the run",
    requirements=("R-PROV-1", "R-EXEC-6", "R-Q34-2"),
)
def openai_provider_truncated_stream(ctx: ScenarioContext) -> None:
    server = ChatServer(ctx.control).start()
    try:
        env = {"QIMPL_PROVIDER": "openai", "QIMPL_PROVIDER_CONFIG": "{}",
               "QIMPL_OPENAI_BASE_URL": f"{server.url}/v1", "QIMPL_OPENAI_MODEL": "fake-1",
               "QIMPL_OPENAI_API_KEY": API_KEY_CANARY, "QIMPL_PROVIDER_MAX_FAILURES": "5"}
        api = ctx.processes.api(**env)
        ctx.processes.worker(**env)
        whole = "the whole answer, every third of it"
        run_id = accepted(ctx, api, prompt=chat_prompt(fail={"1": "truncated"}, answer=whole))
        run = ctx.wait_terminal(api, run_id, timeout_s=60)
    finally:
        server.stop()
    outcomes = [(r["step"], r["outcome"]) for r in _requests(ctx.control)]
    ctx.expect("the server was asked twice: a truncated stream, then the whole answer",
               outcomes == [(1, "truncated"), (1, "answer")], str(outcomes), "R-PROV-1")
    answer = (run.get("result_json") or {}).get("answer", "")
    ctx.expect("the run completed with the retry's whole answer, never the truncated one",
               run["state"] == "completed" and answer == whole, f"{run['state']}: {answer!r}",
               "R-PROV-1", "R-EXEC-6")
    streamed, judged = _streamed_answer(ctx, run_id, answer)
    ctx.expect("the answer was streamed as output deltas by the attempt that gave it", streamed, judged,
               "R-PROV-1", "R-EVENT-1")
    records = ctx.sql("SELECT step, status, outcome_code FROM provider_calls WHERE run_id = %s"
                      " ORDER BY id", run_id)
    counted = _counted(ctx, run_id)
    ctx.expect("the truncated stream is a counted failure under a safe code",
               [tuple(r) for r in records] == [(1, "failed", "provider_error:provider_truncated_stream"),
                                               (1, "succeeded", None)] and counted == 1,
               f"{records}; the run counted {counted} failures", "R-EXEC-6", "R-Q34-2")


#: Each way a stream breaks (``qualify.fakes.chat_server``) and the safe code the adapter
#: must count it under (R-PROV-1, issue 22 item 13).
STREAM_BREAKS = {
    429: "provider_error:provider_http_429",
    "bad_chunk": "provider_error:provider_malformed_response",
    "cut_body": "provider_error:provider_stream_broken",
    "truncated": "provider_error:provider_truncated_stream",
    "error_event": "provider_error:provider_error",
    "cut_tool_arguments": "provider_error:provider_malformed_tool_call",
}


@scenario(
    "openai-provider-stream-breaks",
    title="Every way a chat-completions stream breaks, against a fake server the real worker "
          "reaches over HTTP: a 429 with Retry-After, a chunk that is not JSON, the body cut "
          "halfway, a clean end with no finish_reason, an error event inside the 200, and a "
          "tool call whose arguments stop halfway. Each is a counted failure under its own "
          "safe code, never a short or wrong answer; each run's retry completes it whole",
    requirements=("R-PROV-1", "R-EXEC-6", "R-Q34-2"),
)
def openai_provider_stream_breaks(ctx: ScenarioContext) -> None:
    server = ChatServer(ctx.control).start()
    try:
        env = {"QIMPL_PROVIDER": "openai", "QIMPL_PROVIDER_CONFIG": "{}",
               "QIMPL_OPENAI_BASE_URL": f"{server.url}/v1", "QIMPL_OPENAI_MODEL": "fake-1",
               "QIMPL_OPENAI_API_KEY": API_KEY_CANARY, "QIMPL_PROVIDER_MAX_FAILURES": "5"}
        api = ctx.processes.api(**env)
        ctx.processes.worker(**env)
        runs: dict[str, str] = {}
        for kind in STREAM_BREAKS:
            script: dict[str, Any] = {"fail": {"1": kind}, "answer": f"whole answer after {kind}"}
            if kind == "cut_tool_arguments":
                script["tool"] = {"name": "charge", "arguments": {"amount": 5, "memo": "a memo long enough"}}
            runs[str(kind)] = accepted(ctx, api, prompt=chat_prompt(**script))
        ended = {kind: ctx.wait_terminal(api, run_id, timeout_s=60) for kind, run_id in runs.items()}
    finally:
        server.stop()
    streams: list[str] = []
    for kind, code in STREAM_BREAKS.items():
        run_id, run = runs[str(kind)], ended[str(kind)]
        answer = (run.get("result_json") or {}).get("answer", "")
        whole = f"whole answer after {kind}"
        if kind == "cut_tool_arguments":  # the server's text, then the tool message it was fed
            whole += f" {_tool_content(ctx, run_id)}"
        ctx.expect(f"{kind}: the run completed with the retry's whole answer",
                   run["state"] == "completed" and answer == whole,
                   f"{run['state']}: {answer[:120]!r}, expected {whole[:120]!r}", "R-PROV-1", "R-EXEC-6")
        streamed, judged = _streamed_answer(ctx, run_id, answer)
        if not streamed:
            streams.append(f"{kind}: {judged}")
        records = [tuple(r) for r in ctx.sql(
            "SELECT step, status, outcome_code FROM provider_calls WHERE run_id = %s ORDER BY id", run_id)]
        counted = _counted(ctx, run_id)
        ctx.expect(f"{kind}: one counted failure under {code}, then the retry succeeded",
                   bool(records) and records[0] == (1, "failed", code)
                   and all(status == "succeeded" for _, status, _ in records[1:]) and len(records) >= 2
                   and counted == 1,
                   f"{records}; the run counted {counted} failures", "R-EXEC-6", "R-Q34-2")
    ctx.expect("each run's answer was streamed as output deltas by the attempt that gave it", not streams,
               "; ".join(streams) or f"{len(runs)} runs", "R-PROV-1", "R-EVENT-1", judged=len(runs))
    waited = [r for r in _requests(ctx.control) if _script(r).get("fail") == {"1": 429}]
    if len(waited) >= 2:
        ctx.figure("retry_after_429_s", round(waited[1]["t"] - waited[0]["t"], 3), at_least=0.95, unit="s")
    ctx.expect("the 429's Retry-After (1 s) was waited before the retry",
               len(waited) >= 2 and waited[1]["t"] - waited[0]["t"] >= 0.95,
               f"asked at {[round(r['t'] - waited[0]['t'], 3) for r in waited]}" if waited else "never asked",
               "R-EXEC-6")


def _script(request: dict[str, Any]) -> dict[str, Any]:
    """The chat script of a recorded request (its first user message), or {}."""
    for message in request["body"].get("messages") or []:
        if message.get("role") == "user":
            try:
                return dict(json.loads(str(message.get("content"))).get("chat") or {})
            except (ValueError, AttributeError):
                return {}
    return {}
