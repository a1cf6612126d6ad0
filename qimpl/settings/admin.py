"""``AdminSettings``: the schema owner's connection (migrations, ``api_keys``)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qimpl.settings._fields import _check_dsn, _example

__all__ = ["AdminSettings"]


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
