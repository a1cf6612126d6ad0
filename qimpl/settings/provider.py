"""``OpenAIChatSettings``: the OpenAI-compatible provider (``QIMPL_PROVIDER=openai``, R-PROV-1)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from qimpl.settings._fields import _example

__all__ = ["OpenAIChatSettings"]


class OpenAIChatSettings(BaseSettings):
    """The OpenAI-compatible chat-completions provider (``QIMPL_PROVIDER=openai``,
    ``qimpl.providers.openai_chat``, R-PROV-1), read by the processes that load it. The
    API key is a secret: never logged, echoed or put in a run, an error or a report."""

    model_config = SettingsConfigDict(env_prefix="QIMPL_OPENAI_", extra="ignore", frozen=True)

    base_url: str = Field(
        default="https://api.openai.com/v1", pattern=r"^https?://",
        description="base URL of the chat-completions server (`…/v1`); any OpenAI-compatible server (vLLM, llama.cpp, Ollama, a gateway)",
        json_schema_extra=_example("http://127.0.0.1:8080/v1"))
    model: str = Field(
        min_length=1, description="the model name sent with every request",
        json_schema_extra=_example("gpt-4o-mini"))
    api_key: SecretStr = Field(
        default=SecretStr(""),
        description="the server's API key (a secret: never logged or echoed); empty for a server that needs none",
        json_schema_extra=_example("sk-…"))
    request_timeout_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="seconds one provider call may take, first byte to last (and each read); past it the call is a counted failure (R-EXEC-12). The client never retries: the run's lifecycle does (R-EXEC-6)",
        json_schema_extra=_example("60"))
    system_prompt: str = Field(
        default="", description="a system message sent first in every request; empty: none",
        json_schema_extra=_example("You are a careful assistant."))
