"""Stream tokens (R-EVENT-6): a short-lived credential for one run's event stream that a
browser can put in a URL, where ``EventSource`` cannot send the ``X-Stream-Key`` header.
Pure: minting, parsing and checking; the route reads the stream key and the clock.

A token is ``v1.<tenant, base64url>.<run_id>.<expires, epoch s>.<mac>`` where ``mac`` is
HMAC-SHA256, keyed with the run's stream key, over everything before it. So a token

- names one run (and its tenant, for row-level security) and is good for that run only;
- needs no secret beyond the stream key the run already has, and stops working when it
  expires (on the database's clock) — any API instance verifies it;
- reveals nothing of the stream key, and a leaked one is worth at most its lifetime.

Tokens sit in query strings, so the access log redacts them (``qimpl.logs``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from dataclasses import dataclass

__all__ = ["MAX_TTL_S", "ParsedToken", "mint", "parse", "valid"]

#: The longest a token may live, seconds.
MAX_TTL_S = 3600
_VERSION = "v1"


@dataclass(frozen=True)
class ParsedToken:
    tenant_id: str
    run_id: str
    expires: int
    signed: str
    mac: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _mac(stream_key: str, signed: str) -> str:
    return _b64(hmac.new(stream_key.encode(), signed.encode(), hashlib.sha256).digest())


def mint(*, stream_key: str, tenant_id: str, run_id: str, expires: int) -> str:
    """A token for ``run_id`` of ``tenant_id`` valid until ``expires`` (epoch s)."""
    signed = f"{_VERSION}.{_b64(tenant_id.encode())}.{uuid.UUID(run_id)}.{int(expires)}"
    return f"{signed}.{_mac(stream_key, signed)}"


def parse(token: str) -> ParsedToken:
    """The parts of a token; ValueError for anything that is not one (the route answers
    401 ``stream_token_invalid``). Nothing here is verified: the tenant is the caller's
    word until ``valid`` checked the MAC, so the route scopes its read by the run's own
    tenant, never by this one."""
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != _VERSION or len(token) > 400:
        raise ValueError("not a stream token")
    _, tenant_b64, run_id, expires, mac = parts
    try:
        tenant = base64.urlsafe_b64decode(tenant_b64 + "=" * (-len(tenant_b64) % 4)).decode()
        run = str(uuid.UUID(run_id))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("not a stream token") from exc
    if not expires.isdigit() or not tenant:
        raise ValueError("not a stream token")
    return ParsedToken(tenant, run, int(expires), ".".join(parts[:4]), mac)


def valid(token: ParsedToken, *, stream_key: str) -> bool:
    """Whether ``token`` was minted with ``stream_key`` (constant time); expiry is the
    caller's, against the database's clock."""
    return hmac.compare_digest(token.mac, _mac(stream_key, token.signed))
