"""The OpenAI-compatible provider against a local server that speaks the chat-completions
protocol (pytest-httpserver: real HTTP, real SSE, the official ``openai`` client): output
deltas, a tool call streamed in pieces and its journaled result fed back, token usage,
and every failure a counted provider failure with a safe code (R-PROV-1, R-EXEC-6,
R-EXEC-12, R-TOOL-1)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from qimpl.errors import ProviderFailed, ProviderTimedOut
from qimpl.provider import StepContext, StepResult, load_provider
from qimpl.providers.openai_chat import OpenAIChatProvider, factory
from qimpl.settings import ConfigError, OpenAIChatSettings, WorkerSettings, load
from qimpl.tool_journal.seam import ToolCall, ToolKind, ToolRegistry, ToolSpec
from qimpl.workflows.activities import _failure_kind

KEY = "sk-test-0123456789abcdef-secret"
PATH = "/v1/chat/completions"

CHARGE_SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}},
                 "required": ["amount"]}


async def _charge(ctx: Any, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    return {}


TOOLS = ToolRegistry([ToolSpec(name="charge", kind=ToolKind.INSTRUMENTED, invoke=_charge,
                               description="charge the customer", arguments_schema=CHARGE_SCHEMA)])


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    with HTTPServer(threaded=True) as s:
        yield s


def provider(server: HTTPServer, **over: Any) -> OpenAIChatProvider:
    settings = OpenAIChatSettings(base_url=server.url_for("/v1"), model="m-1", api_key=KEY,
                                  **{"request_timeout_s": 5.0, **over})
    return OpenAIChatProvider(settings=settings)


def ctx(step: int = 1, **over: Any) -> StepContext:
    base: dict[str, Any] = {"run_id": "r-1", "tenant_id": "t", "generation": 1, "attempt": 1,
                            "step": step, "prompt": "charge me 5", "state": {},
                            "tools": TOOLS.describe()}
    return StepContext(**{**base, **over})


def sse(*chunks: Mapping[str, Any], done: bool = True) -> str:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks]
    return "".join(lines) + ("data: [DONE]\n\n" if done else "")


def chunk(delta: Mapping[str, Any] | None = None, *, usage: Mapping[str, int] | None = None,
          finish: str | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": dict(delta), "finish_reason": finish}]
    return {"id": "c-1", "object": "chat.completion.chunk", "created": 1, "model": "m-1",
            "choices": choices, "usage": dict(usage) if usage else None}


USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
TEXT_STREAM = sse(chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo "}),
                  chunk({"content": "world"}, finish="stop"), chunk(usage=USAGE))
TOOL_STREAM = sse(
    chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "charge", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"amo'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'unt": 5}'}}]}, finish="tool_calls"),
    chunk(usage={"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}))


def serve(server: HTTPServer, body: str, status: int = 200) -> None:
    server.expect_oneshot_request(PATH, method="POST").respond_with_data(
        body, status=status, content_type="text/event-stream" if status == 200 else "application/json")


def step(p: OpenAIChatProvider, c: StepContext) -> StepResult:
    return asyncio.run(p.step(c))


def sent(server: HTTPServer, index: int = -1) -> dict[str, Any]:
    request, _ = server.log[index]
    return dict(json.loads(request.get_data()))


@pytest.mark.req("R-PROV-1")
def test_streams_output_deltas_into_the_answer_with_token_usage(server: HTTPServer) -> None:
    serve(server, TEXT_STREAM)
    deltas: list[str] = []
    journaled: list[str] = []
    p = provider(server)
    p.on_delta = lambda _ctx, text: deltas.append(text)

    async def emit(text: str) -> None:  # the runtime's journal of output deltas (R-EVENT-1)
        journaled.append(text)

    result = step(p, dataclasses.replace(ctx(), emit=emit))
    assert result.answer == "Hello world" and result.tool_calls == ()
    assert deltas == ["Hel", "lo ", "world"] == journaled
    assert dict(result.usage) == {"provider_calls": 1, "input_tokens": 12, "output_tokens": 3}
    body = sent(server)
    request, _ = server.log[-1]
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert body["model"] == "m-1" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "charge me 5"}]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "charge", "description": "charge the customer", "parameters": CHARGE_SCHEMA}}]


@pytest.mark.req("R-PROV-1", "R-TOOL-1", "R-TOOL-2")
def test_a_tool_call_goes_to_the_journal_and_its_result_comes_back_as_a_tool_message(
        server: HTTPServer) -> None:
    serve(server, TOOL_STREAM)
    p = provider(server)
    first = step(p, ctx(1))
    assert first.answer is None and first.pending is None
    assert first.tool_calls == (ToolCall(tool="charge", arguments={"amount": 5}, id="call_1"),)
    assert dict(first.usage) == {"provider_calls": 1, "input_tokens": 20, "output_tokens": 7}
    # The runtime journals the call and runs it; the next step sees the settled result.
    journaled = ({"call_id": "tc-x", "id": "call_1", "tool": "charge", "status": "succeeded",
                  "result": {"charged": 5}, "step": 1, "position": 0},)
    serve(server, TEXT_STREAM)
    second = step(p, ctx(2, state=first.state, tool_results=journaled))
    assert second.answer == "Hello world"
    assert sent(server)["messages"] == [
        {"role": "user", "content": "charge me 5"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "charge", "arguments": '{"amount": 5}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": '{"result":{"charged":5},"status":"succeeded"}'},
    ]


@pytest.mark.req("R-PROV-1", "R-EXEC-4")
def test_a_retried_step_sends_exactly_the_same_request(server: HTTPServer) -> None:
    """A step rebuilt from the same context (another attempt, another worker, a fresh
    provider) sends the same messages: resume inputs in place, tool results by call id."""
    state = {"turns": [{"inputs_seen": 0, "message": {"role": "assistant", "content": "which card?"}}]}
    again = ctx(3, state=state, inputs=("the blue one",))
    for _ in range(2):
        serve(server, TEXT_STREAM)
        step(provider(server), again)
    assert sent(server, 0) == sent(server, 1)
    assert sent(server, 0)["messages"][1:] == [{"role": "assistant", "content": "which card?"},
                                               {"role": "user", "content": "the blue one"}]


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
def test_an_http_error_is_a_counted_failure_with_a_safe_code(server: HTTPServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    serve(server, json.dumps({"error": {"message": f"upstream said {KEY} secret-in-body"}}), status=500)
    with caplog.at_level(logging.DEBUG), pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert failed.value.code == "provider_http_500"
    assert str(failed.value) == "provider_http_500" and failed.value.__cause__ is None
    assert _failure_kind(failed.value) == "provider_error:provider_http_500"
    assert len(server.log) == 1  # no client retry: retries belong to the lifecycle
    assert KEY not in caplog.text and "secret-in-body" not in caplog.text


@pytest.mark.req("R-PROV-1", "R-EXEC-12")
def test_a_timeout_is_a_counted_provider_timeout_never_an_expiry(server: HTTPServer) -> None:
    release = threading.Event()

    def slow(_request: Request) -> Response:
        release.wait(10)
        return Response(TEXT_STREAM, content_type="text/event-stream")

    server.expect_oneshot_request(PATH, method="POST").respond_with_handler(slow)
    try:
        with pytest.raises(ProviderTimedOut) as timed_out:
            step(provider(server, request_timeout_s=0.3), ctx())
    finally:
        release.set()
    assert isinstance(timed_out.value, TimeoutError)  # the activity's provider_timeout branch
    assert timed_out.value.code == "provider_timeout"


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
@pytest.mark.parametrize(("body", "code"), [
    ("data: {not json\n\n", "provider_malformed_response"),
    (sse(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "charge",
                                                                   "arguments": "{oops"}}]},
               finish="tool_calls")),
     "provider_malformed_tool_call"),
    (sse(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "charge",
                                                                   "arguments": "[1]"}}]},
               finish="tool_calls")),
     "provider_malformed_tool_call"),
    # Every way a stream ends early (issue 22, item 13): a clean end with no finish_reason
    # and no [DONE], with or without [DONE], and cut-off tool-call arguments.
    (sse(chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}), done=False),
     "provider_truncated_stream"),
    (sse(chunk({"role": "assistant", "content": "Hel"}), chunk(usage=USAGE)), "provider_truncated_stream"),
    (sse(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "charge",
                                                                   "arguments": '{"amo'}}]}), done=False),
     "provider_truncated_stream"),
    # An error event inside a 200.
    ('data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n', "provider_error"),
])
def test_a_malformed_stream_is_a_counted_failure(server: HTTPServer, body: str, code: str) -> None:
    serve(server, body)
    with pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert failed.value.code == code


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
def test_a_body_cut_mid_stream_is_a_counted_failure(server: HTTPServer) -> None:
    """The server declares more than it sends and closes: the client's read fails while
    the SDK iterates (an httpx error it does not wrap)."""
    body = sse(chunk({"role": "assistant", "content": "Hel"}), done=False).encode()

    def cut(request: Request) -> Response:
        return Response(body, status=200, headers={"Content-Type": "text/event-stream",
                                                   "Content-Length": str(len(body) + 500)})

    server.expect_oneshot_request(PATH, method="POST").respond_with_handler(cut)
    with pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert failed.value.code in ("provider_stream_broken", "provider_truncated_stream")


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
def test_a_429_is_a_counted_failure_with_its_status(server: HTTPServer) -> None:
    serve(server, '{"error": {"message": "slow down"}}', status=429)
    with pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert failed.value.code == "provider_http_429"
    assert failed.value.retry_after_s is None  # it did not say when to come back


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
def test_a_429s_retry_after_is_kept_for_the_backoff(server: HTTPServer) -> None:
    server.expect_oneshot_request(PATH, method="POST").respond_with_data(
        '{"error": {"message": "slow down"}}', status=429, content_type="application/json",
        headers={"Retry-After": "7"})
    with pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert (failed.value.code, failed.value.retry_after_s) == ("provider_http_429", 7.0)


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
@pytest.mark.parametrize(("header", "kept"), [
    ("\u00b9", None),                        # issue 56 item 10: was provider_error:ValueError
    ("1.5", None), ("soon", None),
    ("99999999999999999999999999", 86_400.0),
    ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
])
def test_an_odd_retry_after_is_still_a_429(server: HTTPServer, header: str, kept: float | None) -> None:
    """A 429 whatever its ``Retry-After`` says: the provider's own code, the value kept as
    RFC 9110 reads it or dropped (never an exception out of the header's parse)."""
    server.expect_oneshot_request(PATH, method="POST").respond_with_data(
        '{"error": {"message": "slow down"}}', status=429, content_type="application/json",
        headers={"Retry-After": header})
    with pytest.raises(ProviderFailed) as failed:
        step(provider(server), ctx())
    assert (failed.value.code, failed.value.retry_after_s) == ("provider_http_429", kept)


@pytest.mark.req("R-PROV-1", "R-TOOL-2")
def test_each_turns_tool_results_are_that_turns_even_when_the_server_reuses_call_ids(
        server: HTTPServer) -> None:
    """Two turns both ask ``call_1`` (servers number calls per turn): each tool message
    carries the result journaled for its own turn's call (issue 22, item 12)."""
    p = provider(server)
    serve(server, TOOL_STREAM)
    first = step(p, ctx(1))
    one = ({"call_id": "tc-1", "id": "call_1", "tool": "charge", "status": "succeeded",
            "result": {"charged": 5}, "step": 1, "position": 0},)
    serve(server, TOOL_STREAM)
    second = step(p, ctx(2, state=first.state, tool_results=one))
    two = (*one, {"call_id": "tc-2", "id": "call_1", "tool": "charge", "status": "failed",
                  "result": {"code": "declined"}, "step": 2, "position": 0})
    serve(server, TEXT_STREAM)
    step(p, ctx(3, state=second.state, tool_results=two))
    tools = [m["content"] for m in sent(server)["messages"] if m["role"] == "tool"]
    assert tools == ['{"result":{"charged":5},"status":"succeeded"}',
                     '{"result":{"code":"declined"},"status":"failed"}']


@pytest.mark.req("R-PROV-1", "R-EXEC-6")
def test_an_unreachable_server_is_a_counted_failure(server: HTTPServer) -> None:
    p = provider(server)
    server.stop()
    with pytest.raises(ProviderFailed) as failed:
        step(p, ctx())
    assert failed.value.code == "provider_unreachable"


@pytest.mark.req("R-PROV-1")
def test_configured_by_settings_with_a_shortcut_and_a_secret_key(monkeypatch: pytest.MonkeyPatch,
                                                                 server: HTTPServer) -> None:
    monkeypatch.setenv("QIMPL_PROVIDER", "openai")
    monkeypatch.setenv("QIMPL_DATABASE_URL", "postgresql://u@127.0.0.1:1/d")
    monkeypatch.setenv("QIMPL_OPENAI_BASE_URL", server.url_for("/v1"))
    monkeypatch.setenv("QIMPL_OPENAI_MODEL", "m-env")
    monkeypatch.setenv("QIMPL_OPENAI_API_KEY", KEY)
    settings = load(WorkerSettings)
    assert settings.provider == "qimpl.providers.openai_chat:factory"
    p = load_provider(settings.provider, {"request_timeout_s": 2})
    assert isinstance(p, OpenAIChatProvider)
    assert (p.settings.model, p.settings.request_timeout_s, p.client.max_retries) == ("m-env", 2, 0)
    assert KEY not in repr(p) and KEY not in repr(p.settings) and KEY not in str(p.settings)
    with pytest.raises(ValueError, match="factory raised ValueError"):  # the key never in config
        load_provider(settings.provider, {"api_key": "x"})
    monkeypatch.delenv("QIMPL_OPENAI_MODEL")
    with pytest.raises(ValueError, match="QIMPL_OPENAI_MODEL: is not set"):
        load_provider(settings.provider, {})
    monkeypatch.setenv("QIMPL_OPENAI_MODEL", "m-env")
    monkeypatch.setenv("QIMPL_OPENAI_BASE_URL", f"ftp://{KEY}@host")
    with pytest.raises(ConfigError) as bad_url:
        factory({})
    assert KEY not in str(bad_url.value)


@pytest.mark.req("R-PROV-1", "R-RESUME-1", "R-TOOL-2")
def test_the_conversation_is_a_function_of_the_context() -> None:
    """Inputs go where they arrived (before the turn that first saw them); each tool call
    is answered by its journaled result, or ``no_result`` so the protocol's pairing holds."""
    from qimpl.providers.chat import conversation

    asked = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "charge", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "charge", "arguments": "{}"}}]}
    state = {"turns": [{"inputs_seen": 0, "message": {"role": "assistant", "content": "which?"}},
                       {"inputs_seen": 1, "message": asked}]}
    c = ctx(3, state=state, inputs=("blue", "and hurry"),
            tool_results=({"id": "a", "status": "failed", "result": {"code": "refused"}},))
    assert conversation(c, system_prompt="be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "charge me 5"},
        {"role": "assistant", "content": "which?"},
        {"role": "user", "content": "blue"},
        asked,
        {"role": "tool", "tool_call_id": "a", "content": '{"result":{"code":"refused"},"status":"failed"}'},
        {"role": "tool", "tool_call_id": "b", "content": '{"status":"no_result"}'},
        {"role": "user", "content": "and hurry"},
    ]
    with pytest.raises(ValueError):
        conversation(ctx(2, state={"turns": "nonsense"}))
