"""Read what the system and the fakes recorded into history events (I/O)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from qualify.history import Event

__all__ = ["database_events", "file_events"]


def database_events(dsn: str) -> list[Event]:
    """Every run (its deadline), transition (from the database's own audit trigger) and checkpoint."""
    out: list[Event] = []
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        for row in conn.execute(
            "SELECT id, run_id::text, row_version, old_state, new_state, generation, owner_attempt,"
            " checkpoint_step, extract(epoch FROM at)::float8 AS t FROM run_transitions ORDER BY id"
        ):
            out.append({"type": "transition", **row})
        for row in conn.execute(
            "SELECT run_id::text, tenant_id, state, generation, row_version, error_code,"
            " extract(epoch FROM accepted_at)::float8 AS t,"
            " extract(epoch FROM deadline_at)::float8 AS deadline_t FROM runs"
        ):
            out.append({"type": "run", **row})
        for row in conn.execute(
            "SELECT run_id::text, step, generation, attempt, row_version,"
            " extract(epoch FROM created_at)::float8 AS t FROM run_checkpoints ORDER BY row_version"
        ):
            out.append({"type": "checkpoint", **row})
    return out


def file_events(control_dir: Path) -> list[Event]:
    """Provider calls and struck crash points, as the processes recorded them."""
    out: list[Event] = []
    for name, type_ in (("provider_calls.jsonl", "provider_call"), ("crash_points.jsonl", "crash_point")):
        path = control_dir / name
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append({"type": type_, **json.loads(line)})
    return out
