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

One module per model (``base``, ``api``, ``worker``, ``admin``, ``provider``), the shared
validators in ``_fields`` and the loading in ``loading``; import from ``qimpl.settings``.
"""

from qimpl.settings._fields import EXIT_CONFIG, PROVIDER_SHORTCUTS
from qimpl.settings.admin import AdminSettings
from qimpl.settings.api import (
    MAX_TENANT_BYTES,
    MIN_DISTINCT_CHARS,
    MIN_STATIC_KEY_CHARS,
    ApiSettings,
    key_is_secret,
    tenant_problem,
)
from qimpl.settings.base import Settings
from qimpl.settings.loading import (
    PROCESSES,
    ConfigError,
    config_error,
    env_name,
    exit_config,
    get_settings,
    load,
    load_or_exit,
    plugin_error,
    setting_names,
    settings_table,
    warn_no_watcher_margin,
)
from qimpl.settings.provider import OpenAIChatSettings
from qimpl.settings.worker import WorkerSettings

__all__ = [
    "EXIT_CONFIG",
    "MAX_TENANT_BYTES",
    "MIN_DISTINCT_CHARS",
    "MIN_STATIC_KEY_CHARS",
    "PROCESSES",
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
    "setting_names",
    "settings_table",
    "tenant_problem",
    "warn_no_watcher_margin",
]
