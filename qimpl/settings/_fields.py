"""What the settings models share: the validators, the example helper and the
configuration of every ``QIMPL_`` model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_settings import SettingsConfigDict

__all__ = ["EXIT_CONFIG", "PROVIDER_SHORTCUTS"]

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
