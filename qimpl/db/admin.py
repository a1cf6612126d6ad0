"""Operator actions on credentials: API keys (stored hashed) and workspace grants.
Run with the schema owner's connection (``python -m qimpl.scripts.api_keys``).

Row-level security is FORCEd, so it binds the owner too (R-AUTH-4): a write to a tenant
table sets ``qimpl.tenant`` for its own transaction first."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

__all__ = ["KeyNotFound", "assign_tenant", "create_api_key", "disable_api_key", "grant_workspace",
           "harden_database", "key_audit", "key_hash", "key_id", "last_sweep_age_s", "list_api_keys",
           "revoke_api_key", "revoke_workspace", "rotate_api_key", "unassign_tenant"]

Conn = psycopg.Connection[Any]


def key_hash(key: str) -> str:
    """How an API key is stored: SHA-256, hex. The key itself is never stored."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(conn: Conn, *, key: str, tenant_id: str, principal_id: str,
                   role: str = "client", actor: str | None = None) -> None:
    """Store ``key`` hashed for a principal; ``role="operator"`` makes it an operator key
    (the journal's reconciliation routes, R-OPS-7). The same key for the same principal
    again changes nothing; ValueError for another role, an empty tenant or principal, or a
    key that already belongs to someone else. Audited (``created``) by ``actor``, else by
    the session's database user."""
    if role not in ("client", "operator"):
        raise ValueError(f"role must be client or operator, got {role!r}")
    if not tenant_id.strip() or not principal_id.strip():
        raise ValueError("tenant and principal must not be empty")
    digest = key_hash(key)
    with conn.transaction():
        if actor:
            _actor(conn, actor)
        inserted = conn.execute(
            "INSERT INTO api_keys (key_hash, tenant_id, principal_id, role) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (key_hash) DO NOTHING RETURNING key_hash",
            (digest, tenant_id, principal_id, role)).fetchone()
    if inserted is None:
        held = conn.execute("SELECT tenant_id, principal_id, role FROM api_keys WHERE key_hash = %s",
                            (digest,)).fetchone()
        if held is not None and tuple(held) != (tenant_id, principal_id, role):
            raise ValueError("this key already exists for another principal, tenant or role")


class KeyNotFound(LookupError):
    """No API key has that ``key_id``."""


def key_id(key: str) -> str:
    """A key's public name (``key_`` and the first 12 hex digits of its SHA-256), as the
    database generates it into ``api_keys.key_id``: safe to show, log and type."""
    return "key_" + key_hash(key)[:12]


def _actor(conn: Conn, actor: str) -> None:
    """Name the actor of this transaction's key writes in the audit (``qimpl.actor``)."""
    conn.execute("SELECT set_config('qimpl.actor', %s, true)", (actor,))


def list_api_keys(conn: Conn, *, tenant_id: str | None = None, principal_id: str | None = None,
                  include_disabled: bool = False) -> list[dict[str, Any]]:
    """Keys as ``{key_id, tenant_id, principal_id, role, created_at, expires_at,
    revoked_at, state, tenants}`` (``state``: ``live``, ``expiring`` (valid until
    ``expires_at``), ``expired`` or ``disabled``; ``tenants``: an operator key's assigned
    tenants besides its own), oldest first; ``tenant_id`` also finds the operator keys
    assigned to that tenant. Never the key nor its hash. Disabled and expired keys only
    with ``include_disabled``."""
    rows = conn.execute(
        "SELECT k.key_id, k.tenant_id, k.principal_id, k.role, k.created_at, k.expires_at, k.revoked_at,"
        " CASE WHEN k.revoked_at IS NOT NULL THEN 'disabled'"
        "      WHEN k.expires_at IS NULL THEN 'live'"
        "      WHEN k.expires_at > clock_timestamp() THEN 'expiring' ELSE 'expired' END AS state,"
        " coalesce((SELECT array_agg(o.tenant_id ORDER BY o.tenant_id) FROM operator_tenants o"
        "           WHERE o.key_hash = k.key_hash AND o.tenant_id <> k.tenant_id), '{}') AS tenants"
        " FROM api_keys k"
        " WHERE (%(t)s::text IS NULL OR k.tenant_id = %(t)s OR EXISTS (SELECT 1 FROM operator_tenants a"
        "        WHERE a.key_hash = k.key_hash AND a.tenant_id = %(t)s))"
        " AND (%(p)s::text IS NULL OR k.principal_id = %(p)s)"
        " ORDER BY k.created_at, k.key_id",
        {"t": tenant_id, "p": principal_id}).fetchall()
    names = ("key_id", "tenant_id", "principal_id", "role", "created_at", "expires_at", "revoked_at",
             "state", "tenants")
    out = [dict(zip(names, r, strict=True)) for r in rows]
    return out if include_disabled else [r for r in out if r["state"] in ("live", "expiring")]


def disable_api_key(conn: Conn, *, key_id: str, actor: str) -> bool:
    """Disable a key by its ``key_id`` (R-AUTH-1): from the next request it is 401
    ``unauthenticated`` on every route, and it can never be enabled again (the database
    refuses, QG016). Audited as ``disabled`` by ``actor``. True when it was live, False
    when it was already disabled; KeyNotFound for an unknown ``key_id``."""
    with conn.transaction():
        _actor(conn, actor)
        cur = conn.execute("UPDATE api_keys SET revoked_at = clock_timestamp()"
                           " WHERE key_id = %s AND revoked_at IS NULL", (key_id,))
        if cur.rowcount == 1:
            return True
        if conn.execute("SELECT 1 FROM api_keys WHERE key_id = %s", (key_id,)).fetchone() is None:
            raise KeyNotFound(key_id)
    return False


def rotate_api_key(conn: Conn, *, key_id: str, new_key: str, actor: str, grace_s: float = 0.0) -> str:
    """Replace a live key with ``new_key`` for the same tenant, principal, role and
    assigned tenants, in one transaction; the old key is disabled at once
    (``grace_s`` 0) or stays valid for ``grace_s`` seconds more (its ``expires_at``, on
    the database's clock), so clients can switch. Returns the new key's ``key_id``.
    KeyNotFound for an unknown ``key_id``; ValueError for a disabled or expired one, a
    negative grace or a ``new_key`` that already exists. Audited (``created``, then
    ``disabled`` or ``expiry_set``) by ``actor``."""
    if grace_s < 0:
        raise ValueError("grace must not be negative")
    with conn.transaction():
        _actor(conn, actor)
        old = conn.execute(
            "SELECT key_hash, tenant_id, principal_id, role,"
            " revoked_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp())"
            " FROM api_keys WHERE key_id = %s FOR UPDATE", (key_id,)).fetchone()
        if old is None:
            raise KeyNotFound(key_id)
        if not old[4]:
            raise ValueError(f"{key_id} is disabled or expired: create a new key instead")
        inserted = conn.execute(
            "INSERT INTO api_keys (key_hash, tenant_id, principal_id, role) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (key_hash) DO NOTHING RETURNING key_id",
            (key_hash(new_key), old[1], old[2], old[3])).fetchone()
        if inserted is None:
            raise ValueError("the new key already exists")
        conn.execute("INSERT INTO operator_tenants (key_hash, tenant_id)"
                     " SELECT %s, tenant_id FROM operator_tenants WHERE key_hash = %s",
                     (key_hash(new_key), old[0]))
        if grace_s == 0:
            conn.execute("UPDATE api_keys SET revoked_at = clock_timestamp() WHERE key_hash = %s", (old[0],))
        else:
            conn.execute("UPDATE api_keys SET expires_at = clock_timestamp() + make_interval(secs => %s)"
                         " WHERE key_hash = %s", (grace_s, old[0]))
        conn.execute(
            "INSERT INTO api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)"
            " VALUES (%s, %s, %s, 'rotated', qimpl_api_key_actor(),"
            " jsonb_build_object('replaced_by', %s::text, 'grace_s', %s::float8))",
            (key_id, old[1], old[2], str(inserted[0]), grace_s))
    return str(inserted[0])


def assign_tenant(conn: Conn, *, key_id: str, tenant_id: str, actor: str) -> bool:
    """Assign an operator key to one more tenant: its run listing (R-READ-5) and tool
    journal routes then reach that tenant's runs too. True when newly assigned. KeyNotFound
    for an unknown key; ValueError for a client key or an empty tenant. Audited."""
    if not tenant_id.strip():
        raise ValueError("tenant must not be empty")
    with conn.transaction():
        _actor(conn, actor)
        row = conn.execute("SELECT key_hash, role, tenant_id FROM api_keys WHERE key_id = %s",
                           (key_id,)).fetchone()
        if row is None:
            raise KeyNotFound(key_id)
        if row[1] != "operator":
            raise ValueError(f"{key_id} is a client key: only operator keys are assigned tenants")
        if row[2] == tenant_id:
            return False
        cur = conn.execute("INSERT INTO operator_tenants (key_hash, tenant_id) VALUES (%s, %s)"
                           " ON CONFLICT DO NOTHING", (row[0], tenant_id))
        return cur.rowcount == 1


def unassign_tenant(conn: Conn, *, key_id: str, tenant_id: str, actor: str) -> bool:
    """Take an assigned tenant from an operator key (never its own). True when it was
    assigned. KeyNotFound for an unknown key. Audited."""
    with conn.transaction():
        _actor(conn, actor)
        row = conn.execute("SELECT key_hash FROM api_keys WHERE key_id = %s", (key_id,)).fetchone()
        if row is None:
            raise KeyNotFound(key_id)
        cur = conn.execute("DELETE FROM operator_tenants WHERE key_hash = %s AND tenant_id = %s",
                           (row[0], tenant_id))
        return cur.rowcount == 1


def key_audit(conn: Conn, *, key_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The key audit, newest first: ``{at, key_id, tenant_id, principal_id, action, actor,
    detail}`` (``at`` on the database's clock)."""
    rows = conn.execute(
        "SELECT at, key_id, tenant_id, principal_id, action, actor, detail FROM api_key_audit"
        " WHERE %(k)s::text IS NULL OR key_id = %(k)s ORDER BY id DESC LIMIT %(n)s",
        {"k": key_id, "n": limit}).fetchall()
    names = ("at", "key_id", "tenant_id", "principal_id", "action", "actor", "detail")
    return [dict(zip(names, r, strict=True)) for r in rows]


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


def last_sweep_age_s(conn: Conn, tenant_id: str) -> float | None:
    """Seconds since a reconciler last finished a sweep of ``tenant_id``, by the
    database's clock; None when none is on record (within ``QIMPL_SWEEP_RETENTION_S``).
    A tenant no worker lists in ``DURABLE_AGENT_RECONCILE_TENANTS`` is never swept: its
    orphaned dispatches stay ``accepted`` and its overdue runs never expire (R-OPS-3)."""
    with conn.transaction():
        _as_tenant(conn, tenant_id)
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - max(finished_at))::float8"
            " FROM reconciler_sweeps WHERE tenant_id = %s", (tenant_id,)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def harden_database(conn: Conn) -> None:
    """Revoke TEMPORARY on ``conn``'s database from PUBLIC, as the migration does: no
    application role can create a temporary relation to shadow a real one (R-AUTH-4).
    Database privileges are not copied from a template: apply this to every database
    created from a migrated template. Needs the database's owner or a superuser."""
    conn.execute("DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC',"
                 " current_database()); END $$")


def _as_tenant(conn: Conn, tenant_id: str) -> None:
    conn.execute("SELECT set_config('qimpl.tenant', %s, true)", (tenant_id,))
