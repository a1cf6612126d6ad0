"""Operator actions on credentials: API keys (stored hashed) and workspace grants.
Run with the schema owner's connection (``python -m qimpl.scripts.api_keys``)."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

__all__ = ["create_api_key", "grant_workspace", "key_hash", "revoke_workspace"]

Conn = psycopg.Connection[Any]


def key_hash(key: str) -> str:
    """How an API key is stored: SHA-256, hex. The key itself is never stored."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(conn: Conn, *, key: str, tenant_id: str, principal_id: str,
                   role: str = "client") -> None:
    """Store ``key`` hashed for a principal; ``role="operator"`` makes it an operator key
    (the journal's reconciliation routes, R-OPS-7). ValueError for another role."""
    if role not in ("client", "operator"):
        raise ValueError(f"role must be client or operator, got {role!r}")
    conn.execute("INSERT INTO api_keys (key_hash, tenant_id, principal_id, role) VALUES (%s, %s, %s, %s)"
                 " ON CONFLICT (key_hash) DO NOTHING", (key_hash(key), tenant_id, principal_id, role))


def grant_workspace(conn: Conn, *, tenant_id: str, principal_id: str, workspace_id: str,
                    grant_token: str) -> None:
    """Give a principal access to a workspace with an authorisation grant (R-AUTH-2)."""
    conn.execute(
        "INSERT INTO workspace_grants (tenant_id, principal_id, workspace_id, grant_token)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, principal_id, workspace_id)"
        " DO UPDATE SET grant_token = EXCLUDED.grant_token, revoked_at = NULL",
        (tenant_id, principal_id, workspace_id, grant_token))


def revoke_workspace(conn: Conn, *, tenant_id: str, principal_id: str, workspace_id: str) -> int:
    cur = conn.execute(
        "UPDATE workspace_grants SET revoked_at = clock_timestamp() WHERE tenant_id = %s"
        " AND principal_id = %s AND workspace_id = %s AND revoked_at IS NULL",
        (tenant_id, principal_id, workspace_id))
    return cur.rowcount
