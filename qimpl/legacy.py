"""The legacy inline path (R-CREATE-6, R-READ-4): lifecycle version 1, no restart promise.

A legacy run is executed in the process that accepted it (the API, or a version-1
workflow's activity) with no lease, no checkpoints and no fencing token: a crash leaves
it where it was. Its writes still pass the transition guard.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from qimpl.db.runs import workspace_grant
from qimpl.lifecycle import TERMINAL, RunState
from qimpl.provider import Provider, StepContext

__all__ = ["MAX_STEPS", "answer_inline", "run_inline"]

log = logging.getLogger("qimpl.legacy")

#: A legacy loop never runs longer than this many steps.
MAX_STEPS = 100


async def answer_inline(provider: Provider, *, prompt: str, run_id: str, tenant_id: str,
                        workspace_id: str = "default", grant_token: str | None = None) -> dict[str, Any]:
    """Run the provider to an answer in this process; returns ``{answer, steps, usage}``.
    ``grant_token`` reaches the provider only (R-READ-3)."""
    state: dict[str, Any] = {}
    usage: dict[str, int] = {}
    for step in range(1, MAX_STEPS + 1):
        result = await provider.step(StepContext(run_id=run_id, tenant_id=tenant_id, generation=1,
                                                 attempt=1, step=step, prompt=prompt, state=state,
                                                 workspace_id=workspace_id, grant_token=grant_token))
        state = dict(result.state)
        for k, v in result.usage.items():
            usage[k] = usage.get(k, 0) + int(v)
        if result.answer is not None:
            return {"answer": result.answer, "steps": step, "usage": usage}
    raise RuntimeError("no answer within the step limit")


async def _move(conn: psycopg.AsyncConnection[Any], run_id: str, new: RunState, **cols: Any) -> bool:
    sets = "".join(f", {k} = %({k})s" for k in cols)
    cur = await conn.execute(
        f"UPDATE runs SET state = %(new)s, row_version = row_version + 1{sets}"
        " WHERE run_id = %(run_id)s AND state NOT IN ('completed', 'failed', 'expired', 'cancelled')",
        {"new": str(new), "run_id": run_id, **cols},
    )
    return cur.rowcount == 1


async def run_inline(conn: psycopg.AsyncConnection[Any], provider: Provider, run_id: str) -> str:
    """Execute a legacy run to its end on ``conn`` (autocommit); returns its final state.
    Never raises for a provider failure: the run ends ``failed`` with a safe code."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM runs WHERE run_id = %s", (run_id,))
        row = await cur.fetchone()
    if row is None or RunState(row["state"]) in TERMINAL:
        return row["state"] if row else "missing"
    if row["state"] == RunState.ACCEPTED:
        await _move(conn, run_id, RunState.QUEUED)
    # started_at as a durable run's claim stamps it (R-READ-1): a legacy run that ran read
    # ``started_at: null`` beside its ``completed_at``.
    if not await _move(conn, run_id, RunState.RUNNING, started_at=_now()):
        return "cancelled"
    try:
        grant = await workspace_grant(conn, tenant_id=row["tenant_id"], principal_id=row["principal_id"],
                                      workspace_id=row["workspace_id"])
        out = await answer_inline(provider, prompt=row["prompt"], run_id=run_id, tenant_id=row["tenant_id"],
                                  workspace_id=row["workspace_id"], grant_token=grant)
    except Exception as exc:  # noqa: BLE001 - the run records a safe code, the log the type
        log.warning("legacy run %s failed: %s", run_id, type(exc).__name__)
        await _move(conn, run_id, RunState.FAILED, error_code="agent_failed",
                    error_message="the agent failed", completed_at=_now())
        return RunState.FAILED
    try:
        done = await _move(conn, run_id, RunState.COMPLETED, result_json=Jsonb({"answer": out["answer"]}),
                           usage=Jsonb(out["usage"]), completed_at=_now())
    except psycopg.DataError as exc:
        # An answer the database cannot store (a NUL character): the run fails at once with
        # a safe code; the log names the error's type, never its detail (R-EXEC-6).
        log.warning("legacy run %s: answer not storable: %s", run_id, type(exc).__name__)
        await _move(conn, run_id, RunState.FAILED, error_code="agent_failed",
                    error_message="the agent's answer could not be stored", completed_at=_now())
        return RunState.FAILED
    return RunState.COMPLETED if done else "cancelled"


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
