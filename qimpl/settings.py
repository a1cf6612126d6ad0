"""Deployment settings, read once from the environment (pydantic-settings): one model per
process, each validating only what that process reads.

    Settings             what every process that reaches PostgreSQL and Temporal shares
    │                    (the one-shot sweep's model; dispatch and the reconciler read it)
    ├── ApiSettings      + provider (legacy paths), authentication, pool
    └── WorkerSettings   + provider, tools, activities, reconciler, metrics port
    AdminSettings        the schema owner's DSN (``python -m qimpl.scripts.api_keys``)
    OpenAIChatSettings   the OpenAI-compatible provider (``QIMPL_PROVIDER=openai``, R-PROV-1)

Names the spec fixes keep their names (``AGENT_CONCURRENCY_LIMIT``,
``DURABLE_AGENT_RECONCILE_TENANTS``); everything else is prefixed ``QIMPL_``. Each field
carries its description and an example (``json_schema_extra``): the settings table of
``docs/operations.md`` is generated from them (``python -m qimpl.settings``, checked by a
unit test), and a missing or malformed setting stops a process at once with one line
naming the variable and that example, exit code 64 (``load_or_exit``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from qimpl.backoff import DEFAULT_BASE_S as DEFAULT_BACKOFF_S
from qimpl.backoff import DEFAULT_MAX_S as DEFAULT_BACKOFF_MAX_S

__all__ = [
    "EXIT_CONFIG",
    "MIN_DISTINCT_CHARS",
    "MIN_STATIC_KEY_CHARS",
    "PROVIDER_SHORTCUTS",
    "AdminSettings",
    "ApiSettings",
    "ConfigError",
    "OpenAIChatSettings",
    "Settings",
    "WorkerSettings",
    "config_error",
    "env_name",
    "exit_config",
    "get_settings",
    "key_is_secret",
    "load",
    "load_or_exit",
    "plugin_error",
    "settings_table",
]

#: Exit code of a process stopped by its configuration (EX_USAGE, sysexits.h).
EXIT_CONFIG = 64

_DSN_SCHEMES = ("postgresql://", "postgres://")
_CONFIG = SettingsConfigDict(env_prefix="QIMPL_", extra="ignore", frozen=True)


def _example(value: str) -> dict[str, Any]:
    return {"example": value}


def _json_value(value: Any, kind: type) -> Any:
    """Decode a JSON environment value ourselves (``NoDecode``), so that a malformed one
    is a ValidationError that names its field instead of a SettingsError."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else kind()
        except ValueError:
            raise ValueError(f"not valid JSON (expected a JSON {kind.__name__ if kind is not dict else 'object'})") from None
    if not isinstance(value, kind):
        raise ValueError(f"expected a JSON {'object' if kind is dict else 'list'}, got {type(value).__name__}")
    return value


def _check_dsn(value: str) -> str:
    if not value.startswith(_DSN_SCHEMES):
        raise ValueError("must be a PostgreSQL URL postgresql://user:password@host:port/database")
    return value


#: Provider names ``QIMPL_PROVIDER`` accepts besides an import path.
PROVIDER_SHORTCUTS: Mapping[str, str] = {
    "echo": "qimpl.provider:EchoProvider",
    "openai": "qimpl.providers.openai_chat:factory",
}


def _import_path(value: str) -> str:
    module, _, attr = value.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
        raise ValueError(f"must be an import path 'module:factory', got {value!r}")
    return value


class Settings(BaseSettings):
    """What every process shares. ``QIMPL_DATABASE_URL`` has no default: a process never
    guesses a database."""

    model_config = _CONFIG

    database_url: str = Field(
        description="PostgreSQL DSN of the process's login role (a member of `qimpl_app`; never the owner or a superuser)",
        json_schema_extra=_example("postgresql://qimpl_api:secret@127.0.0.1:5432/qimpl"))
    temporal_address: str = Field(
        default="127.0.0.1:7233", description="Temporal frontend `host:port`",
        json_schema_extra=_example("127.0.0.1:7233"))
    temporal_namespace: str = Field(default="default", description="Temporal namespace",
                                    json_schema_extra=_example("default"))
    temporal_search_attributes: bool = Field(
        default=True,
        description="each run's workflows set the Temporal search attributes `QimplTenant`, `QimplRunId`, `QimplGeneration` and `QimplRunState` (find a run's workflows by tenant and outcome with Temporal's own tools, docs/operations.md). Register them in the namespace first (a deploy step, like the migrations): a worker with this on checks at start and exits 64 naming the missing ones. Set it alike on the API and the workers",
        json_schema_extra=_example("true"))
    task_queue: str = Field(default="agent-runs",
                            description="the queue workers poll and the API dispatches to",
                            json_schema_extra=_example("agent-runs"))
    heartbeat_timeout_s: float = Field(
        default=2.0, gt=0,
        description="activity heartbeat timeout **and** the ownership lease, seconds (see \"The ownership lease\"); set it alike on the API and the workers (R-EXEC-2)",
        json_schema_extra=_example("2"))
    lease_s: float | None = Field(
        default=None, gt=0, le=600,
        description="the ownership lease, seconds: how long a run's advisory lock outlives its owner's last statement, and so how soon a paused or cut-off owner is taken over (R-EXEC-11, R-EXEC-13); unset: the heartbeat timeout. Set it alike on the API and the workers",
        json_schema_extra=_example("2"))
    provider_max_failures: int = Field(
        default=5, ge=1,
        description="provider failures (counted in the run) before it ends `failed` (R-EXEC-6); also the most times one step is asked of the provider, however its asks ended (a counted failure, or the attempt's death after the answer: `agent_step_asks_exhausted`, R-EXEC-12)",
        json_schema_extra=_example("5"))
    provider_backoff_s: float = Field(
        default=DEFAULT_BACKOFF_S, ge=0,
        description="seconds a run waits after its first counted provider failure before it asks again, doubling per failure up to `QIMPL_PROVIDER_BACKOFF_MAX_S`; a provider's `Retry-After` is waited for when longer, never past the deadline. With the defaults and 5 failures the last ask is 45 s after the first failure: a shorter model-server outage costs only time (R-EXEC-6)",
        json_schema_extra=_example("3"))
    provider_backoff_max_s: float = Field(
        default=DEFAULT_BACKOFF_MAX_S, ge=0,
        description="the longest wait between two asks after counted provider failures, seconds",
        json_schema_extra=_example("30"))
    dispatch_timeout_s: float = Field(
        default=5.0, gt=0,
        description="how long the API waits for Temporal before answering 503 `durable_dispatch_unknown` (R-CREATE-5); a key whose first request is unanswered for this long + 1 s stops answering 409 `idempotency_key_in_flight`",
        json_schema_extra=_example("5"))
    workflow_task_timeout_s: float = Field(
        default=3.0, ge=1, le=120,
        description="Temporal workflow task timeout of each dispatched run, seconds (Temporal's default is 10): a paused worker's outstanding poll holds a new run's first workflow task this long before a live worker gets it",
        json_schema_extra=_example("3"))
    concurrency_limit: int = Field(
        default=0, ge=0, validation_alias=AliasChoices("AGENT_CONCURRENCY_LIMIT", "QIMPL_CONCURRENCY_LIMIT"),
        description="execution slots per tenant (`running` + `awaiting_approval`); 0: no limit (R-EXEC-9)",
        json_schema_extra=_example("10"))
    api_lock_timeout_s: float = Field(
        default=5.0, gt=0,
        description="longest an API request or a sweep waits for a run's row lock; the API then answers 503 `run_busy` (retryable). Keep it above the lease",
        json_schema_extra=_example("5"))
    idempotency_retention_s: int = Field(
        default=86400, gt=0,
        description="how long `Idempotency-Key`s are remembered, seconds (pruned by the reconciler, R-CREATE-2)",
        json_schema_extra=_example("86400"))
    event_retention_s: int = Field(
        default=604800, ge=0,
        description="how long a run's event stream is kept after its terminal event, seconds; then the reconciler prunes it (at most 100 runs per tenant per sweep) and reading it answers 410 `event_stream_pruned` (R-EVENT-5)",
        json_schema_extra=_example("604800"))
    reconcile_grace_s: float = Field(
        default=6.0, ge=0,
        description="a generation is dispatched by the reconciler only this long after it was handed to dispatch (creation, resume, approval); a live run's workflow is checked only this long after its dispatch was confirmed",
        json_schema_extra=_example("6"))
    crash_points: str = Field(
        default="", description="harness only: crash-point directive `name:action[,name:action]`; inert when empty (R-Q-4)",
        json_schema_extra=_example("activity.after_claim:kill"))
    control_dir: str = Field(
        default="", description="harness only: where crash points leave evidence and wait for release",
        json_schema_extra=_example("/tmp/qualify-control"))

    @field_validator("database_url")
    @classmethod
    def _dsn(cls, value: str) -> str:
        return _check_dsn(value)


class _ProviderSettings(BaseSettings):
    """The provider, read by both the API (legacy inline path, ``/v1/answer``) and the
    worker (durable runs): set it alike on both (R-EXEC-1)."""

    model_config = _CONFIG

    provider: str = Field(
        default="qimpl.provider:EchoProvider",
        description="provider plugin `module:factory` (`qimpl/provider.py`), or a shortcut: `echo`, `openai` (an OpenAI-compatible chat-completions server, `QIMPL_OPENAI_*`); loaded and validated at start by **both** the API (legacy paths, `/v1/answer`) and the worker: set it alike on both. The default echoes the prompt",
        json_schema_extra=_example("qualify.fakes.synthetic:SyntheticProvider"))
    provider_config: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="JSON object given to the provider factory (echo: `{\"steps\": 3}`)",
        json_schema_extra=_example('{"steps": 3}'))

    @field_validator("provider")
    @classmethod
    def _provider_path(cls, value: str) -> str:
        return _import_path(PROVIDER_SHORTCUTS.get(value, value))

    @field_validator("provider_config", mode="before")
    @classmethod
    def _provider_json(cls, value: Any) -> Any:
        return _json_value(value, dict)


#: Shortest key ``QIMPL_API_KEYS`` (and ``api_keys create --key``) accepts, and how many
#: different characters it must hold: keys are stored as plain SHA-256, so a chosen key
#: must carry its own entropy.
MIN_STATIC_KEY_CHARS = 24
MIN_DISTINCT_CHARS = 12


def key_is_secret(key: str) -> bool:
    """True for a chosen key long and varied enough to serve as a secret."""
    return len(key) >= MIN_STATIC_KEY_CHARS and len(set(key)) >= MIN_DISTINCT_CHARS


class ApiSettings(_ProviderSettings, Settings):
    """The API process (``uvicorn --factory qimpl.api.app:create_app``)."""

    auth: str = Field(
        default="db", pattern="^(db|static)$",
        description="`db`: hashed API keys in PostgreSQL (`python -m qimpl.scripts.api_keys`); `static`: `QIMPL_API_KEYS` (development only)",
        json_schema_extra=_example("db"))
    #: ``"role": "operator"`` marks an operator key (R-OPS-7), the default is ``client``.
    api_keys: Annotated[dict[str, dict[str, str]], NoDecode] = Field(
        default_factory=dict,
        description="`QIMPL_AUTH=static` only: JSON object `{key: {\"tenant\", \"principal\", \"role\"?}}` (`role`: `client`, the default, or `operator`)",
        json_schema_extra=_example('{"dev-key": {"tenant": "acme", "principal": "alice"}}'))
    legacy_runs_per_tenant: int = Field(
        default=4, ge=1, le=1000,
        description="legacy inline runs (R-CREATE-6) one API process executes at once per tenant; more wait in `queued`. Each runs on a connection of its own, outside the API pool, and ends `expired` at its deadline",
        json_schema_extra=_example("4"))
    api_pool_timeout_s: float = Field(
        default=5.0, gt=0, le=300,
        description="seconds a request waits for a pooled database connection (the pool replacing dead ones, or all busy) before it is answered 503 `database_unavailable` (retryable)",
        json_schema_extra=_example("5"))
    api_db_timeout_s: float = Field(
        default=10.0, gt=0, le=300,
        description="longest a request's work on one database connection may take (its statements and commit, not the wait for the connection) before the connection is cut and the request answered 503 `database_unavailable` (retryable with the same idempotency key: a commit may have landed). Bounds a database that stops answering with the connection still up; keep it above `QIMPL_API_LOCK_TIMEOUT_S`",
        json_schema_extra=_example("10"))
    api_pool_size: int = Field(default=10, ge=1, description="API connection pool size",
                               json_schema_extra=_example("10"))
    event_ping_s: float = Field(
        default=15.0, gt=0,
        description="seconds between keep-alive comments on an open event stream (R-EVENT-2)",
        json_schema_extra=_example("15"))
    event_streams_per_run: int = Field(
        default=16, ge=1, le=10000,
        description="open event streams of one run one API process serves at once (R-EVENT-2); one more is 429 `too_many_streams` (the stream key is a bearer secret: a leaked one must not open unbounded streams)",
        json_schema_extra=_example("16"))
    event_fallback_poll_s: float = Field(
        default=5.0, gt=0,
        description="an open event stream reads the event journal at least this often, seconds, even without a notification (the LISTEN connection wakes it at once)",
        json_schema_extra=_example("5"))
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024,
        description="largest request body the API reads, bytes; larger is 413 `body_too_large`, "
                    "and a write without `Authorization` is 401 before its body is read",
        json_schema_extra=_example("1048576"))

    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="JSON list of browser origins (`https://app.example.com`) allowed to call the API cross-origin (CORS), for example to follow a run's events with `EventSource` and a stream token (R-EVENT-6); empty: no cross-origin access",
        json_schema_extra=_example('["https://app.example.com"]'))

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_json(cls, value: Any) -> Any:
        return _json_value(value, dict)

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins_json(cls, value: Any) -> Any:
        return _json_value(value, list)

    @field_validator("cors_origins")
    @classmethod
    def _origins_sound(cls, value: list[str]) -> list[str]:
        """Each origin is ``scheme://host[:port]`` (no path, no wildcard: an allow-list)."""
        for origin in value:
            scheme, sep, rest = origin.partition("://")
            if scheme not in ("http", "https") or not sep or not rest or "/" in rest or "*" in rest:
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path, no wildcard)")
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_sound(cls, value: dict[str, dict[str, str]], info: ValidationInfo) -> dict[str, dict[str, str]]:
        """Every static key is long enough to be a secret and names a non-empty tenant and
        principal, and a known role; ``QIMPL_AUTH=static`` needs at least one (there is no
        built-in key)."""
        if info.data.get("auth") == "static" and not value:
            raise ValueError("QIMPL_AUTH=static needs at least one key")
        for key, who in value.items():
            if not key_is_secret(key):
                raise ValueError(f"a key needs at least {MIN_STATIC_KEY_CHARS} characters, "
                                 f"{MIN_DISTINCT_CHARS} of them different")
            if not who.get("tenant") or not who.get("principal"):
                raise ValueError("every key needs a non-empty tenant and principal")
            if who.get("role", "client") not in ("client", "operator"):
                raise ValueError("role must be client or operator")
        return value


class WorkerSettings(_ProviderSettings, Settings):
    """The worker process (``python -m qimpl.workflows.worker``), reconciler included."""

    tools: str = Field(
        default="", description="the worker's tool registry, `module:factory` returning `ToolSpec`s (`qimpl/tool_journal/seam.py`); empty: no tools",
        json_schema_extra=_example("qualify.fakes.tools:sink_tools"))
    tools_config: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="JSON object given to the tools factory",
        json_schema_extra=_example('{"sink_url": "http://127.0.0.1:9000"}'))
    max_concurrent_activities: int = Field(
        default=20, ge=1, description="activities per worker; each holds one lease connection",
        json_schema_extra=_example("20"))
    reconcile_interval_s: float = Field(default=5.0, gt=0, description="seconds between sweeps (R-OPS-3)",
                                        json_schema_extra=_example("5"))
    metrics_port: int = Field(
        default=0, ge=0, le=65535,
        description="the worker's Prometheus port on 127.0.0.1; 0: off (the API serves `/metrics` itself, to operator keys)",
        json_schema_extra=_example("9464"))
    takeover_watch: bool = Field(
        default=True,
        description="run the takeover watcher: fail the Temporal attempt of a `running` run whose lease is gone at once, instead of after Temporal's heartbeat timeout (R-EXEC-13). One worker at a time watches (a session advisory lock); any number may run it",
        json_schema_extra=_example("true"))
    takeover_poll_s: float = Field(
        default=0.1, ge=0.02, le=10,
        description="seconds between the takeover watcher's looks for runs whose lease is gone (one query over `pg_locks`)",
        json_schema_extra=_example("0.1"))
    takeover_unclaimed_s: float = Field(
        default=0.3, ge=0.05, le=60,
        description="seconds a started Temporal attempt of a run whose lease is gone may go without a heartbeat or a claim before the watcher fails it (the attempt a paused worker's outstanding poll took and never runs, R-EXEC-13); one that heartbeated, twice that",
        json_schema_extra=_example("0.3"))
    reconcile_tenants: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias=AliasChoices("DURABLE_AGENT_RECONCILE_TENANTS", "QIMPL_RECONCILE_TENANTS"),
        description="JSON list of tenants this worker reconciles; `[]`: no sweep (R-OPS-3)",
        json_schema_extra=_example('["acme"]'))

    @field_validator("tools")
    @classmethod
    def _tools_path(cls, value: str) -> str:
        return _import_path(value) if value else value

    @field_validator("tools_config", mode="before")
    @classmethod
    def _tools_json(cls, value: Any) -> Any:
        return _json_value(value, dict)

    @field_validator("reconcile_tenants", mode="before")
    @classmethod
    def _tenants_json(cls, value: Any) -> Any:
        return _json_value(value, list)


class AdminSettings(BaseSettings):
    """The schema owner's connection (``python -m qimpl.scripts.api_keys``); falls back to
    ``QIMPL_DATABASE_URL``."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    admin_database_url: str = Field(
        validation_alias=AliasChoices("QIMPL_ADMIN_DATABASE_URL", "QIMPL_DATABASE_URL"),
        description="the schema owner's DSN, for migrations and `python -m qimpl.scripts.api_keys` (falls back to `QIMPL_DATABASE_URL`)",
        json_schema_extra=_example("postgresql://qimpl_owner:secret@127.0.0.1:5432/qimpl"))

    @field_validator("admin_database_url")
    @classmethod
    def _dsn(cls, value: str) -> str:
        return _check_dsn(value)


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


#: Which process reads which model (the table's last column), in table order.
PROCESSES: dict[str, type[BaseSettings]] = {
    "API": ApiSettings, "worker": WorkerSettings, "sweep": Settings, "api_keys, migrate": AdminSettings,
    "API and worker with `QIMPL_PROVIDER=openai`": OpenAIChatSettings}

S = TypeVar("S", bound=BaseSettings)


def env_name(model: type[BaseSettings], field: str) -> str:
    """The environment variable of ``field`` in ``model`` (its first alias, else prefix + name)."""
    info = model.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    return f"{model.model_config.get('env_prefix', '')}{field}".upper()


#: The login role each process's example DSN names (``qimpl_app`` members, R-AUTH-4).
_EXAMPLE_ROLE = {"WorkerSettings": "qimpl_worker"}


def _example_of(model: type[BaseSettings], field: str) -> str:
    extra = model.model_fields[field].json_schema_extra
    example = str(extra.get("example", "")) if isinstance(extra, Mapping) else ""
    role = _EXAMPLE_ROLE.get(model.__name__)
    return example.replace("qimpl_api:", f"{role}:") if role and field == "database_url" else example


class ConfigError(Exception):
    """A missing or malformed setting: ``code`` (``setting_missing``, ``setting_invalid``),
    the ``variable``, a ``reason`` and an ``example`` value."""

    def __init__(self, *, code: str, variable: str, reason: str, example: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.code, self.variable, self.reason, self.example = code, variable, reason, example

    def line(self, process: str) -> str:
        """The one stderr line: JSON, like every log line, readable as it stands."""
        example = f"{self.variable}='{self.example}'" if self.example else ""
        return json.dumps({
            "level": "error", "logger": f"qimpl.{process}", "event": "config.invalid",
            "code": self.code, "variable": self.variable,
            "msg": f"{process}: {self.variable} {self.reason}; for example {example}",
            "example": example})


def config_error(model: type[BaseSettings], exc: ValidationError | SettingsError) -> ConfigError:
    """The first problem of ``exc`` as a ConfigError naming its environment variable."""
    if isinstance(exc, SettingsError):  # a value the source itself could not decode
        field = next((f for f in model.model_fields if f'"{f}"' in str(exc)), "")
        var = env_name(model, field) if field else "a setting"
        return ConfigError(code="setting_invalid", variable=var, reason="is not valid JSON",
                           example=_example_of(model, field) if field else "")
    err = exc.errors()[0]
    loc = str(err["loc"][0]) if err["loc"] else ""
    field = loc if loc in model.model_fields else next(
        (f for f, i in model.model_fields.items()
         if isinstance(i.validation_alias, AliasChoices) and loc in i.validation_alias.choices), "")
    var = env_name(model, field) if field else loc
    if err["type"] == "missing":
        return ConfigError(code="setting_missing", variable=var, reason="is not set",
                           example=_example_of(model, field))
    reason = str(err["msg"]).removeprefix("Value error, ")
    return ConfigError(code="setting_invalid", variable=var, reason=f"is invalid: {reason}",
                       example=_example_of(model, field) if field else "")


def load(model: type[S], **values: Any) -> S:
    """``model`` read from the environment (and ``values``); ConfigError on a bad setting."""
    try:
        return model(**values)
    except (ValidationError, SettingsError) as exc:
        raise config_error(model, exc) from None


def exit_config(error: ConfigError, process: str) -> NoReturn:
    """Print ``error``'s one line on stderr and exit ``EXIT_CONFIG`` (64), no traceback."""
    print(error.line(process), file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG)


def load_or_exit(model: type[S], process: str) -> S:
    """``model`` from the environment, or exit ``EXIT_CONFIG`` (64) after one JSON line on
    stderr naming the variable and an example: no traceback, no partial start."""
    try:
        return load(model)
    except ConfigError as exc:
        exit_config(exc, process)


def plugin_error(model: type[BaseSettings], field: str, exc: Exception) -> ConfigError:
    """A plugin setting (``provider``, ``tools``) whose import path does not load."""
    return ConfigError(code="setting_invalid", variable=env_name(model, field),
                       reason=f"does not load: {exc}", example=_example_of(model, field))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The shared settings of this process (cached; processes use their own model)."""
    return load(Settings)


def settings_table() -> str:
    """The Markdown settings table of ``docs/operations.md``, generated from the models:
    variable, default, which processes read it, meaning."""
    rows: dict[str, tuple[str, str, list[str], str]] = {}
    for process, model in PROCESSES.items():
        for field, info in model.model_fields.items():
            var = env_name(model, field)
            if var in rows:
                rows[var][2].append(process)
                continue
            if info.is_required():
                default = "— (required)"
            else:
                value = info.get_default(call_default_factory=True)
                if isinstance(value, SecretStr):  # a secret's default is shown as empty or hidden
                    value = "" if not value.get_secret_value() else "(secret)"
                default = f"`{json.dumps(value) if isinstance(value, (dict, list)) else value}`"
                if value in ("", {}, []) and not isinstance(value, bool):
                    default = "empty" if value == "" else default
            extra = ""
            if isinstance(info.validation_alias, AliasChoices) and len(info.validation_alias.choices) > 1:
                extra = " (also read as " + ", ".join(
                    f"`{c}`" for c in info.validation_alias.choices[1:]) + ")"
            rows[var] = (f"`{var}`", default, [process], (info.description or "") + extra)
    lines = ["| variable | default | read by | meaning |", "|---|---|---|---|"]
    for var, default, procs, meaning in rows.values():
        lines.append(f"| {var} | {default} | {', '.join(procs)} | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(settings_table())
