"""Loading a process's settings model: one line naming the variable and an example for
a missing or malformed setting (exit code 64), and the generated settings table."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, NoReturn, TypeVar

from pydantic import AliasChoices, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsError

from qimpl.settings._fields import EXIT_CONFIG
from qimpl.settings.admin import AdminSettings
from qimpl.settings.api import ApiSettings
from qimpl.settings.base import Settings
from qimpl.settings.provider import OpenAIChatSettings
from qimpl.settings.worker import WorkerSettings

__all__ = [
    "PROCESSES",
    "ConfigError",
    "config_error",
    "env_name",
    "exit_config",
    "get_settings",
    "load",
    "load_or_exit",
    "plugin_error",
    "setting_names",
    "settings_table",
    "warn_no_watcher_margin",
]

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


#: The login role each process's example DSN names (``qimpl_app`` members, R-AUTH-4): the
#: one-shot sweep (``Settings``) connects as the workers do, the API as ``qimpl_api``.
_EXAMPLE_ROLE = {"WorkerSettings": "qimpl_worker", "Settings": "qimpl_worker"}


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


def setting_names() -> frozenset[str]:
    """Every environment variable a qimpl process reads (each name and alias of each
    field of ``PROCESSES``' models), for tools that pass settings on (``qualify up --set``)."""
    names: set[str] = set()
    for model in PROCESSES.values():
        for field, info in model.model_fields.items():
            names.add(env_name(model, field))
            if isinstance(info.validation_alias, AliasChoices):
                names.update(c for c in info.validation_alias.choices if isinstance(c, str))
    return frozenset(names)


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
            shown = info.json_schema_extra.get("shown_default") if isinstance(info.json_schema_extra, dict) else None
            if info.is_required():
                default = "— (required)"
            elif shown is not None:  # a default derived from another setting
                default = f"`{shown}`"
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


def warn_no_watcher_margin(settings: Settings, log: logging.Logger, poll_s: float = 0.1) -> None:
    """Log ``takeover.no_watcher_margin`` (a warning, at a process's start) when the lease
    leaves the takeover watcher, polling every ``poll_s`` seconds, no margin before
    Temporal's heartbeat timeout (``Settings.watcher_margin_s`` <= 0: the heartbeat timeout
    not above 1.25 x the lease + ``poll_s``, or the lease not above 4 x ``poll_s``,
    R-EXEC-13). Allowed: the fence is the same."""
    if settings.watcher_margin_s(poll_s) <= 0:
        log.warning("the lease (%s s) and heartbeat timeout (%s s) leave the takeover watcher "
                    "(polling every %s s) no margin: keep the timeout at least 1.5 x the lease and "
                    "the lease above 4 polls, or Temporal's timeout can end a paused owner's attempt "
                    "first, which costs its takeover one more retry timer (docs/operations.md, "
                    "Takeover)", settings.lease, settings.heartbeat_timeout_s, poll_s,
                    extra={"event": "takeover.no_watcher_margin", "lease_s": settings.lease,
                           "heartbeat_timeout_s": settings.heartbeat_timeout_s, "poll_s": poll_s})
