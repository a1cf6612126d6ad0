"""Start-up check of the database role a process connects as (R-AUTH-4)."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["warn_if_rls_bypassed"]


async def warn_if_rls_bypassed(conn: Any, who: str, log: logging.Logger) -> bool:
    """Log a warning and return True when ``conn``'s role is a superuser or BYPASSRLS:
    row-level security would not isolate tenants for this process."""
    cur = await conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
    row = await cur.fetchone()
    bypass = bool(row and row[0])
    if bypass:
        log.warning("the %s connects as a superuser or BYPASSRLS role: row-level security does not "
                    "apply; use a role in qimpl_app (docs/operations.md)", who)
    return bypass
