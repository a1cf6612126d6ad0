"""``ApiSettings``: the API process (``uvicorn --factory qimpl.api.app:create_app``), and the
rule for a chosen API key."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from qimpl.settings._fields import _example, _json_value
from qimpl.settings.base import Settings, _ProviderSettings

__all__ = ["MAX_TENANT_BYTES", "MIN_DISTINCT_CHARS", "MIN_STATIC_KEY_CHARS", "ApiSettings", "key_is_secret", "tenant_problem"]

#: Shortest key ``QIMPL_API_KEYS`` (and ``api_keys create --key``) accepts, and how many
#: different characters it must hold: keys are stored as plain SHA-256, so a chosen key
#: must carry its own entropy.
MIN_STATIC_KEY_CHARS = 24
MIN_DISTINCT_CHARS = 12

#: The longest tenant id a key may name, in UTF-8 bytes. A run's stream token carries its
#: tenant (base64), and the events route takes tokens of at most 400 characters: a key of a
#: 1,000-character tenant was created, and every stream token minted for its runs was
#: refused (422). 128 bytes, like an agent or workspace id's 128 characters, leave a token
#: of at most 267 characters.
MAX_TENANT_BYTES = 128


def tenant_problem(tenant: str) -> str | None:
    """Why ``tenant`` cannot name a new key's, grant's or assignment's tenant, or None."""
    try:
        encoded = tenant.encode()
    except UnicodeEncodeError:  # bytes that were not UTF-8, held as lone surrogates
        return "is not valid UTF-8"
    if len(encoded) > MAX_TENANT_BYTES:
        return f"is longer than {MAX_TENANT_BYTES} bytes (UTF-8)"
    if not tenant.isprintable():
        return "holds a control character"
    return None


def _origin_as_sent(origin: str) -> str | None:
    """``origin`` as a browser serialises it (the host in lower case), or None when no
    browser sends it (a user, a query, a fragment, whitespace, no host, a bad port)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if (not host or port == 0 or parts.username is not None or parts.password is not None or parts.query
            or parts.fragment or "?" in origin or "#" in origin or any(c.isspace() for c in origin)):
        return None
    if ":" in host:
        host = f"[{host}]"
    elif not host.isascii():
        try:  # a browser sends an international name as its ASCII (punycode) form
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    return f"{parts.scheme}://{host}{f':{port}' if port is not None else ''}"


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
            host, _, port = rest.rpartition(":")
            if (scheme, port) in (("https", "443"), ("http", "80")):
                # A browser sends the origin without its scheme's default port: this entry
                # would never match, and every preflight would be refused.
                raise ValueError(f"{origin!r}: browsers send this origin without its default port; "
                                 f"write {scheme}://{host}")
            if (sent := _origin_as_sent(origin)) != origin:
                # Matched exactly: an entry a browser never sends matches no request.
                raise ValueError(f"{origin!r} is not an origin as browsers send it"
                                 + (f"; write {sent}" if sent else
                                    " (scheme://host[:port]: no user, query, fragment or space, a port 1-65535)"))
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
            if problem := tenant_problem(who["tenant"]):
                raise ValueError(f"a key's tenant {problem}")
            if who.get("role", "client") not in ("client", "operator"):
                raise ValueError("role must be client or operator")
        return value
