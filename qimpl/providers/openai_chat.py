"""An OpenAI-compatible chat-completions provider (R-PROV-1), behind the provider seam.

    QIMPL_PROVIDER=openai            (or qimpl.providers.openai_chat:factory)
    QIMPL_OPENAI_BASE_URL=http://127.0.0.1:8080/v1  QIMPL_OPENAI_MODEL=…  QIMPL_OPENAI_API_KEY=…

One step is one ``POST {base_url}/chat/completions`` with ``stream=True`` and
``stream_options={"include_usage": True}``, through the official ``openai`` client
(``AsyncOpenAI``). The messages are rebuilt from the step's context (``qimpl.providers.chat``)
so a retried step sends the same request; the registry's tools are offered as functions;
the model's tool calls become ``StepResult.tool_calls``, which the runtime runs through the
tool journal (R-TOOL-1) and feeds back as ``tool`` messages in the next step. Output
deltas are folded into the answer (and given to ``on_delta``, if set); the final usage
chunk's ``prompt_tokens``/``completion_tokens`` become ``input_tokens``/``output_tokens``.

Failures are provider failures under the lifecycle (R-EXEC-6, R-EXEC-12): the client never
retries (``max_retries=0``: retries belong to the run's counted attempts); the request
timeout (``QIMPL_OPENAI_REQUEST_TIMEOUT_S``, each read and the whole streamed call) raises
``ProviderTimedOut`` (a counted failure, never an expiry); an HTTP error, a connection
failure or a malformed stream raises ``ProviderFailed`` with a fixed code — the server's
own error text, which may echo the request, is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import openai

from qimpl.backoff import parse_retry_after
from qimpl.errors import ProviderFailed, ProviderTimedOut
from qimpl.provider import Provider, StepContext, StepResult
from qimpl.providers.chat import Accumulator, conversation, tool_definitions
from qimpl.settings import OpenAIChatSettings, load

__all__ = ["OpenAIChatProvider", "factory"]

log = logging.getLogger("qimpl.provider.openai")

#: Settings a ``QIMPL_PROVIDER_CONFIG`` object may override (never the key: a secret lives
#: in its own variable, not in a JSON blob that is easy to print).
CONFIG_KEYS = frozenset({"base_url", "model", "request_timeout_s", "system_prompt"})


class OpenAIChatProvider(Provider):
    """One chat completion per step (see the module docstring). ``client`` defaults to an
    ``AsyncOpenAI`` built from ``settings``; ``on_delta(ctx, text)`` sees each content delta."""

    def __init__(self, *, settings: OpenAIChatSettings, client: openai.AsyncOpenAI | None = None,
                 on_delta: Callable[[StepContext, str], None] | None = None) -> None:
        self.settings = settings
        self.on_delta = on_delta
        self.client = client or openai.AsyncOpenAI(
            api_key=settings.api_key.get_secret_value() or "none", base_url=settings.base_url,
            timeout=settings.request_timeout_s, max_retries=0)

    def __repr__(self) -> str:
        return f"OpenAIChatProvider(base_url={self.settings.base_url!r}, model={self.settings.model!r})"

    def request(self, ctx: StepContext) -> dict[str, Any]:
        """The request body of step ``ctx.step`` (a pure function of ``ctx``)."""
        body: dict[str, Any] = {
            "model": self.settings.model, "stream": True, "stream_options": {"include_usage": True},
            "messages": conversation(ctx, system_prompt=self.settings.system_prompt)}
        if ctx.tools:
            body["tools"] = tool_definitions(ctx.tools)
        return body

    async def step(self, ctx: StepContext) -> StepResult:
        """Ask the model once. Raises ProviderTimedOut (the request timeout) or
        ProviderFailed (``provider_http_<status>``, ``provider_unreachable``,
        ``provider_error`` (an error event inside a 200 too), ``provider_stream_broken`` (the
        body cut mid-stream), ``provider_truncated_stream`` (ended without saying how it
        finished), ``provider_malformed_response``, ``provider_malformed_tool_call``)."""
        folded = Accumulator(step=ctx.step)
        answered = False  # the server answered 200 and the body is being read
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                stream = await self.client.chat.completions.create(**self.request(ctx))
                answered = True
                async with stream:
                    async for chunk in stream:
                        delta = folded.add(chunk.model_dump())
                        if delta and self.on_delta is not None:
                            self.on_delta(ctx, delta)
                        if delta and ctx.emit is not None:
                            await ctx.emit(delta)  # into the run's event journal (R-EVENT-1)
        except (TimeoutError, openai.APITimeoutError):
            raise ProviderTimedOut() from None
        except openai.APIStatusError as exc:
            # A 429 or 503 may say when to come back: honoured within the deadline (qimpl.backoff).
            wait = parse_retry_after(exc.response.headers.get("retry-after"), now=time.time())
            raise ProviderFailed(f"provider_http_{exc.status_code}", retry_after_s=wait) from None
        except openai.APIConnectionError:
            # After the 200 a lost connection is a body cut mid-stream (the SDK wraps the
            # transport's error while iterating too), not a server out of reach.
            raise ProviderFailed("provider_stream_broken" if answered else "provider_unreachable") from None
        except openai.APIError:
            raise ProviderFailed("provider_error") from None
        except httpx.TransportError:
            # The body was cut mid-stream (the SDK does not wrap errors while iterating).
            raise ProviderFailed("provider_stream_broken") from None
        except (ValueError, TypeError, KeyError, AttributeError):
            raise ProviderFailed("provider_malformed_response") from None
        turn = folded.turn()
        usage = {"provider_calls": 1}
        if turn.input_tokens is not None:
            usage["input_tokens"] = turn.input_tokens
        if turn.output_tokens is not None:
            usage["output_tokens"] = turn.output_tokens
        state = {"turns": [*ctx.state.get("turns", []),
                           {"inputs_seen": len(ctx.inputs), "step": ctx.step, "message": turn.message}]}
        return StepResult(state=state, usage=usage, tool_calls=turn.tool_calls,
                          answer=None if turn.tool_calls else turn.text)


def factory(config: Mapping[str, Any]) -> OpenAIChatProvider:
    """``QIMPL_PROVIDER=openai``: the settings from ``QIMPL_OPENAI_*``, overridden by the
    keys of ``config`` in ``CONFIG_KEYS``. Raises ValueError for any other config key,
    ConfigError for a missing or malformed setting (naming the variable, never its value)."""
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise ValueError(f"QIMPL_PROVIDER_CONFIG: unknown keys {sorted(unknown)}; "
                         f"allowed: {sorted(CONFIG_KEYS)} (the API key only as QIMPL_OPENAI_API_KEY)")
    settings = load(OpenAIChatSettings, **dict(config))
    log.info("provider: OpenAI-compatible chat completions at %s, model %s", settings.base_url,
             settings.model, extra={"event": "provider.configured"})
    return OpenAIChatProvider(settings=settings)
