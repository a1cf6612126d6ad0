"""Deployment settings, read once from the environment (pydantic-settings).

Names the spec fixes keep their names (``AGENT_CONCURRENCY_LIMIT``,
``DURABLE_AGENT_RECONCILE_TENANTS``); everything else is prefixed ``QIMPL_``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QIMPL_", extra="ignore", frozen=True)

    database_url: str = "postgresql://postgres@127.0.0.1:5432/qimpl"
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    task_queue: str = "agent-runs"
    #: Import path ``module:attribute`` of the provider factory (R-EXEC-1, R-Q-3).
    provider: str = "qimpl.provider:EchoProvider"
    provider_config: dict[str, Any] = Field(default_factory=dict)
    #: Import path ``module:factory`` of the worker's tools (R-TOOL-1); empty: no tools.
    tools: str = ""
    #: JSON object given to the tools factory.
    tools_config: dict[str, Any] = Field(default_factory=dict)
    #: Activity heartbeat timeout; the ownership lease is derived from it (R-EXEC-2).
    heartbeat_timeout_s: float = 2.0
    #: Provider failures (counted durably in the run) after which the run is ``failed``
    #: (R-EXEC-6). Crashes, pauses and lost locks never count: only the deadline bounds them.
    provider_max_failures: int = 5
    #: Seconds the API waits for Temporal to confirm a start before answering 503 (R-CREATE-5).
    dispatch_timeout_s: float = 5.0
    #: ``db``: API keys hashed in PostgreSQL (production); ``static``: ``api_keys`` below.
    auth: str = "db"
    #: JSON object ``{api_key: {"tenant": ..., "principal": ...}}`` (``auth=static`` only);
    #: ``"role": "operator"`` marks an operator key (R-OPS-7), the default is ``client``.
    api_keys: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {"dev-key": {"tenant": "t-dev", "principal": "p-dev"}}
    )
    #: Crash-point directive ``name:action[,name:action]``; inert when empty (R-Q-4).
    crash_points: str = ""
    #: Where crash points and the synthetic provider leave evidence and wait for release.
    control_dir: str = ""
    concurrency_limit: int = Field(
        default=0, validation_alias=AliasChoices("AGENT_CONCURRENCY_LIMIT", "QIMPL_CONCURRENCY_LIMIT")
    )
    #: Activities one worker runs at once; each holds one lease connection (connection budget).
    max_concurrent_activities: int = 20
    #: Longest an API or reconciler statement waits for a run's row lock (seconds); the
    #: API then answers 503 ``run_busy``. Keep it above the heartbeat timeout (the lease):
    #: a paused owner's locks are released within the lease (R-EXEC-11).
    api_lock_timeout_s: float = 5.0
    #: Size of the API's connection pool (connection budget).
    api_pool_size: int = 10
    #: How long idempotency keys are remembered (R-CREATE-2); pruned by the reconciler.
    idempotency_retention_s: int = 86400
    #: Seconds between reconciler sweeps (R-OPS-3).
    reconcile_interval_s: float = 5.0
    #: An ``accepted`` run is the reconciler's to dispatch only after this many seconds,
    #: so that it does not race the API's own dispatch (which waits dispatch_timeout_s).
    reconcile_grace_s: float = 6.0
    #: Port of the worker's Prometheus endpoint; 0 disables it (R-OPS-6).
    metrics_port: int = 0
    reconcile_tenants: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("DURABLE_AGENT_RECONCILE_TENANTS", "QIMPL_RECONCILE_TENANTS"),
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests build ``Settings`` directly)."""
    return Settings()
