"""Operator actions on credentials: API keys (stored hashed) and workspace grants.
Run with the schema owner's connection (``python -m qimpl.scripts.api_keys``).

Row-level security is FORCEd, so it binds the owner too (R-AUTH-4): a write to a tenant
table sets ``qimpl.tenant`` for its own transaction first."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

__all__ = ["create_api_key", "grant_workspace", "harden_database", "key_hash", "revoke_api_key",
           "revoke_workspace"]

Conn = psycopg.Connection[Any]


def key_hash(key: str) -> str:
    """How an API key is stored: SHA-256, hex. The key itself is never stored."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(conn: Conn, *, key: str, tenant_id: str, principal_id: str,
                   role: str = "client") -> None:
    """Store ``key`` hashed for a principal; ``role="operator"`` makes it an operator key
    (the journal's reconciliation routes, R-OPS-7). The same key for the same principal
    again changes nothing; ValueError for another role, an empty tenant or principal, or a
    key that already belongs to someone else."""
    if role not in ("client", "operator"):
        raise ValueError(f"role must be client or operator, got {role!r}")
    if not tenant_id.strip() or not principal_id.strip():
        raise ValueError("tenant and principal must not be empty")
    digest = key_hash(key)
    inserted = conn.execute(
        "INSERT INTO api_keys (key_hash, tenant_id, principal_id, role) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (key_hash) DO NOTHING RETURNING key_hash",
        (digest, tenant_id, principal_id, role)).fetchone()
    if inserted is None:
        held = conn.execute("SELECT tenant_id, principal_id, role FROM api_keys WHERE key_hash = %s",
                            (digest,)).fetchone()
        if held is not None and tuple(held) != (tenant_id, principal_id, role):
            raise ValueError("this key already exists for another principal, tenant or role")


def revoke_api_key(conn: Conn, *, key: str) -> int:
    """Revoke an API key (its principal keeps its runs and its other keys); returns how
    many live keys it revoked (0 or 1). From the next request the key is 401
    ``unauthenticated`` on every route (R-AUTH-1): keys are looked up per request, never
    cached."""
    cur = conn.execute("UPDATE api_keys SET revoked_at = clock_timestamp()"
                       " WHERE key_hash = %s AND revoked_at IS NULL", (key_hash(key),))
    return cur.rowcount


def grant_workspace(conn: Conn, *, tenant_id: str, principal_id: str, workspace_id: str,
                    grant_token: str) -> None:
    """Give a principal access to a workspace with an authorisation grant (R-AUTH-2)."""
    with conn.transaction():
        _as_tenant(conn, tenant_id)
        conn.execute(
            "INSERT INTO workspace_grants (tenant_id, principal_id, workspace_id, grant_token)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (tenant_id, principal_id, workspace_id)"
            " DO UPDATE SET grant_token = EXCLUDED.grant_token, revoked_at = NULL",
            (tenant_id, principal_id, workspace_id, grant_token))


def revoke_workspace(conn: Conn, *, tenant_id: str, principal_id: str, workspace_id: str) -> int:
    """Revoke a principal's workspace grant; returns how many grants were live (0 or 1).
    A resume is then refused 403 ``workspace_access_revoked`` (R-AUTH-2)."""
    with conn.transaction():
        _as_tenant(conn, tenant_id)
        cur = conn.execute(
            "UPDATE workspace_grants SET revoked_at = clock_timestamp() WHERE tenant_id = %s"
            " AND principal_id = %s AND workspace_id = %s AND revoked_at IS NULL",
            (tenant_id, principal_id, workspace_id))
        return cur.rowcount


def harden_database(conn: Conn) -> None:
    """Revoke TEMPORARY on ``conn``'s database from PUBLIC, as the migration does: no
    application role can create a temporary relation to shadow a real one (R-AUTH-4).
    Database privileges are not copied from a template: apply this to every database
    created from a migrated template. Needs the database's owner or a superuser."""
    conn.execute("DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC',"
                 " current_database()); END $$")


def _as_tenant(conn: Conn, tenant_id: str) -> None:
    conn.execute("SELECT set_config('qimpl.tenant', %s, true)", (tenant_id,))
