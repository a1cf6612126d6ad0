"""The run record as the API answers it (R-READ-1): one definition for the read route and
for the stream's terminal event, which must equal it (R-EVENT-2)."""

from __future__ import annotations

from typing import Any

from qimpl.api.models import RunView
from qimpl.db import usage as usage_db
from qimpl.tool_journal import rules as journal
from qimpl.tool_journal import store as journal_db
from qimpl.usage import run_usage

__all__ = ["read_view", "run_view"]


def run_view(row: dict[str, Any], invocations: list[dict[str, Any]],
             observed: dict[str, Any] | None) -> RunView:
    """A run row, its tool journal and its observed usage as the read route's ``RunView``
    (pure)."""
    return RunView(
        run_id=str(row["run_id"]), agent_id=row["agent_id"], state=row["state"],
        durability=row["durability"], lifecycle_version=row["lifecycle_version"],
        row_version=row["row_version"], generation=row["generation"],
        deadline_at=row["deadline_at"], accepted_at=row["accepted_at"],
        started_at=row["started_at"], completed_at=row["completed_at"],
        result_json=row["result_json"], error_code=row["error_code"],
        error_message=row["error_message"], last_failure_code=row.get("last_failure_code"),
        usage=run_usage(row["usage"] or {}, observed, durable=int(row["lifecycle_version"]) >= 2),
        tool_invocations=journal.summary(invocations),
    )


async def read_view(conn: Any, row: dict[str, Any]) -> RunView:
    """``run_view`` of ``row`` with its journal and usage read on ``conn`` (a connection
    scoped to the run's tenant)."""
    run_id = str(row["run_id"])
    return run_view(row, await journal_db.invocations(conn, run_id), await usage_db.observed(conn, run_id))
