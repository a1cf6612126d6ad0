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

__all__ = ["Authenticator", "Principal", "StaticKeyAuthenticator"]


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    principal_id: str


class Authenticator(ABC):
    @abstractmethod
    async def authenticate(self, api_key: str) -> Principal | None:
        """The principal for ``api_key``, or None when it is unknown."""


class StaticKeyAuthenticator(Authenticator):
    def __init__(self, keys: Mapping[str, Mapping[str, str]]) -> None:
        # Keep only digests in memory; compare in constant time.
        self._keys = {
            hashlib.sha256(k.encode()).digest(): Principal(v["tenant"], v["principal"])
            for k, v in keys.items()
        }

    async def authenticate(self, api_key: str) -> Principal | None:
        digest = hashlib.sha256(api_key.encode()).digest()
        for known, principal in self._keys.items():
            if hmac.compare_digest(known, digest):
                return principal
        return None
