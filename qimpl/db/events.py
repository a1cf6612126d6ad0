"""The event journal's retention (R-EVENT-5, R-OPS-3): prune expired event streams."""

from __future__ import annotations

from typing import Any

__all__ = ["PRUNE_LIMIT", "prune_event_streams"]

#: Most event streams one sweep of one tenant prunes (the database enforces it too).
PRUNE_LIMIT = 100


async def prune_event_streams(conn: Any, *, retention_s: float, reconciler: str,
                              limit: int = PRUNE_LIMIT) -> int:
    """Delete the events of at most ``min(limit, 100)`` runs of the connection's tenant
    (``qimpl.tenant``) that ended more than ``retention_s`` seconds ago, leaving a tombstone
    (``run_event_prunes``) per run; returns how many streams were pruned. Safe with several
    reconcilers at once (``FOR UPDATE SKIP LOCKED`` inside ``qimpl_prune_event_streams``).
    Raises ``psycopg.Error`` on a database error."""
    cur = await conn.execute("SELECT qimpl_prune_event_streams(%s, %s, %s)",
                             (float(retention_s), reconciler, min(limit, PRUNE_LIMIT)))
    row = await cur.fetchone()
    return int(row[0]) if row else 0
