"""Reading a run's observed usage from its provider-call record (R-Q34-2)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = ["OBSERVED_SQL", "observed"]

#: One run's provider calls, tokens and wall times (seconds, the database's clock). A token
#: total is NULL (unknown) once a succeeded call did not report it, as in the usage events
#: (migration 20261207_100000_unknown_tokens).
OBSERVED_SQL = """
SELECT count(p.id) AS provider_calls,
       count(p.id) FILTER (WHERE p.status = 'started') AS provider_calls_no_outcome,
       CASE WHEN bool_or(p.status = 'succeeded' AND p.input_tokens IS NULL) THEN NULL
            ELSE coalesce(sum(p.input_tokens), 0) END AS input_tokens,
       CASE WHEN bool_or(p.status = 'succeeded' AND p.output_tokens IS NULL) THEN NULL
            ELSE coalesce(sum(p.output_tokens), 0) END AS output_tokens,
       extract(epoch FROM coalesce(r.completed_at, clock_timestamp()) - r.accepted_at)::float8
           AS wall_time_s,
       extract(epoch FROM coalesce(r.completed_at, clock_timestamp()) - r.started_at)::float8
           AS wall_s
FROM runs r LEFT JOIN provider_calls p ON p.run_id = r.run_id
WHERE r.run_id = %s
GROUP BY r.run_id
"""


async def observed(conn: psycopg.AsyncConnection[Any], run_id: str) -> dict[str, Any] | None:
    """``{provider_calls, provider_calls_no_outcome, input_tokens, output_tokens,
    wall_time_s, wall_s}`` of ``run_id`` (None when the run is not visible to ``conn``'s
    tenant). ``wall_s`` is None before the run started."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(OBSERVED_SQL, (run_id,))
        return await cur.fetchone()
