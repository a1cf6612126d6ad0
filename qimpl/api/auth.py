"""Authentication seam: request -> Principal (tenant, principal).

``StaticKeyAuthenticator`` maps API keys from settings (development); a database-backed
authenticator with hashed keys replaces it without touching the routes (R-AUTH-1).
"""

from __future__ import annotations

import hashlib
import hmac
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Authenticator", "DbKeyAuthenticator", "Principal", "StaticKeyAuthenticator"]


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    principal_id: str
    #: ``client`` (the run routes) or ``operator`` (the operator surfaces, R-OPS-7).
    role: str = "client"
    #: An operator's tenants: its own first, then those it is assigned to
    #: (``api_keys assign``); empty for a client.
    tenants: tuple[str, ...] = ()


class Authenticator(ABC):
    @abstractmethod
    async def authenticate(self, api_key: str) -> Principal | None:
        """The principal for ``api_key`` (any role), or None when it is unknown."""

    @abstractmethod
    async def authenticate_operator(self, api_key: str) -> Principal | None:
        """The principal for an *operator* key (R-OPS-7), or None for any other key."""


class DbKeyAuthenticator(Authenticator):
    """API keys stored hashed in PostgreSQL, looked up through the SECURITY DEFINER
    function ``qimpl_authenticate`` (the app role cannot read the key table)."""

    def __init__(self, connection: Any) -> None:
        #: ``() -> async context manager`` of a bounded pooled connection (``Services.connection``).
        self.connection = connection

    async def authenticate(self, api_key: str) -> Principal | None:
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        async with self.connection() as conn:
            cur = await conn.execute(
                "SELECT a.tenant_id, a.principal_id, EXISTS (SELECT 1 FROM qimpl_authenticate_operator(%s))"
                " FROM qimpl_authenticate(%s) a", (digest, digest))
            row = await cur.fetchone()
        return Principal(row[0], row[1], "operator" if row[2] else "client") if row else None

    async def authenticate_operator(self, api_key: str) -> Principal | None:
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        async with self.connection() as conn:
            cur = await conn.execute(
                "SELECT a.tenant_id, a.principal_id,"
                " ARRAY(SELECT t FROM qimpl_operator_tenants(%s) t)"
                " FROM qimpl_authenticate_operator(%s) a", (digest, digest))
            row = await cur.fetchone()
        return Principal(row[0], row[1], "operator", tuple(row[2]) or (row[0],)) if row else None


class StaticKeyAuthenticator(Authenticator):
    def __init__(self, keys: Mapping[str, Mapping[str, str]]) -> None:
        # Keep only digests in memory; compare in constant time.
        self._keys = {
            hashlib.sha256(k.encode()).digest(): (_static_principal(v), v.get("role", "client"))
            for k, v in keys.items()
        }

    async def authenticate(self, api_key: str) -> Principal | None:
        found = self._find(api_key)
        return found[0] if found else None

    async def authenticate_operator(self, api_key: str) -> Principal | None:
        found = self._find(api_key)
        return found[0] if found and found[1] == "operator" else None

    def _find(self, api_key: str) -> tuple[Principal, str] | None:
        digest = hashlib.sha256(api_key.encode()).digest()
        for known, found in self._keys.items():
            if hmac.compare_digest(known, digest):
                return found
        return None


def _static_principal(entry: Mapping[str, str]) -> Principal:
    """A static key's principal (an operator's only tenant is its own)."""
    role = entry.get("role", "client")
    return Principal(entry["tenant"], entry["principal"], role,
                     (entry["tenant"],) if role == "operator" else ())
