"""``Settings``, what every process that reaches PostgreSQL and Temporal shares (the
one-shot sweep's model), and the provider fields the API and the worker share."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

from qimpl.backoff import DEFAULT_BASE_S as DEFAULT_BACKOFF_S
from qimpl.backoff import DEFAULT_MAX_S as DEFAULT_BACKOFF_MAX_S
from qimpl.settings._fields import (
    _CONFIG,
    PROVIDER_SHORTCUTS,
    _check_dsn,
    _example,
    _import_path,
    _json_value,
)
from qimpl.takeover import watcher_margin_s

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_S", "DEFAULT_LEASE_S", "DEFAULT_LEASE_SHARE", "Settings", "default_lease_s"]

#: Temporal's activity heartbeat timeout, seconds: the backstop (R-EXEC-2, R-EXEC-13).
DEFAULT_HEARTBEAT_TIMEOUT_S: float = 4.0
#: The ownership lease when ``QIMPL_LEASE_S`` is unset: this share of the heartbeat
#: timeout, so the takeover watcher ends a dead attempt before Temporal's own timeout
#: does (R-EXEC-11, R-EXEC-13; ``qimpl.takeover.heartbeat_throttle_s``).
DEFAULT_LEASE_SHARE: float = 0.5


def default_lease_s(heartbeat_timeout_s: float) -> float:
    """The ownership lease, seconds, when ``QIMPL_LEASE_S`` is unset: ``DEFAULT_LEASE_SHARE``
    of the heartbeat timeout (seconds)."""
    return heartbeat_timeout_s * DEFAULT_LEASE_SHARE


#: The ownership lease with every default, seconds.
DEFAULT_LEASE_S: float = default_lease_s(DEFAULT_HEARTBEAT_TIMEOUT_S)
#: The longest lease, seconds (and so the longest heartbeat timeout is twice that): the
#: lease's TCP keepalive settings must fit the kernel's limits.
MAX_LEASE_S: float = 600


class Settings(BaseSettings):
    """What every process shares. ``QIMPL_DATABASE_URL`` has no default: a process never
    guesses a database."""

    model_config = _CONFIG

    database_url: str = Field(
        description="PostgreSQL DSN of the process's login role (a member of `qimpl_app`, the worker's and the sweep's of `qimpl_worker_role` too; never the owner or a superuser)",
        json_schema_extra=_example("postgresql://qimpl_api:secret@127.0.0.1:5432/qimpl"))
    temporal_address: str = Field(
        default="127.0.0.1:7233", description="Temporal frontend `host:port`",
        json_schema_extra=_example("127.0.0.1:7233"))
    temporal_namespace: str = Field(default="default", description="Temporal namespace",
                                    json_schema_extra=_example("default"))
    temporal_search_attributes: bool = Field(
        default=True,
        description="each run's workflows set the Temporal search attributes `QimplTenant`, `QimplRunId`, `QimplGeneration` and `QimplRunState` (find a run's workflows by tenant and outcome with Temporal's own tools, docs/operations.md). Register them in the namespace first (a deploy step, like the migrations): a worker with this on checks at start and exits 64 naming the missing ones, and Temporal refuses an API's start of a workflow carrying them (the create answers 503 `durable_dispatch_unknown`, the run stays accepted for the reconciler). Set it alike on the API and the workers",
        json_schema_extra=_example("true"))
    task_queue: str = Field(default="agent-runs",
                            description="the queue workers poll and the API dispatches to",
                            json_schema_extra=_example("agent-runs"))
    heartbeat_timeout_s: float = Field(
        default=DEFAULT_HEARTBEAT_TIMEOUT_S, gt=0, le=2 * MAX_LEASE_S, allow_inf_nan=False,
        description="Temporal's activity heartbeat timeout, seconds: its own backstop when no takeover watcher can act, and how long a first attempt paused before its claim keeps its run (see \"Takeover\"). Keep it at least 1.5 x the lease (the watcher has a margin only above 1.25 x the lease + the watcher's poll, with a lease above 4 polls), so the watcher, not this timeout, ends a dead attempt. The API's value is the one a run gets (dispatched with it); set it alike on the API and the workers (R-EXEC-2)",
        json_schema_extra=_example("4"))
    lease_s: float | None = Field(
        default=None, gt=0, le=MAX_LEASE_S, allow_inf_nan=False,
        description="the ownership lease, seconds: how long a run's advisory lock outlives its owner's last statement, and so how soon a paused or cut-off owner is taken over (R-EXEC-11, R-EXEC-13); unset: half the heartbeat timeout (2 s by default; until 2026-12-05: the whole of it). Keep it at most 2/3 of the heartbeat timeout. The API's value is the one a run gets (dispatched with it); a worker's own sizes its ready lease sessions and heartbeat throttle: set it alike on the API and the workers",
        json_schema_extra={**_example("2"),
                           "shown_default": f"H x {DEFAULT_LEASE_SHARE:g} = {DEFAULT_LEASE_S:g}"})
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
        description="how long a run's event stream is kept after its terminal event, seconds (never less than the database's floor, `event_retention_floor`: 60 s unless its owner changes it); then the reconciler prunes it (at most 100 runs per tenant per sweep) and reading it answers 410 `event_stream_pruned` (R-EVENT-5)",
        json_schema_extra=_example("604800"))
    sweep_retention_s: int = Field(
        default=604800, gt=0,
        description="how long the reconciler's own records of its sweeps (`reconciler_sweeps`) are kept, seconds; each sweep deletes at most 1,000 of its tenant's older ones (R-OPS-3)",
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

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        """``host:port`` (``[v6]:port`` too), the port 1-65535: anything else is a typo the
        process would only meet as "cannot reach Temporal" (exit 3)."""
        host, sep, port = value.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or any(
                c.isspace() or c == "/" for c in host):
            raise ValueError(f"{value!r} is not host:port (for example 127.0.0.1:7233)")
        return value.strip()

    @property
    def lease(self) -> float:
        """The ownership lease in effect, seconds: ``lease_s``, or ``default_lease_s`` of the
        heartbeat timeout when it is unset. The API dispatches this value
        (``RunInput.lease_s``)."""
        return self.lease_s if self.lease_s is not None else default_lease_s(self.heartbeat_timeout_s)

    def watcher_margin_s(self, poll_s: float = 0.1) -> float:
        """By how much, seconds, the takeover watcher polling every ``poll_s`` ends a paused
        owner's attempt before Temporal's heartbeat timeout, at worst
        (``qimpl.takeover.watcher_margin_s``, R-EXEC-13): positive when the heartbeat
        timeout is above 1.25 x the lease + ``poll_s`` and the lease above 4 x ``poll_s``;
        at least ``L / 4 - poll_s`` from 1.5 x the lease on. Not positive is allowed (the
        fence is the same) but such a takeover may then cost one more retry timer of the
        server; the API and a watching worker log ``takeover.no_watcher_margin`` at start."""
        return watcher_margin_s(self.heartbeat_timeout_s, self.lease, poll_s)


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
